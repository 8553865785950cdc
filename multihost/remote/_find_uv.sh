# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Where a host's uv is: on PATH, or the one multihost shipped before. Needs: b. Sets $uv (""
# if none), and defines on_path (a program on PATH, as env_probe.on_path finds it).
on_path() {  # the first executable $1 on PATH in $found ("" if none): no subshell, no program
  found=
  set -f
  IFS=:
  for d in $PATH; do
    if [ -x "${d:-.}/$1" ] && [ ! -d "${d:-.}/$1" ]; then found=${d:-.}/$1; break; fi
  done
  unset IFS
  set +f
}
on_path uv
uv=$found
[ -n "$uv" ] || { [ -x "$b"/bin/uv ] && uv="$b"/bin/uv; } || :
