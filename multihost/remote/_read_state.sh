# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Sets $exit $started $ended $stopped $escaped $startup from the run dir $r's files ("-" when
# missing; $exit is "empty" when the exit file exists but says nothing). An empty started file
# (the wrapper's builtin ``: >``, no fork on the way to the job) says when by its mtime.
# $startup: the start-up phases of the job's JAX process that got furthest, as the staged hook
# wrote them (hook/<pid>.startup: "N name=seconds,..."), builtins only. Needs: r.
started=-; { read -r started < "$r"/started; } 2>/dev/null
[ -n "$started" ] || started=$(date -r "$r"/started +%s.%N 2>/dev/null) || started=-
ended=-; { read -r ended < "$r"/ended; } 2>/dev/null
stopped=-; { read -r stopped < "$r"/stopped; } 2>/dev/null
escaped=-; { read -r escaped < "$r"/escaped; } 2>/dev/null
exit=-
if [ -e "$r"/exit ]; then read -r exit < "$r"/exit; [ -n "$exit" ] || exit=empty; fi
startup=-; most=0
for f in "$r"/hook/*.startup; do
  n=; l=; { read -r n l < "$f"; } 2>/dev/null || continue
  case $n in '' | *[!0-9]*) continue ;; esac
  case $l in '' | *[!0-9a-z_.=,]*) continue ;; esac
  [ "$n" -gt "$most" ] || continue
  most=$n; startup=$l
done
