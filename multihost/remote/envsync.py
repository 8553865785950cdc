"""The templates of the locked environment (``multihost.envsync``): probe, build, install.

Constant POSIX sh, values assigned by :func:`multihost.remote.script`. An environment lives in
``<base>/envs/<key>`` with a manifest (``SIZE PATH`` per file, ``l PATH`` per link) and a
completion marker written last; its packed archive stays beside it so that the host can hand it
on: ``<key>.tar.zst`` when every host of its transfer has zstd, else ``<key>.tar.gz`` (one or
the other: packing or taking one format removes the other). Each template that packs or unpacks
takes ``fmt`` (``zst`` or ``gz``: the suffix).
"""

from __future__ import annotations

from multihost.remote.staging import GS, START_SERVER

# Where a host's uv is: on PATH, or the one multihost shipped before. Vars: b. Sets $uv ("" if
# none), and defines on_path (a program on PATH, as env_probe.on_path finds it).
_FIND_UV = """\
on_path() {  # the first executable $1 on PATH in $found ("" if none): no subshell, no program
  found=
  set -f
  IFS=:
  for d in $PATH; do
    if [ -x "${d:-.}/$1" ] && [ ! -d "${d:-.}/$1" ]; then found=${d:-.}/$1; break; fi
  done
  unset IFS
  set +f
}
on_path uv
uv=$found
[ -n "$uv" ] || { [ -x "$b"/bin/uv ] && uv="$b"/bin/uv; } || :
"""

# Vars: b (base), r (the run's claimed dir: it records the key it uses), lock (the lock's
# hash), ruv (the uv version a host without one gets), probe (env_probe.py). One line of
# name=value words (see env_probe.py). ``-S``: the probe is stdlib only, so the host's
# site-packages and their .pth files are not read before every run.
#
# The warm path starts no Python (a Python start-up is most of a warm run's cost on a busy
# host): env_probe.py leaves ``ENVS/.probe-LOCK`` (its C library's path; the fingerprint of
# the runner's uv version, python3, uv and that C library: device, inode, size, mtime; its
# words); when python3, uv and the C library are the very files they were, the key is the
# same, and an environment whose manifest's files are all there with their sizes is used as
# env_probe.py would (one flock, one find for both, one awk: about 5 ms of CPU here, against
# 13 ms for env_probe.py): under the shared lock, the run records the key and the
# environment's last use is now (whether zstd is on PATH is asked again). Anything else
# (no cache, a changed file, an absent or damaged environment, no flock or GNU find):
# env_probe.py, which says why and repairs.
PROBE = (
    _FIND_UV
    + """\
on_path python3
py=$found
[ -n "$py" ] || { echo "no python3 on this host" >&2; exit 4; }
e="$b"/envs
f="$e"/.probe-"$lock"
if [ -r "$f" ] && command -v flock >/dev/null 2>&1 \\
  && { IFS= read -r libc && IFS= read -r was && IFS= read -r words; } < "$f"
then
  key=${words#key=}
  key=${key%% *}
  umask 077
  if command exec 9>> "$e"/.lock && flock -s 9; then
    [ ! -d "$r" ] || echo "$key" > "$r"/envkey
    # one find: the fingerprint's files ("= " lines, as env_probe.fingerprint writes them),
    # then the environment's files and links as the manifest lists them
    if find -H "$py" ${uv:+"$uv"} "$libc" "$e/$key" \\( -path "$e/$key/*" \\( \\
        \\( -type f -printf '%s %P\\n' \\) -o \\( -type l -printf 'l %P\\n' \\) -o -true \\) \\) \\
        -o \\( ! -path "$e/$key" -printf '= %D.%i.%s.%Ts \\n' \\) 2>/dev/null \\
      | awk -v m="$e/$key"/.multihost-manifest -v was="$was" -v now="$ruv|" '
          BEGIN { while ((getline l < m) > 0) { want[l] = 1; n++ }; if (n == 0) exit 1 }
          /^= / { now = now substr($0, 3); next }
          $0 == "0 .multihost-complete" { done = 1 }
          $0 in want { delete want[$0]; n-- }
          END { exit !(done && n == 0 && now == was) }'
    then
      : > "$e/$key".used
      z=no  # now, not when it was cached; as env_probe.on_path asks (an ACL may deny it)
      on_path zstd
      [ -z "$found" ] || z=yes
      echo "${words% zstd=*} zstd=$z state=present"
      exit 0
    fi
    exec 9>&-
  fi
fi
exec python3 -S -c "$probe" "$e" "$lock" "$ruv" "$uv" "$r"
"""
)

# What a host holds under <base>/envs, and pruning the unused (env_store.py). Vars: b, mode
# (list, prune, dry), age (s), gone (run names counted as removed, one a line), store
# (env_store.py), probe (env_probe.py, for its state check). One JSON object.
STORE = """\
command -v python3 >/dev/null 2>&1 || { echo "no python3 on this host" >&2; exit 4; }
exec python3 -c "$store" "$probe" "$mode" "$b" "$age" "$gone"
"""

