# shellcheck shell=sh source-path=SCRIPTDIR
# A host that has the environment complete, handing it on. Says "packed ..." (_pack.sh).
# Arguments: BASE KEY FMT (FMT: zst or gz, the pack's suffix).
b=$1
key=$2
fmt=$3
set -e
e="$b"/envs
test -e "$e/$key"/.multihost-complete || { echo "environment $key is not here" >&2; exit 4; }
. ./_pack.sh
