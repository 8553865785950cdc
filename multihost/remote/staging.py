"""The templates of ``--stage-via``: a seed that serves the archive, and hosts that fetch it.

Constant POSIX sh, values assigned by :func:`multihost.remote.script` like every other
template. ``stage`` is always the rendered STAGE script (``plan.stage_command``): it is what
unpacks, so a fetched archive lands exactly as a sent one does. The token travels on stdin only.
"""

from __future__ import annotations

import functools
from pathlib import Path

# The seed, through ``offer``. Vars: b, c, done, stage, serve (seed_serve.py), addr, lifetime
# (s), fetches, stale (minutes), name (the one URL path it serves). Says "present" if the code
# is unpacked already (nothing is sent, nothing served). Else says "absent" and reads the token
# line then the archive from stdin, unpacks it, and starts the server detached; then
# "serving PORT PID DIR", or "noserver WHY" when it could not serve (the code is staged on the
# seed either way).
# A seed's server started in $s (its archive in place): token file, the stdlib server bound to
# $addr serving only the path $name, "serving PORT PID DIR" once it listens, else "noserver
# WHY" and nothing left. Shared by the code's seed (SEED) and an environment's
# (multihost.remote.envsync.SERVE).
START_SERVER = """\
printf '%s\\n' "$token" > "$s"/token
setsid python3 -c "$serve" "$addr" "$s" "$lifetime" "$fetches" "$name" \\
  </dev/null >"$s".out 2>"$s".err &
p=$!
i=0
while [ ! -s "$s".out ] && [ ! -s "$s".err ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
said=; { read -r said < "$s".out; } 2>/dev/null || :
case $said in
  port\\ *) echo "serving ${said#port } $p $s" ;;
  *)
    kill "$p" 2>/dev/null || :
    why=${said#error }; [ -n "$why" ] || why=$(tail -n 1 "$s".err)
    echo "noserver ${why:-the server did not start}"
    rm -rf "$s"
    ;;
esac
rm -f "$s".out "$s".err
"""

SEED = (
    """\
set -e
test -e "$c/$done" && { echo present; exit 0; }
echo absent
umask 077
IFS= read -r token
test -d "$b"/seed || { mkdir -p "$b"/seed; chmod 700 "$b"; }
find "$b"/seed -mindepth 1 -maxdepth 1 -mmin +"$stale" -exec rm -rf {} + 2>/dev/null || :
s=$(mktemp -d "$b"/seed/XXXXXX)
cat > "$s"/archive
sh -c "$stage" < "$s"/archive > /dev/null
"""
    + START_SERVER
)

# Stopping a seed's server once its hosts are done. Vars: p (its pid), s (its dir). TERM,
# then KILL after about 2 s; the dir goes either way. Says "stopped" or "gone".
SEED_STOP = """\
if ! grep -qsF -- "$s" /proc/"$p"/cmdline; then rm -rf "$s"; echo gone; exit 0; fi
kill -TERM "$p" 2>/dev/null || :
i=0
while [ $i -lt 20 ] && grep -qsF -- "$s" /proc/"$p"/cmdline; do sleep 0.1; i=$((i + 1)); done
kill -KILL "$p" 2>/dev/null || :
rm -rf "$s"
echo stopped
"""

# Cloud Storage with the host's own gcloud: ``gs_cp SRC DST`` (either may be a gs:// URL), one
# ``gcloud storage cp``; on failure gcloud's last lines on stderr, status 1. Shared by every
# template that touches a bucket (the code's FETCH, an environment's INSTALL and UPLOAD).
GS = """\
gs_cp() {
  gs_out=$(gcloud storage cp "$1" "$2" < /dev/null 2>&1) || {
    printf '%s\\n' "$gs_out" | tail -n 2 >&2; return 1
  }
}
"""

# A host fetching the archive. Vars: b, c, done, stage, how ("peer": from a seed with
# seed_fetch.py, the token on stdin; "gs": gs_cp), url, digest (sha256), fetch
# (seed_fetch.py, which also checks the hash), timeout (s). Says "present" if the code is
# there; else fetches, refuses an archive whose sha256 is not the digest (exit 3, nothing
# unpacked), unpacks, says "fetched".
FETCH = (
    GS
    + """\
set -e
test -e "$c/$done" && { echo present; exit 0; }
umask 077
test -d "$b"/code || { mkdir -p "$b"/code; chmod 700 "$b"; }
t=$(mktemp -d "$b"/code/.incoming.XXXXXX)
trap 'rm -rf "$t"' EXIT
case $how in
  peer) python3 -c "$fetch" "$url" "$t"/archive "$digest" "$timeout" ;;
  gs) gs_cp "$url" "$t"/archive; python3 -c "$fetch" - "$t"/archive "$digest" 0 ;;
  *) echo "unknown source $how" >&2; exit 2 ;;
esac
sh -c "$stage" < "$t"/archive > /dev/null
echo fetched
"""
)

TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "seed": (
        SEED,
        ("b", "c", "done", "stage", "serve", "addr", "lifetime", "fetches", "stale", "name"),
    ),
    "seed-stop": (SEED_STOP, ("p", "s")),
    "fetch": (FETCH, ("b", "c", "done", "stage", "how", "url", "digest", "fetch", "timeout")),
}


@functools.cache
def python_source(name: str) -> str:
    """The text of a stdlib-only script run on hosts with ``python3 -c`` (seed_serve,
    seed_fetch)."""
    return (Path(__file__).parent / f"{name}.py").read_text()
