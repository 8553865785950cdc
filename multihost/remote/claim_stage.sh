# shellcheck shell=sh source-path=SCRIPTDIR
# A new run's first (and, before its launch, only) channel to a host: the claim, then the
# staging; one round trip less per host than the two apart.
# Arguments: BASE RUN CODE DONE.
b=$1
r=$2
c=$3
done=$4
. ./_claim.sh
. ./_stage.sh
