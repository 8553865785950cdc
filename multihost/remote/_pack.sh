# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Packing an environment that is complete here and its manifest, unless packed already in the
# format asked for (fmt: zst, zstd on every core; gz). The pack's sha256 is kept beside it
# (<key>.tar.FMT.sha256); a kept pack that no longer matches it (altered, corrupted) is never
# handed on: it is packed again, said as "repacked WHY". A kept pack of the other format goes
# (a host keeps one). Needs: e (envs dir), key, fmt. Says "packed SIZE SHA256".
k="$e/$key".tar.$fmt
o="$e/$key".tar.gz
[ "$fmt" = zst ] || o="$e/$key".tar.zst
h=
if [ -s "$k" ]; then
  h=$(sha256sum "$k"); h=${h%% *}
  if [ -s "$k".sha256 ] && [ "$h" != "$(cat "$k".sha256)" ]; then
    echo "repacked: its kept pack's sha256 is $h, not the $(cat "$k".sha256) it was packed with"
    rm -f "$k"; h=
  fi
fi
if [ -z "$h" ]; then
  if [ "$fmt" = zst ]; then
    tar -I 'zstd -q -T0 -3' -cf "$k".$$ -C "$e/$key" .
  else
    tar -czf "$k".$$ -C "$e/$key" .
  fi
  h=$(sha256sum "$k".$$); h=${h%% *}
  echo "$h" > "$k".sha256.$$
  mv -f "$k".sha256.$$ "$k".sha256
  mv -f "$k".$$ "$k"
fi
rm -f "$o" "$o".sha256
echo "packed $(wc -c < "$k") $h"
