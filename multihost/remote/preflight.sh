# shellcheck shell=sh
# A host's preflight check: prints ``key=value`` lines (Python and package versions, the
# coordinator port's state, from PROBE; ``python=-`` without a python3), then the free disk
# under BASE's nearest existing directory.
# Arguments: BASE PORT PACKAGES PROBE (PORT: 0 for none; PACKAGES: names, comma-separated;
# PROBE: the Python source, multihost.fleetops.preflight's).
d=$1
port=$2
packages=$3
probe=$4
python3 -c "$probe" "$port" "$packages" 2>/dev/null || echo python=-
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
df -Pk "$d" | awk 'NR==2 {printf "disk_free=%.1f GiB\n", $4/1048576}'
