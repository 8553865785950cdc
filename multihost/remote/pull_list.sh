# shellcheck shell=sh source-path=SCRIPTDIR
# Listing what to pull. Expands each pattern on the host (a relative one in $w, a leading ~/ in $HOME) and prints NUL-terminated
# records: "P dir" first (the work dir, absolute), "F size mtime path" for a readable regular
# file (directories are walked, symbolic links below them not followed), "D path" for one it
# cannot read, "M pattern" when nothing matches, "W pattern" for a relative pattern when the
# work dir is gone. Needs GNU find (-readable, -printf).
# Arguments: WORKDIR PATTERNS (one a line).
w=$1
pats=$2
wd=yes
if cd "$w" 2>/dev/null; then printf 'P %s\0' "$PWD"; else wd=no; fi
set -f
IFS='
'
for p in $pats; do
  case $p in
    \~) p=$HOME ;;
    \~/*) p=$HOME/${p#\~/} ;;
  esac
  case $p in
    /*) ;;
    *) [ "$wd" = yes ] || { printf 'W %s\0' "$p"; continue; } ;;
  esac
  found=no
  set +f
  for f in $p; do
    [ -e "$f" ] || continue
    case ${f##*/} in .|..) [ "$f" = "$p" ] || continue ;; esac  # a glob's . and .. (.*)
    found=yes
    case $f in -*) f=./$f ;; esac  # never an option or expression to find
    find -H "$f" -type f \( -readable -printf 'F %s %T@ %p\0' -o -printf 'D %p\0' \)
  done
  set -f
  [ "$found" = yes ] || printf 'M %s\0' "$p"
done
exit 0
