# shellcheck shell=sh
# Runs BODY (stale_body.sh's text) with GLOB LOCK KILL TICKS as its arguments: as root through
# sudo when this user is not root and has passwordless sudo, else as this user (exec: the same
# process, so the body skips this shell and its parent).
# Arguments: BODY GLOB LOCK KILL TICKS (see stale_body.sh).
body=$1
devglob=$2
lock=$3
kill=$4
ticks=$5
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  exec sudo -n sh -c "$body" stale "$devglob" "$lock" "$kill" "$ticks"
fi
exec sh -c "$body" stale "$devglob" "$lock" "$kill" "$ticks"
