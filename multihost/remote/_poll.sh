# shellcheck shell=sh disable=SC2154,SC2034,SC2086
# (a fragment: its variables come from, and go to, the scripts that source it, which are
# sent with it in place and checked so; alone, its numbers ($s, $t, $d) are not known as such)
# Watching. Vars: r (run dir), o (byte offset). Streams the log from o until the exit file
# appears, or until the job's process group has been gone for 3 s without one ("vanished");
# then says on stderr "end EXIT STARTED ENDED STOPPED SIZE ESCAPED STARTUP STEPPED" (STEPPED: the
# job's processes that logged steps, the hook's <pid>.steps files: multihost plot). The exit file is looked
# for every 0.2 s at first, then every 0.5 s, then every second (each look forks a sleep: on
# a thousand hosts sharing cores, polling fast for long costs more than it gains). When this
# shell started the job's wrapper (launch_watch.sh), the wrapper's end cuts the sleep short: a
# trapped CHLD ends ``wait`` at once in dash (Debian's and Ubuntu's sh), so a short job's end
# is seen at once, and launch_watch.sh looks every second from the start (a fork a second, not
# five, on every host just as all the jobs start); other shells wait out the sleep.
# Needs: r, t (the tail's pid), n, s, d (the poll's step, sleep, tenths).
gone=0; pg=
trap : CHLD
while [ ! -e "$r"/exit ]; do
  sleep $s & z=$!
  # cut short (status > 128): the sleep still runs, and is ours to stop
  wait $z || kill $z 2>/dev/null
  kill -0 $t 2>/dev/null || exit 3
  # our parent (sshd's session, or the local runner) gone: nobody reads us any more
  [ ! -d /proc/$$ ] || [ -d /proc/$PPID ] || { kill $t 2>/dev/null; exit 4; }
  [ -n "$pg" ] || { read -r pg < "$r"/pid; } 2>/dev/null
  # gone: tenths of a second the group has been seen gone
  if [ -n "$pg" ] && ! kill -0 -"$pg" 2>/dev/null; then gone=$((gone + d)); else gone=0; fi
  [ $gone -lt 30 ] || [ -e "$r"/exit ] || break
  n=$((n + 1))
  case $n in 3) s=0.5 d=5 ;; 8) s=1 d=10 ;; esac
done
kill $t 2>/dev/null; wait $t 2>/dev/null
. ./_read_state.sh
[ -e "$r"/exit ] || exit=vanished
size=$(wc -c < "$r"/log)
stepped=0
for f in "$r"/hook/*.steps; do [ ! -e "$f" ] || stepped=$((stepped + 1)); done
echo "end $exit $started $ended $stopped $size $escaped $startup $stepped" >&2
exit 0
