# shellcheck shell=sh source-path=SCRIPTDIR
# Watching: streams the log from byte OFFSET until the exit file appears, or until the job's
# process group has been gone for 3 s without one ("vanished"); then says on stderr
# "end EXIT STARTED ENDED STOPPED SIZE ESCAPED STARTUP STEPPED" (see _poll.sh).
# Arguments: RUN OFFSET.
r=$1
o=$2
. ./_tail.sh
n=0; s=0.2; d=2
. ./_poll.sh
