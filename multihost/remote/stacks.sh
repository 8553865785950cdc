# shellcheck shell=sh
# Taking the stacks of a run's processes: each live process whose stack hook is ready (its
# MULTIHOST_STACK_DIR is the run's hook dir) gets SIGUSR2 and dumps its threads' stacks to its
# own file; what each adds is printed after "== PID READY", and "-- native" stacks with
# py-spy when asked. Says "home HOME" first, "nohook" when the run has no hook dir.
# Arguments: RUN (the run's dir; a leading ~ is expanded here) NATIVE (1: py-spy too).
r=$1
native=$2
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
d=$r/hook
echo "home $HOME"
test -d "$d" || { echo "nohook"; exit 0; }
sent=
for m in "$d"/*.ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.ready}
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qxF "MULTIHOST_STACK_DIR=$d" || continue
  s=$(wc -c < "$d/$p.txt")
  kill -USR2 "$p" 2>/dev/null || continue
  sent="$sent $p:$s"
done
i=0; prev=
while [ -n "$sent" ] && [ $i -lt 50 ]; do
  sleep 0.1; i=$((i+1)); now=
  for e in $sent; do now="$now $(wc -c < "$d/${e%%:*}.txt")"; done
  if [ "$now" = "$prev" ] && [ $i -ge 3 ]; then break; fi
  prev=$now
done
for e in $sent; do
  p=${e%%:*}; s=${e#*:}
  printf '== %s %s\n' "$p" "$(cat "$d/$p.ready" 2>/dev/null)"
  tail -c +$((s + 1)) "$d/$p.txt"
  if [ "$native" = 1 ]; then
    if command -v py-spy >/dev/null 2>&1; then
      echo "-- native"; py-spy dump --native --pid "$p" 2>&1 || true
    else
      echo "-- native: py-spy is not installed on this host (pip install py-spy)"
    fi
  fi
done
echo "== end"
