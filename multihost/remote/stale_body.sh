# shellcheck shell=sh
# Stale accelerator holders (multihost.fleetops.stale parses what it prints, one fact a line).
# Holders are found by stat-ing /proc/*/fd/* (-ef: same device and inode; only character devices
# when every device is one), so lsof is not needed and no process is forked per descriptor. The
# script's own shell and its parent (sudo) are skipped. Run by stale.sh, as root when it can.
# Arguments: GLOB LOCK KILL TICKS (GLOB: the device files' patterns, split on spaces; LOCK: the
# libtpu lockfile; KILL: 1 stops the holders and removes the lockfile, 0 only reports; TICKS:
# tenths of a second a holder has between TERM and KILL).
devglob=$1
lock=$2
kill=$3
ticks=$4
me=$$ parent=$PPID
if [ "$(id -u)" = 0 ]; then echo "scope root"; else echo "scope user"; fi
set --
for d in $devglob; do
  if [ -e "$d" ]; then echo "device $d"; set -- "$@" "$d"; fi
done
holders='' seen='' chars=1
for d in "$@"; do [ -c "$d" ] || chars=0; done
if [ $# -gt 0 ]; then
  for f in /proc/[0-9]*/fd/*; do
    [ "$chars" = 0 ] || [ -c "$f" ] || continue
    p=${f#/proc/}; p=${p%%/*}
    [ "$p" = "$me" ] || [ "$p" = "$parent" ] && continue
    for d in "$@"; do
      [ "$f" -ef "$d" ] || continue
      case " $seen " in *" $p:$d "*) continue ;; esac
      seen="$seen $p:$d"
      { read -r comm < "/proc/$p/comm"; } 2>/dev/null || comm="?"
      echo "holder $p $d $comm"
      case " $holders " in *" $p "*) ;; *) holders="$holders $p" ;; esac
    done
  done
fi
[ -e "$lock" ] && echo "lockfile $lock"
[ "$kill" = 1 ] || exit 0
alive() {
  { read -r st < "/proc/$1/stat"; } 2>/dev/null || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}
nap() { sleep 0.1 2>/dev/null || { sleep 1; t=$((t + 9)); }; }
await() {
  t=0
  while [ "$t" -lt "$1" ]; do
    left=
    for p in $holders; do alive "$p" && left=1; done
    [ -z "$left" ] && return 0
    nap; t=$((t + 1))
  done
}
if [ -n "$holders" ]; then
  for p in $holders; do kill -s TERM "$p" 2>/dev/null; done
  await "$ticks"
  hard=
  for p in $holders; do
    if alive "$p"; then kill -s KILL "$p" 2>/dev/null; hard="$hard $p"
    else echo "killed $p TERM"; fi
  done
  holders=$hard
  await 30
  for p in $hard; do
    if alive "$p"; then echo "survived $p"; else echo "killed $p KILL"; fi
  done
fi
if [ -e "$lock" ]; then rm -f "$lock" && echo "removed $lock"; fi
exit 0
