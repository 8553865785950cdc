# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Writes the run's state files. Needs: b (base), r (run dir), the files' contents (command,
# env, job) and k (the kit: the wrapper and the hook, staged by content; see kit.sh). Sets py.
set -e
umask 077
mkdir -p "$r"
chmod 700 "$b"
test ! -e "$r"/pid || { echo "$r exists: use a new --run-name" >&2; exit 3; }
# a launch held behind the gate (held=1) that fails before it is ready (a full disk) takes its
# run's directory with it: it may have gone out before the host's staging finished
# (core.prepare), and the runner's release only removes an empty one
[ "${held:-}" != 1 ] || trap 'rm -rf "$r"' EXIT
mkdir -p "$r"/hook
cp "$k"/sitecustomize.py "$r"/hook/sitecustomize.py
printf '%s' "$command" > "$r"/command
printf '%s' "$env" > "$r"/env
printf '%s' "$job" > "$r"/job.sh
cp "$k"/run.sh "$r"/run.sh
: > "$r"/log
# a host with python3 and no python (Ubuntu 22.04, a TPU VM): the run's PATH ends with a bin
# whose python is python3 (job.sh), as an activated venv's would; said back as py. Not when
# the run sets PATH or has a locked environment (its python comes first)
py=
nl='
'
case "$nl$env" in
  *"${nl}PATH="* | *"${nl}MULTIHOST_ENV="*) ;;
  *) if ! command -v python >/dev/null 2>&1; then
       py=$(command -v python3 2>/dev/null) || py=
       case $py in /*) mkdir "$r"/bin && ln -s "$py" "$r"/bin/python ;; *) py= ;; esac
     fi ;;
esac
