# shellcheck shell=sh source-path=SCRIPTDIR
# Launch: writes the run's state files, starts the wrapper detached, prints its process group.
# Arguments: BASE RUN COMMAND ENV JOB WRAPPER HOOK (the last five: the files' contents).
b=$1
r=$2
command=$3
env=$4
job=$5
wrapper=$6
hook=$7
. ./_write_run.sh
. ./_reaper.sh
setsid "$@" "$r"/run.sh </dev/null >/dev/null 2>&1 &
# the wrapper writes the same pid once sh runs; written here too, so that a status asked at
# once never finds the run without one while python3 starts
echo $! > "$r"/pid
echo $!
