# shellcheck shell=sh source-path=SCRIPTDIR
# Staging: see _stage.sh.
# Arguments: BASE CODE DONE (the base dir, the code dir, the marker file's name).
b=$1
c=$2
done=$3
. ./_stage.sh
