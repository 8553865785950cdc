# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# The wrapper's start: through python3 (where there is one), which makes itself a child
# subreaper and execs sh (the setting survives exec; the pid, the session and the group stay).
# What Python changes on its way in is put back first, so the job inherits exactly what it
# would from sh: SIGPIPE and SIGXFSZ (ignored by Python) to their defaults, LC_CTYPE (which
# Python's locale coercion sets in a C locale) as the shell had it.
# Sets the positional parameters to the command that starts the wrapper (then: "$@" run.sh).
set -- sh
if command -v python3 >/dev/null 2>&1; then
  set -- python3 -S -c 'import ctypes, os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
if sys.argv[1]:
    os.environ["LC_CTYPE"] = sys.argv[2]
else:
    os.environ.pop("LC_CTYPE", None)
if ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0:
    os.environ["MULTIHOST_SUBREAPER"] = "1"
os.execvp("sh", ["sh"] + sys.argv[3:])' "${LC_CTYPE+set}" "${LC_CTYPE:-}"
fi
