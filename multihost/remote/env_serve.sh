# shellcheck shell=sh source-path=SCRIPTDIR
# A host that has the packed environment serving it to its peers for a bounded time (the
# server of ``--stage-via peer``, seed_serve.py). Reads the token line on stdin; says
# "serving PORT PID DIR" or "noserver WHY".
# Arguments: BASE KEY FMT SERVE ADDR LIFETIME FETCHES NAME (FMT: its pack's; SERVE:
# seed_serve.py's source; LIFETIME in s; NAME: the one URL path it serves).
b=$1
key=$2
fmt=$3
serve=$4
addr=$5
lifetime=$6
fetches=$7
name=$8
umask 077
IFS= read -r token
e="$b"/envs
k="$e/$key".tar.$fmt
test -s "$k" || { echo "noserver no archive of $key here"; exit 0; }
mkdir -p "$b"/seed
s=$(mktemp -d "$b"/seed/XXXXXX) || { echo "noserver no seed dir"; exit 0; }
ln "$k" "$s"/archive 2>/dev/null || cp "$k" "$s"/archive
. ./_start_server.sh
