# shellcheck shell=sh source-path=SCRIPTDIR
# An environment's check: one line of name=value words (see env_probe.py). ``-S``: the probe is
# stdlib only, so the host's site-packages and their .pth files are not read before every run.
# Arguments: BASE RUN LOCK RUV KIT (RUN: the run's claimed dir, which records the key it uses,
# "" for none; LOCK: the lock's hash; RUV: the uv version a host without one gets; KIT: where
# env_probe.py is, staged by content with the run's other scripts: kit.sh).
#
# The warm path starts no Python (a Python start-up is most of a warm run's cost on a busy
# host): env_probe.py leaves ``ENVS/.probe-LOCK`` (its C library's path; the fingerprint of
# the runner's uv version, python3, uv and that C library: device, inode, size, mtime; its
# words); when python3, uv and the C library are the very files they were, the key is the
# same, and an environment whose manifest's files are all there with their sizes is used as
# env_probe.py would (one flock, one find for both, one awk: about 5 ms of CPU here, against
# 13 ms for env_probe.py): under the shared lock, the run records the key and the
# environment's last use is now (whether zstd is on PATH is asked again). Anything else
# (no cache, a changed file, an absent or damaged environment, no flock or GNU find):
# env_probe.py, which says why and repairs.
b=$1
r=$2
lock=$3
ruv=$4
k=$5
. ./_find_uv.sh
on_path python3
py=$found
[ -n "$py" ] || { echo "no python3 on this host" >&2; exit 4; }
e="$b"/envs
f="$e"/.probe-"$lock"
if [ -r "$f" ] && command -v flock >/dev/null 2>&1 \
  && { IFS= read -r libc && IFS= read -r was && IFS= read -r words; } < "$f"
then
  key=${words#key=}
  key=${key%% *}
  umask 077
  if command exec 9>> "$e"/.lock && flock -s 9; then
    [ ! -d "$r" ] || echo "$key" > "$r"/envkey
    # one find: the fingerprint's files ("= " lines, as env_probe.fingerprint writes them),
    # then the environment's files and links as the manifest lists them
    if find -H "$py" ${uv:+"$uv"} "$libc" "$e/$key" \( -path "$e/$key/*" \( \
        \( -type f -printf '%s %P\n' \) -o \( -type l -printf 'l %P\n' \) -o -true \) \) \
        -o \( ! -path "$e/$key" -printf '= %D.%i.%s.%Ts \n' \) 2>/dev/null \
      | awk -v m="$e/$key"/.multihost-manifest -v was="$was" -v now="$ruv|" '
          BEGIN { while ((getline l < m) > 0) { want[l] = 1; n++ }; if (n == 0) exit 1 }
          /^= / { now = now substr($0, 3); next }
          $0 == "0 .multihost-complete" { done = 1 }
          $0 in want { delete want[$0]; n-- }
          END { exit !(done && n == 0 && now == was) }'
    then
      : > "$e/$key".used
      z=no  # now, not when it was cached; as env_probe.on_path asks (an ACL may deny it)
      on_path zstd
      [ -z "$found" ] || z=yes
      echo "${words% zstd=*} zstd=$z state=present"
      exit 0
    fi
    exec 9>&-
  fi
fi
exec python3 -S - "$e" "$lock" "$ruv" "$uv" "$r" < "$k"/env_probe.py
