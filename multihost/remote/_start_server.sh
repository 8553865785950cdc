# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# A seed's server started in $s (its archive in place): token file, the stdlib server bound to
# $addr serving only the path $name, "serving PORT PID DIR" once it listens, else "noserver
# WHY" and nothing left. Shared by the code's seed (seed.sh) and an environment's
# (multihost.remote.envsync.SERVE). Needs: s, token, serve, addr, lifetime, fetches, name.
printf '%s\n' "$token" > "$s"/token
setsid python3 -c "$serve" "$addr" "$s" "$lifetime" "$fetches" "$name" \
  </dev/null >"$s".out 2>"$s".err &
p=$!
i=0
while [ ! -s "$s".out ] && [ ! -s "$s".err ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
said=; { read -r said < "$s".out; } 2>/dev/null || :
case $said in
  port\ *) echo "serving ${said#port } $p $s" ;;
  *)
    kill "$p" 2>/dev/null || :
    why=${said#error }; [ -n "$why" ] || why=$(tail -n 1 "$s".err)
    echo "noserver ${why:-the server did not start}"
    rm -rf "$s"
    ;;
esac
rm -f "$s".out "$s".err
