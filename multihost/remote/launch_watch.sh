# shellcheck shell=sh source-path=SCRIPTDIR
# Launch behind the gate, then watch on the same channel (one channel and round trip less per
# host): "ready PGID", then (after "go") the log from its first byte
# and the "end ..." line as watch.sh. It polls each second from the start
# (n=8 is past the back-off's steps): the job's end comes as a CHLD, not from the poll.
# Arguments: BASE RUN COMMAND ENV JOB KIT OFFSET (as launch.sh's).
b=$1
r=$2
command=$3
env=$4
job=$5
k=$6
o=$7
held=1
{
. ./_write_run.sh
. ./_gate.sh
n=8; s=1; d=10
. ./_poll.sh
}
