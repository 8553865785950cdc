# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Says "present" if the code is unpacked already; else "absent", and unpacks the archive then
# sent on stdin into the content-addressed directory, atomically; a failed unpack leaves
# nothing half-written. Needs: b (base dir), c (code dir), done (the marker file's name).
set -e
test -e "$c/$done" && { echo present; exit 0; }
echo absent
umask 077
test -d "$b"/code || { mkdir -p "$b"/code; chmod 700 "$b"; }
t="$b"/code/.incoming.$$
mkdir -m 755 "$t" 2>/dev/null || { t=$(mktemp -d "$b"/code/.incoming.XXXXXX); chmod 755 "$t"; }
trap 'df -Pk "$t" 2>/dev/null | awk "NR==2 {print \"free space there: \" \$4 \" KiB\"}" >&2
rm -rf "$t"' EXIT
tar -xzf - -C "$t"
: > "$t/$done"
mv -T "$t" "$c" 2>/dev/null || rm -rf "$t"
trap - EXIT
