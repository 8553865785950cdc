# shellcheck shell=sh source-path=SCRIPTDIR
# Undoing a claim when another host refused (or a later step failed). The directory holds at
# most the environment key it claimed (envkey).
# Arguments: RUN.
r=$1
rm -f "$r"/envkey
rmdir "$r" 2>/dev/null
exit 0
