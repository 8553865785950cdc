# shellcheck shell=sh
# multihost trace: asks every JAX process of a run on this host to trace the same seconds. Writes
# the run's hook/trace.request (capture name, common start time, seconds), which the hook's
# watcher thread in each process that imported jax picks up, then waits, bounded by DEADLINE,
# until each says it is done or failed (or is gone). Prints one line per process: "done PID
# ...", "error PID ...", "gone PID", "late PID ...", "nojax PID READY" (no tracer there), then
# "end"; or one word: "nohook" (the run has no hook dir), "finished" (its job has ended),
# "none" (no process of the run imported jax).
# Arguments: RUN (the run's dir; a leading ~ is expanded here) CAPTURE START_AT SECONDS
# DEADLINE (epoch seconds after which a process not done is late).
r=$1
capture=$2
start_at=$3
seconds=$4
deadline=$5
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
d=$r/hook
test -d "$d" || { echo "nohook"; exit 0; }
if [ -e "$r/exit" ]; then echo "finished"; exit 0; fi
printf '{"capture": "%s", "start_at": %s, "seconds": %s}\n' "$capture" "$start_at" "$seconds" \
  > "$d/trace.request.$$" && mv -f "$d/trace.request.$$" "$d/trace.request"
mine() { tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | grep -qxF "MULTIHOST_STACK_DIR=$d"; }
pids=
for m in "$d"/*.trace-ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.trace-ready}
  mine "$p" && pids="$pids $p"
done
for m in "$d"/*.ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.ready}
  [ -e "$d/$p.trace-ready" ] && continue
  mine "$p" && printf 'nojax %s %s\n' "$p" "$(cat "$m" 2>/dev/null)"
done
[ -n "$pids" ] || { echo "none"; exit 0; }
left=$pids
while [ -n "$left" ]; do
  now=$(date +%s)
  rest=
  for p in $left; do
    # alive or not is read before the answers: a process that writes its answer as it exits
    # (the job ended during the capture) is gone only if it had none before it went
    alive=1
    [ -d "/proc/$p" ] || alive=0
    if [ -e "$d/$p.$capture.done" ]; then
      printf 'done %s %s\n' "$p" "$(cat "$d/$p.$capture.done")"
    elif [ -e "$d/$p.$capture.error" ]; then
      printf 'error %s %s\n' "$p" "$(head -c 500 "$d/$p.$capture.error")"
    elif [ "$alive" = 0 ]; then
      printf 'gone %s\n' "$p"
    elif [ "$now" -ge "$deadline" ]; then
      if [ -e "$d/$p.$capture.started" ]; then
        printf 'late %s started but did not finish\n' "$p"
      else
        printf 'late %s never started (busy in native code without releasing the GIL?)\n' "$p"
      fi
    else
      rest="$rest $p"
    fi
  done
  left=$rest
  [ -z "$left" ] || sleep 0.2
done
echo "end"