# Packing an environment that is complete here and its manifest, unless packed already in the
# format asked for (fmt: zst, zstd on every core; gz). The pack's sha256 is kept beside it
# (<key>.tar.FMT.sha256); a kept pack that no longer matches it (altered, corrupted) is never
# handed on: it is packed again, said as "repacked WHY". A kept pack of the other format goes
# (a host keeps one). Vars: e (envs dir), key, fmt. Says "packed SIZE SHA256".
_PACK = """\
k="$e/$key".tar.$fmt
o="$e/$key".tar.gz
[ "$fmt" = zst ] || o="$e/$key".tar.zst
h=
if [ -s "$k" ]; then
  h=$(sha256sum "$k"); h=${h%% *}
  if [ -s "$k".sha256 ] && [ "$h" != "$(cat "$k".sha256)" ]; then
    echo "repacked: its kept pack's sha256 is $h, not the $(cat "$k".sha256) it was packed with"
    rm -f "$k"; h=
  fi
fi
if [ -z "$h" ]; then
  if [ "$fmt" = zst ]; then
    tar -I 'zstd -q -T0 -3' -cf "$k".$$ -C "$e/$key" .
  else
    tar -czf "$k".$$ -C "$e/$key" .
  fi
  h=$(sha256sum "$k".$$); h=${h%% *}
  echo "$h" > "$k".sha256.$$
  mv -f "$k".sha256.$$ "$k".sha256
  mv -f "$k".$$ "$k"
fi
rm -f "$o" "$o".sha256
echo "packed $(wc -c < "$k") $h"
"""

# The builder. Vars: b, key, fmt, code (the staged code dir), exe (the Python), sel (uv's
# selection flags, words without quotes: checked names only), req (0: from the lock; N: a
# requirements file of N bytes comes first on stdin), ship (1: uv follows on stdin; 2: fetch
# uv==$uvv with the host's own pip, from the index its pip uses, and take the binary out of the
# wheel with unwheel (uv_wheel.py); either goes to <base>/bin/uv). Builds into a
# relocatable venv with uv (no interpreter downloads): from the lock, once it is checked
# against pyproject.toml (a lock out of date: uv's lines on stderr, exit 5); or exactly the
# requirements (uv pip sync: nothing resolved, nothing else installed), then uv pip check (a
# file that leaves out a dependency fails). Writes the manifest and the marker, moves it into
# place atomically, then packs it in fmt (_PACK). A failed build: uv's last lines on stderr,
# exit 4, nothing left.
BUILD = (
    """\
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
  python3 -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
    -d "$t"/wheel "uv==$uvv" > "$t"/log 2>&1 || {
    echo "no uv on this host, and its pip could not fetch uv==$uvv:" >&2
    tail -n 5 "$t"/log >&2; exit 4
  }
  python3 -c "$unwheel" "$t"/wheel "$t"/uv || exit 4
  chmod 755 "$t"/uv
  mv -f "$t"/uv "$b"/bin/uv
fi
"""
    + _FIND_UV
    + """\
[ -n "$uv" ] || { echo "no uv on this host" >&2; exit 4; }
export UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$b"/uv-cache UV_PROJECT_ENVIRONMENT="$t"/env
export UV_LINK_MODE=copy UV_NO_PROGRESS=1
unset VIRTUAL_ENV
"$uv" venv -q --relocatable --python "$exe" "$t"/env > "$t"/log 2>&1 || {
  tail -n 20 "$t"/log >&2; exit 4
}
cd "$code"
if [ "$req" != 0 ]; then
  { "$uv" pip sync -q --python "$t"/env/bin/python "$t"/requirements.txt \
    && "$uv" pip check -q --python "$t"/env/bin/python; } > "$t"/log 2>&1 || {
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
find . -mindepth 1 \\( -type f -printf '%s %P\\n' \\) -o \\( -type l -printf 'l %P\\n' \\) \\
  > "$t"/manifest
mv "$t"/manifest .multihost-manifest
: > .multihost-complete
cd "$e"
rm -rf "${e:?}/${key:?}" "$e/$key".tar.gz "$e/$key".tar.gz.sha256 "$e/$key".tar.zst \
  "$e/$key".tar.zst.sha256
mv -T "$t"/env "$e/$key"
: > "$e/$key".used
"""
    + _PACK
)

# uv.lock checked against pyproject.toml on a host with uv, when the runner has none and no
# host builds (a warm run: its key is the lock's, so a changed pyproject.toml alone does not
# change it). Vars: b, code (the staged code dir), exe (the Python). Exit 5 with uv's lines on
# stderr when the lock is out of date; 4 when it cannot check.
LOCK_CHECK = (
    _FIND_UV
    + """\
[ -n "$uv" ] || { echo "no uv on this host" >&2; exit 4; }
export UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$b"/uv-cache UV_NO_PROGRESS=1
unset VIRTUAL_ENV
cd "$code" || exit 4
said=$("$uv" lock --check --offline --python "$exe" 2>&1) || {
  printf '%s\\n' "$said" | tail -n 20 >&2; exit 5
}
"""
)

