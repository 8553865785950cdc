# shellcheck shell=sh source-path=SCRIPTDIR
# Status. One line "exit started ended stopped pid alive size mtime escaped startup", then the
# log's last line (mtime: when the log last grew, host clock).
# Arguments: RUN.
r=$1
test -d "$r" || { echo missing; exit 0; }
. ./_read_state.sh
pg=-; { read -r pg < "$r"/pid; } 2>/dev/null
alive=no
[ "$pg" = - ] || ! kill -0 -"$pg" 2>/dev/null || alive=yes
mt=$(date -r "$r"/log +%s 2>/dev/null) || mt=-
size=$(wc -c < "$r"/log)
echo "$exit $started $ended $stopped $pg $alive $size $mt $escaped $startup"
tail -n 1 "$r"/log
