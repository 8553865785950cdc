# shellcheck shell=sh source-path=SCRIPTDIR
# The seed, through ``offer``. Says "present" if the code is unpacked already (nothing is
# sent, nothing served). Else says "absent" and reads the token line then the archive from
# stdin, unpacks it (STAGE: the rendered stage script, as plan.stage_command makes it), and
# starts the server detached; then "serving PORT PID DIR", or "noserver WHY" when it could
# not serve (the code is staged on the seed either way).
# Arguments: BASE CODE DONE STAGE SERVE ADDR LIFETIME FETCHES STALE NAME (SERVE: seed_serve.py's
# source; LIFETIME in s; STALE in minutes; NAME: the one URL path it serves).
b=$1
c=$2
done=$3
stage=$4
serve=$5
addr=$6
lifetime=$7
fetches=$8
stale=$9
name=${10}
set -e
test -e "$c/$done" && { echo present; exit 0; }
echo absent
umask 077
IFS= read -r token
test -d "$b"/seed || { mkdir -p "$b"/seed; chmod 700 "$b"; }
find "$b"/seed -mindepth 1 -maxdepth 1 -mmin +"$stale" -exec rm -rf {} + 2>/dev/null || :
s=$(mktemp -d "$b"/seed/XXXXXX)
cat > "$s"/archive
sh -c "$stage" < "$s"/archive > /dev/null
. ./_start_server.sh
