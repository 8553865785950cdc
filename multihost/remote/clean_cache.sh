# shellcheck shell=sh source-path=SCRIPTDIR
# The compile cache (multihost clean --compile-caches): says its size in KiB ("0": there is
# none), then removes it unless MODE is dry.
# Arguments: DIR MODE.
d=$1
mode=$2
[ -d "$d" ] || { echo 0; exit 0; }
k=$(du -sk "$d" 2>/dev/null | cut -f1)
echo "${k:-0}"
[ "$mode" = dry ] || rm -rf "$d"
