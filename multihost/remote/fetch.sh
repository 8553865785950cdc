# shellcheck shell=sh source-path=SCRIPTDIR
# A host fetching the archive. Says "present" if the code is there; else fetches, refuses an
# archive whose sha256 is not DIGEST (exit 3, nothing unpacked), unpacks, says "fetched".
# Arguments: BASE CODE DONE STAGE HOW URL DIGEST FETCH TIMEOUT (HOW "peer": from a seed with
# seed_fetch.py, the token on stdin; "gs": gs_cp; FETCH: seed_fetch.py's source, which also
# checks the hash; TIMEOUT in s).
b=$1
c=$2
done=$3
stage=$4
how=$5
url=$6
digest=$7
fetch=$8
timeout=$9
. ./_gs.sh
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
