# shellcheck shell=sh
# The first word of a run with a host: makes sure it holds this multihost's kit (the staged
# hook and the run's scripts, content-addressed like the code: KIT is BASE/kit/HASH16), checked
# by content every time (its SHA256SUMS, whose own sha256 is HASH, and every file against it).
# When it is absent, stale or altered: says "kit", reads a line with a length and that many
# bytes of tar.gz from stdin (nothing more can be there yet: the runner sends what follows only
# once this script says the next word), and unpacks them in its place. Then runs the kit's
# SCRIPT with the arguments after it.
# Arguments: KIT HASH SCRIPT ARGS... (the script's own arguments).
k=$1
kh=$2
s=$3
shift 3
ok() { [ "$(cd "$k" 2>/dev/null && sha256sum -c SHA256SUMS >/dev/null 2>&1 && sha256sum < SHA256SUMS)" = "$kh  -" ]; }
if ! ok; then
  echo kit
  n=; read -r n || :
  case $n in '' | *[!0-9]*) echo "the kit did not come (said: ${n:-nothing})" >&2; exit 1 ;; esac
  umask 077
  mkdir -p "${k%/*}" && t=$(mktemp -d "$k".XXXXXX) || exit 1
  head -c "$n" | tar -xzf - -C "$t" || {
    echo "the kit could not be unpacked in ${k%/*}" >&2
    df -Pk "$t" 2>/dev/null | awk 'NR==2 {print "free space there: " $4 " KiB"}' >&2
    rm -rf "$t"
    exit 1
  }
  # Another run may be doing the same at this moment: a kit that is right is never removed
  # (that run may be checking it or running from it), one that is there and still wrong is
  # moved aside before it goes, and ours goes in by one rename (which fails, harmlessly, when
  # another run's went in first).
  if ok; then rm -rf "$t"; else
    if [ -e "$k" ] && ! ok; then mv -T "$k" "$t.old" 2>/dev/null && rm -rf "$t.old"; fi
    mv -T "$t" "$k" 2>/dev/null || rm -rf "$t"
  fi
  ok || { sleep 1; ok; } ||
    { echo "the kit in $k does not match what was sent (is sha256sum missing?)" >&2; exit 1; }
fi
# shellcheck source=/dev/null
. "$k/$s"
