# shellcheck shell=sh
# multihost plot: a run's step times on this host, binned. Of the run's step logs (the hook's
# <pid>.steps: "STEP BOOTTIME SECONDS OWN_SECONDS" lines) the one with the most lines; says
# "steps FILE LINES LAST_STEP WIDTH", then per bin of WIDTH steps (BINS at most) "b FIRST_STEP
# COUNT MEAN_S MAX_S MEAN_OWN_S MAX_OWN_S BOOTTIME" (its last step's end). "none" when the
# run's processes logged no step here, "missing" when the run's dir is gone.
# Arguments: RUN (the run's dir; a leading ~ is expanded here) BINS.
r=$1
bins=$2
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
test -d "$r" || { echo missing; exit 0; }
best='' most=0
for f in "$r"/hook/*.steps; do
  [ -f "$f" ] || continue
  n=$(wc -l < "$f")
  [ "$n" -gt "$most" ] && { most=$n; best=$f; }
done
[ -n "$best" ] || { echo none; exit 0; }
last=$(tail -n 1 "$best")
max=${last%% *}
case $max in '' | *[!0-9]*) echo none; exit 0 ;; esac
width=$(((max + bins - 1) / bins))
[ "$width" -ge 1 ] || width=1
printf 'steps %s %s %s %s\n' "${best##*/}" "$most" "$max" "$width"
awk -v w="$width" '
NF == 4 && $1 ~ /^[0-9]+$/ {
  k = int(($1 - 1) / w)
  c[k]++; s[k] += $3; o[k] += $4; t[k] = $2
  if ($3 > m[k]) m[k] = $3
  if ($4 > om[k]) om[k] = $4
  if (k > top) top = k
}
END {
  for (k = 0; k <= top; k++)
    if (c[k]) printf "b %d %d %.6f %.6f %.6f %.6f %s\n", k * w + 1, c[k], s[k] / c[k], m[k], o[k] / c[k], om[k], t[k]
}' "$best"
