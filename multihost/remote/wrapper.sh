# shellcheck shell=sh source-path=SCRIPTDIR
# The run's wrapper, written to run.sh and started detached as the leader of its own session.
# It records its pid (= process group), host timestamps and, atomically, the exit code. A trap
# (not an ignore, which children would inherit) keeps it alive through TERM so that it can
# still write the exit file. The job's processes carry MULTIHOST_RUN_DIR (so that escaped ones
# can be found) and the stack hook's dir; the wrapper itself does not, so it never stops itself.
# Started as ``run.sh gate`` (launch_watch.sh), it is up before the word and waits for "go" on
# stdin (anything else or the end: exit 5, nothing run): after the word, no fork stands
# between the host and its job's start but the job's own. Its start time is the mtime of an
# empty started file (a builtin ``: >``; _read_state.sh reads it).
# Arguments: [gate].
cd "${0%/*}" || exit 1
r=$PWD
echo $$ > pid
reaper=${MULTIHOST_SUBREAPER:-}
unset MULTIHOST_SUBREAPER
if [ "${1:-}" = gate ]; then
  go=; n=0; read -r go n || :
  case $n in '' | *[!0-9]*) n=0 ;; esac
  # run --secret: "go N", then N lines KEY=VALUE, exported for the job alone (a pipe: no file)
  while [ "$n" -gt 0 ] && read -r l; do export "${l%%=*}=${l#*=}"; n=$((n - 1)); done
  l=
  exec </dev/null
  [ "$go" = go ] || exit 5
fi
: > started
trap ':' TERM INT HUP
MULTIHOST_RUN_DIR=$r MULTIHOST_STACK_DIR=$r/hook sh ./job.sh </dev/null >>log 2>&1
rc=$?
trap '' TERM
kill -TERM -$$ 2>/dev/null
. ./_processes.sh

if [ -n "$reaper" ]; then stop_own $$; else out=$(stop_run "$r" $$); fi
[ "$out" = 0 ] || echo "$out" > escaped
date +%s.%N > ended
echo $rc > exit.tmp && mv -f exit.tmp exit
