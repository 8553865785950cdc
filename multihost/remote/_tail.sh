# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# The log from byte o to stdout as it grows, while this shell lives (t: the tail's pid).
# Needs: r, o.
tail -c +$((o + 1)) -f -s 0.2 --pid=$$ "$r"/log 2>/dev/null & t=$!
