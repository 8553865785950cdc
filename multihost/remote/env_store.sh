# shellcheck shell=sh source-path=SCRIPTDIR
# What a host holds under BASE/envs, and pruning the unused (env_store.py). One JSON object.
# Arguments: BASE MODE AGE GONE STORE PROBE (MODE: list, prune or dry; AGE in s; GONE: run names
# counted as removed, one a line; STORE: env_store.py's source; PROBE: env_probe.py's, for its
# state check).
b=$1
mode=$2
age=$3
gone=$4
store=$5
probe=$6
command -v python3 >/dev/null 2>&1 || { echo "no python3 on this host" >&2; exit 4; }
exec python3 -c "$store" "$probe" "$mode" "$b" "$age" "$gone"
