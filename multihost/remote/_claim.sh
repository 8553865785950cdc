# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Creates the run's directory, refusing a name already there (exit 3) or a symbolic link in
# its place: every host is claimed before any job starts. Needs: b (base dir), r (run dir).
umask 077
mkdir -p "$b" "${r%/*}" && chmod 700 "$b" || exit 1
if [ -L "$r" ]; then echo "$r is a symbolic link: refusing to use it" >&2; exit 3; fi
mkdir "$r" 2>/dev/null || { echo "run $r exists on this host: use a new --run-name" >&2; exit 3; }