# A host that has the environment complete, handing it on. Vars: b, key, fmt. Says
# "packed ...".
PACK = (
    """\
set -e
e="$b"/envs
test -e "$e/$key"/.multihost-complete || { echo "environment $key is not here" >&2; exit 4; }
"""
    + _PACK
)

# A host taking the packed environment. Vars: b, key, fmt, digest (sha256), how ("stdin": says
# "absent" and reads it on stdin; "peer": fetches url from a seed with fetch (seed_fetch.py),
# the token on stdin, waiting at most timeout s; "gs": the object url, with the host's
# gcloud). Refuses a wrong sha256 (exit 3, nothing unpacked; "peer": seed_fetch hashes it as
# it comes, so it is hashed once), unpacks beside and moves into place atomically (a damaged
# one is replaced), keeps the archive and its sha256; says "installed".
INSTALL = (
    GS
    + """\
set -e
[ "$how" != stdin ] || echo absent
umask 022
e="$b"/envs
test -d "$e" || { mkdir -p "$e"; chmod 700 "$b"; }
t=$(mktemp -d "$e"/.incoming.XXXXXX)
trap 'rm -rf "$t"' EXIT
case $how in
  peer) python3 -c "$fetch" "$url" "$t"/archive "$digest" "$timeout" ;;
  gs) gs_cp "$url" "$t"/archive ;;
  *) cat > "$t"/archive ;;
esac
if [ "$how" != peer ]; then  # seed_fetch hashed it as it came (a mismatch: exit 3)
  h=$(sha256sum "$t"/archive); h=${h%% *}
  [ "$h" = "$digest" ] || { echo "sha256 mismatch: got $h, want $digest" >&2; exit 3; }
fi
mkdir "$t"/env
if [ "$fmt" = zst ]; then
  tar -I zstd -xf "$t"/archive -C "$t"/env
else
  tar -xzf "$t"/archive -C "$t"/env
fi
test -e "$t"/env/.multihost-complete || { echo "archive without a completion marker" >&2; exit 3; }
rm -rf "${e:?}/${key:?}" "$e/$key".tar.gz "$e/$key".tar.gz.sha256 "$e/$key".tar.zst \
  "$e/$key".tar.zst.sha256
mv -T "$t"/env "$e/$key"
echo "$digest" > "$e/$key".tar.$fmt.sha256
mv -f "$t"/archive "$e/$key".tar.$fmt
: > "$e/$key".used
echo installed
"""
)

# The host that has the packed environment putting it in a bucket (``--stage-via gs://``): a
# bucket's pack is always gzip (hosts nobody probed may take it). Vars: b, key, url (the
# object: multihost.cloud.bucket.env_url). Says "uploaded".
UPLOAD = (
    GS
    + """\
set -e
e="$b"/envs
test -s "$e/$key".tar.gz || { echo "no archive of $key here" >&2; exit 4; }
gs_cp "$e/$key".tar.gz "$url"
echo uploaded
"""
)

# ``--setup CMD``. Vars: b, c (the staged code dir), key (of the command
# and the code), cmd. Says "skipped" when this key succeeded here before; else "ran", then
# CMD's output (stdout and stderr together) with the locked environment's bin first on PATH
# when there is one (MULTIHOST_ENV), in the code dir; success is recorded under the key, a
# failure is CMD's exit status.
SETUP = """\
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
"""

# A host that has the packed environment serving it to its peers for a bounded time (the
# server of ``--stage-via peer``, seed_serve.py). Vars: b, key, fmt (its pack's), serve, addr,
# lifetime (s), fetches, name (the one URL path it serves). Reads the token line on stdin; says
# "serving PORT PID DIR" or "noserver WHY".
SERVE = (
    """\
umask 077
IFS= read -r token
e="$b"/envs
k="$e/$key".tar.$fmt
test -s "$k" || { echo "noserver no archive of $key here"; exit 0; }
mkdir -p "$b"/seed
s=$(mktemp -d "$b"/seed/XXXXXX) || { echo "noserver no seed dir"; exit 0; }
ln "$k" "$s"/archive 2>/dev/null || cp "$k" "$s"/archive
"""
    + START_SERVER
)

TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "env-probe": (PROBE, ("b", "r", "lock", "ruv", "probe")),
    "env-store": (STORE, ("b", "mode", "age", "gone", "store", "probe")),
    "env-build": (
        BUILD,
        ("b", "key", "fmt", "code", "exe", "sel", "req", "ship", "uvv", "unwheel"),
    ),
    "env-pack": (PACK, ("b", "key", "fmt")),
    "env-lock-check": (LOCK_CHECK, ("b", "code", "exe")),
    "env-install": (INSTALL, ("b", "key", "fmt", "digest", "how", "url", "fetch", "timeout")),
    "env-upload": (UPLOAD, ("b", "key", "url")),
    "env-serve": (SERVE, ("b", "key", "fmt", "serve", "addr", "lifetime", "fetches", "name")),
    "setup": (SETUP, ("b", "c", "key", "cmd")),
}
