# shellcheck shell=sh source-path=SCRIPTDIR
# The builder. Builds into a relocatable venv with uv (no interpreter downloads): from the
# lock, once it is checked against pyproject.toml (a lock out of date: uv's lines on stderr,
# exit 5); or exactly the requirements (uv pip sync: nothing resolved, nothing else installed),
# then uv pip check (a file that leaves out a dependency fails). Writes the manifest and the
# marker, moves it into place atomically, then packs it in FMT (_pack.sh). A failed build:
# uv's last lines on stderr, exit 4, nothing left.
# Arguments: BASE KEY FMT CODE EXE SEL REQ SHIP UVV UNWHEEL (CODE: the staged code dir; EXE: the
# Python; SEL: uv's selection flags, words without quotes: checked names only; REQ: 0, from the
# lock, or N: a requirements file of N bytes comes first on stdin; SHIP: 0, the host's uv; 1,
# uv follows on stdin; 2, fetch uv==UVV with the host's own pip, from the index its pip uses,
# and take the binary out of the wheel with UNWHEEL, uv_wheel.py's source; either goes to
# BASE/bin/uv).
b=$1
key=$2
fmt=$3
code=$4
exe=$5
sel=$6
req=$7
ship=$8
uvv=$9
unwheel=${10}
set -e
umask 022
e="$b"/envs
test -d "$e" || { mkdir -p "$e"; chmod 700 "$b"; }
t=$(mktemp -d "$e"/.build.XXXXXX)
trap 'rm -rf "$t"' EXIT
[ "$req" = 0 ] || head -c "$req" > "$t"/requirements.txt
if [ "$ship" = 1 ]; then
  mkdir -p "$b"/bin
  cat > "$t"/uv
  chmod 755 "$t"/uv
  mv -f "$t"/uv "$b"/bin/uv
elif [ "$ship" = 2 ]; then
  mkdir -p "$b"/bin "$t"/wheel
  python3 -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check     -d "$t"/wheel "uv==$uvv" > "$t"/log 2>&1 || {
    echo "no uv on this host, and its pip could not fetch uv==$uvv:" >&2
    tail -n 5 "$t"/log >&2; exit 4
  }
  python3 -c "$unwheel" "$t"/wheel "$t"/uv || exit 4
  chmod 755 "$t"/uv
  mv -f "$t"/uv "$b"/bin/uv
fi
. ./_find_uv.sh
[ -n "$uv" ] || { echo "no uv on this host" >&2; exit 4; }
export UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$b"/uv-cache UV_PROJECT_ENVIRONMENT="$t"/env
export UV_LINK_MODE=copy UV_NO_PROGRESS=1
unset VIRTUAL_ENV
"$uv" venv -q --relocatable --python "$exe" "$t"/env > "$t"/log 2>&1 || {
  tail -n 20 "$t"/log >&2; exit 4
}
cd "$code"
if [ "$req" != 0 ]; then
  { "$uv" pip sync -q --python "$t"/env/bin/python "$t"/requirements.txt     && "$uv" pip check -q --python "$t"/env/bin/python; } > "$t"/log 2>&1 || {
    tail -n 20 "$t"/log >&2; exit 4
  }
else
  # the lock must match pyproject.toml (the runner may have had no uv to check it with):
  # checked offline (a matching lock needs no resolution), then synced --locked
  "$uv" lock --check --offline --python "$exe" > "$t"/log 2>&1 || {
    tail -n 20 "$t"/log >&2; exit 5
  }
  set -f
  # shellcheck disable=SC2086 # the selection flags, split on purpose
  "$uv" sync -q --locked --no-install-project $sel > "$t"/log 2>&1 || {
    tail -n 20 "$t"/log >&2; exit 4
  }
  set +f
fi
cd "$t"/env
find . -mindepth 1 \( -type f -printf '%s %P\n' \) -o \( -type l -printf 'l %P\n' \) \
  > "$t"/manifest
mv "$t"/manifest .multihost-manifest
: > .multihost-complete
cd "$e"
rm -rf "${e:?}/${key:?}" "$e/$key".tar.gz "$e/$key".tar.gz.sha256 "$e/$key".tar.zst   "$e/$key".tar.zst.sha256
mv -T "$t"/env "$e/$key"
: > "$e/$key".used
. ./_pack.sh
