# shellcheck shell=sh source-path=SCRIPTDIR
# ``--setup CMD``. Says "skipped" when this KEY succeeded here before; else "ran", then CMD's
# output (stdout and stderr together) with the locked environment's bin first on PATH when
# there is one (MULTIHOST_ENV), in the code dir; success is recorded under the key, a failure
# is CMD's exit status.
# Arguments: BASE CODE KEY CMD (KEY: of the command and the code).
b=$1
c=$2
key=$3
cmd=$4
test -e "$b/setup/$key".ok && { echo skipped; exit 0; }
echo ran
mkdir -p "$b"/setup
cd "$c" || exit 126
if [ -n "${MULTIHOST_ENV:-}" ]; then
  export VIRTUAL_ENV="$MULTIHOST_ENV"
  export PATH="$MULTIHOST_ENV/bin:$PATH"
fi
sh -c "$cmd" < /dev/null 2>&1 || exit $?
: > "$b/setup/$key".ok
