# shellcheck shell=sh source-path=SCRIPTDIR
# The host that has the packed environment putting it in a bucket (``--stage-via gs://``): a
# bucket's pack is always gzip (hosts nobody probed may take it). Says "uploaded".
# Arguments: BASE KEY URL (URL: the object, multihost.cloud.bucket.env_url).
b=$1
key=$2
url=$3
. ./_gs.sh
set -e
e="$b"/envs
test -s "$e/$key".tar.gz || { echo "no archive of $key here" >&2; exit 4; }
gs_cp "$e/$key".tar.gz "$url"
echo uploaded
