# shellcheck shell=sh source-path=SCRIPTDIR
# Claiming the run's name: see _claim.sh.
# Arguments: BASE RUN (the base dir, the run's dir).
b=$1
r=$2
. ./_claim.sh
