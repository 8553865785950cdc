# shellcheck shell=sh
# A warm process's channel (multihost.warm): the runner's frames from stdin into the process's
# inbox (the FIFO warm.in in the run's directory), its frames from its outbox (warm.out) to
# stdout, for as long as the runner holds the channel. Both FIFOs are opened read-write, which
# never blocks: a process that died before it opened its ends cannot leave this script waiting
# in an open. It first waits for them, up to TICKS tenths of a second: the run's exit file
# there first says the process ended (exit 3, "ended" on stderr); nothing in time: exit 4. The
# end of stdin (the runner closed the channel, or its connection is gone) closes the inbox:
# the warm process takes it as its runner gone, and leaves. The rest is one { } group: the
# shell reads all of it before it runs any, so that stdin then holds only the frames.
# Arguments: RUN TICKS.
r=$1
t=$2
{
i=0
until [ -p "$r"/warm.in ] && [ -p "$r"/warm.out ]; do
  [ ! -e "$r"/exit ] || { echo "ended before it was ready" >&2; exit 3; }
  [ "$i" -lt "$t" ] || { echo "no warm process after $((t / 10)) s" >&2; exit 4; }
  sleep 0.1
  i=$((i + 1))
done
exec 3<>"$r"/warm.in 4<>"$r"/warm.out
cat <&4 3>&- 4<&- &
c=$!
exec 4<&-
cat >&3
exec 3>&-
kill "$c" 2>/dev/null
wait "$c"
exit 0
}
