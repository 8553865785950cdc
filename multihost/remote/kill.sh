# shellcheck shell=sh source-path=SCRIPTDIR
# Stopping. Signals the run's process group, KILLs it after the grace (then records 128+9),
# stops what escaped the group. Says finished, nopid, vanished, stopped or killed, then how many escaped; "gone N" when
# the run directory is gone: the N processes found by their MULTIHOST_RUN_DIR were stopped.
# Arguments: RUN SIGNAL TICKS (a signal name; tenths of a second of grace).
r=$1
sig=$2
ticks=$3
. ./_processes.sh
umask 077
# the run's directory removed under a live job: its processes still carry the marker
test -d "$r" || { echo gone "$(stop_run "$r" -)"; exit 0; }
test -e "$r"/exit && { echo finished 0; exit 0; }
i=0; while [ ! -s "$r"/pid ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
pg=; { read -r pg < "$r"/pid; } 2>/dev/null
test -n "$pg" || { echo nopid 0; exit 0; }
if ! kill -0 -"$pg" 2>/dev/null; then
  sleep 1
  test -e "$r"/exit && { echo finished 0; exit 0; }
  echo vanished "$(stop_run "$r" "$pg")"
  exit 0
fi
echo "$sig" > "$r"/stopped
kill -"$sig" -"$pg" 2>/dev/null
i=0; while [ ! -e "$r"/exit ] && [ $i -lt "$ticks" ]; do sleep 0.1; i=$((i + 1)); done
if [ -e "$r"/exit ]; then
  esc=-; { read -r esc < "$r"/escaped; } 2>/dev/null; echo stopped "$esc"; exit 0
fi
echo KILL > "$r"/stopped
# the wrapper's descendants (its group and what it adopted), but not the wrapper: it then
# writes the exit file itself, as at any end
kids "$pg"
esc=0
for e in $all; do [ "${e#*:}" = "$pg" ] || esc=$((esc+1)); done
[ "$esc" = 0 ] || echo "$esc" > "$r"/escaped
for e in $all; do kill -KILL "${e%%:*}" 2>/dev/null; done
i=0; while [ -n "$all" ] && [ ! -e "$r"/exit ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -e "$r"/exit ]; then
  # the wrapper does not answer: the whole group, and the run's processes by their marker
  kill -KILL -"$pg" 2>/dev/null
  sleep 0.2
  more=$(stop_run "$r" "$pg")
  esc=$((esc + more))
  [ "$esc" = 0 ] || echo "$esc" > "$r"/escaped
  date +%s.%N > "$r"/ended; echo 137 > "$r"/exit.tmp; mv -f "$r"/exit.tmp "$r"/exit
fi
echo killed "$esc"
