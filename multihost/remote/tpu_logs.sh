# shellcheck shell=sh
# A failed TPU run's runtime logs: the newest N regular files of DIR, each cut to its last MAX
# bytes, as a gzip'd tar on stdout (copies in a private temp dir, removed on exit); `.cut`
# lists those cut, with their whole size. Exit 3: no such directory.
# Arguments: DIR N MAX.
d=$1
n=$2
max=$3
[ -d "$d" ] || exit 3
t=$(mktemp -d) || exit 4
trap 'rm -rf "$t"' EXIT
cd "$d" || exit 4
# shellcheck disable=SC2012  # newest first; names with a newline are skipped below
ls -1t | while IFS= read -r f; do
  [ -f "$f" ] && [ -r "$f" ] || continue
  [ "$n" -gt 0 ] || break
  n=$((n - 1))
  s=$(wc -c < "$f")
  if [ "$s" -gt "$max" ]; then
    tail -c "$max" -- "$f" > "$t/$f"
    printf '%s %s\n' "$s" "$f" >> "$t/.cut"
  else
    cat -- "$f" > "$t/$f"
  fi
done
tar -C "$t" -czf - .
