# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Cloud Storage with the host's own gcloud: ``gs_cp SRC DST`` (either may be a gs:// URL), one
# ``gcloud storage cp``; on failure gcloud's last lines on stderr, status 1. Shared by every
# script that touches a bucket (the code's fetch.sh, an environment's INSTALL and UPLOAD).
gs_cp() {
  gs_out=$(gcloud storage cp "$1" "$2" < /dev/null 2>&1) || {
    printf '%s\n' "$gs_out" | tail -n 2 >&2; return 1
  }
}
