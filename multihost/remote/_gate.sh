# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# The gate of a launch that watches: every host writes its run's files, starts its log's tail
# and its wrapper (``run.sh gate``, holding at its own gate: a pipe from this shell, a FIFO
# unlinked once open) and says "ready PGID" (the wrapper's process group); then waits for the
# runner's word on stdin (" python=PATH" after the group when the run's python is that python3:
# _write_run.sh). The runner
# sends "go" to every host at once when all are ready, and each host passes it on to its
# wrapper: the jobs start together, with no fork between the word and a job's start but the
# job's own. "stop" (one host could not be launched), or the channel's end (the runner gone),
# closes the pipe: the wrapper ends without running anything, the run's directory goes. This
# shell's own end closes the pipe too, and the tail follows this shell (--pid). The process
# group comes with "ready", so no log byte can come ahead of it, and nothing is written back
# between the word and the job's start (on shared cores, 256 hosts' replies held up their
# jobs). The script that holds a gate is one { } group: the shell reads all of it before it
# runs any, so stdin then holds only the word.
# Needs: r (and _write_run's run files).
mkfifo -m 600 "$r"/gate
set +e
. ./_tail.sh
# shellcheck disable=SC2094 # one FIFO, both ends on purpose: a pipe this shell holds
exec 3<>"$r"/gate 4<"$r"/gate
rm -f "$r"/gate
. ./_reaper.sh
setsid "$@" "$r"/run.sh gate <&4 >/dev/null 2>&1 3>&- 4<&- &
w=$!
exec 4<&-
trap - EXIT
echo "ready $w${py:+ python=$py}"
go=; n=0; read -r go n || :
if [ "$go" != go ]; then
  exec 3>&-
  wait $w
  kill $t 2>/dev/null; wait $t
  rm -rf "$r"
  exit 5
fi
case $n in '' | *[!0-9]*) n=0 ;; esac
# run --secret: N lines KEY=VALUE after the word, passed on to the wrapper in memory only
# (shell variables and the pipe; printf is a builtin: no command line shows them)
i=0; sec=
while [ "$i" -lt "$n" ] && read -r l; do sec="$sec$l
"; i=$((i + 1)); done
printf 'go %s
%s' "$i" "$sec" >&3
sec=; l=
exec 3>&-
