# shellcheck shell=sh source-path=SCRIPTDIR
# Stopping a seed's server once its hosts are done: TERM, then KILL after about 2 s; the dir
# goes either way. Says "stopped" or "gone".
# Arguments: PID DIR.
p=$1
s=$2
if ! grep -qsF -- "$s" /proc/"$p"/cmdline; then rm -rf "$s"; echo gone; exit 0; fi
kill -TERM "$p" 2>/dev/null || :
i=0
while [ $i -lt 20 ] && grep -qsF -- "$s" /proc/"$p"/cmdline; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$p" 2>/dev/null || :
rm -rf "$s"
echo stopped
