# shellcheck shell=sh source-path=SCRIPTDIR
# uv.lock checked against pyproject.toml on a host with uv, when the runner has none and no
# host builds (a warm run: its key is the lock's, so a changed pyproject.toml alone does not
# change it). Exit 5 with uv's lines on stderr when the lock is out of date; 4 when it cannot
# check.
# Arguments: BASE CODE EXE (CODE: the staged code dir; EXE: the Python).
b=$1
code=$2
exe=$3
. ./_find_uv.sh
[ -n "$uv" ] || { echo "no uv on this host" >&2; exit 4; }
export UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$b"/uv-cache UV_NO_PROGRESS=1
unset VIRTUAL_ENV
cd "$code" || exit 4
said=$("$uv" lock --check --offline --python "$exe" 2>&1) || {
  printf '%s\n' "$said" | tail -n 20 >&2; exit 5
}
