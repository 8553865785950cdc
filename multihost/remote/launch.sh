# shellcheck shell=sh source-path=SCRIPTDIR
# Launch: writes the run's state files, starts the wrapper detached, prints its process group
# (then python=PATH when the run's python is that python3: _write_run.sh).
# Arguments: BASE RUN COMMAND ENV JOB KIT (COMMAND ENV JOB: the files' contents; KIT: where
# the wrapper and the hook are, kit.sh).
b=$1
r=$2
command=$3
env=$4
job=$5
k=$6
. ./_write_run.sh
. ./_reaper.sh
setsid "$@" "$r"/run.sh </dev/null >/dev/null 2>&1 &
# the wrapper writes the same pid once sh runs; written here too, so that a status asked at
# once never finds the run without one while python3 starts
echo $! > "$r"/pid
echo $!
[ -z "$py" ] || echo "python=$py"
