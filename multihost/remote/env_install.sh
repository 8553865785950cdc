# shellcheck shell=sh source-path=SCRIPTDIR
# A host taking the packed environment. Refuses a wrong sha256 (exit 3, nothing unpacked;
# "peer": seed_fetch hashes it as it comes, so it is hashed once), unpacks beside and moves
# into place atomically (a damaged one is replaced), keeps the archive and its sha256; says
# "installed".
# Arguments: BASE KEY FMT DIGEST HOW URL FETCH TIMEOUT (DIGEST: the sha256; HOW: "stdin" says
# "absent" and reads it on stdin; "peer" fetches URL from a seed with FETCH, seed_fetch.py's
# source, the token on stdin, waiting at most TIMEOUT s; "gs": URL is the object, taken with
# the host's gcloud; URL, FETCH and TIMEOUT unused otherwise).
b=$1
key=$2
fmt=$3
digest=$4
how=$5
url=$6
fetch=$7
timeout=$8
. ./_gs.sh
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
rm -rf "${e:?}/${key:?}" "$e/$key".tar.gz "$e/$key".tar.gz.sha256 "$e/$key".tar.zst   "$e/$key".tar.zst.sha256
mv -T "$t"/env "$e/$key"
echo "$digest" > "$e/$key.tar.$fmt".sha256
mv -f "$t"/archive "$e/$key.tar.$fmt"
: > "$e/$key".used
echo installed
