# shellcheck shell=sh source-path=SCRIPTDIR
# Finishing. First line: exit code, start, end, stop signal, escaped, start-up phases ("-" when
# missing); then the log from byte OFFSET. "missing" when the run's directory is gone.
# Arguments: RUN OFFSET.
r=$1
o=$2
test -d "$r" || { echo missing; exit 0; }
. ./_read_state.sh
echo "$exit $started $ended $stopped $escaped $startup"
tail -c +$((o + 1)) "$r"/log
