"""Every shell script multihost runs on a host, as a constant POSIX sh template.

A template never has values spliced into its text: it reads them from variables that
:func:`script` assigns in a prelude, each value quoted once by ``shlex.quote`` (a remote path's
leading ``~/`` becomes ``"$HOME"/`` so the host expands it). ``TEMPLATES`` lists them all; the
pure test tier runs each through ``sh -n`` and shellcheck, and runs most of them for real.
"""

from __future__ import annotations

import shlex

# the shared fragments (reading a run's state, finding and stopping its processes)
from multihost.remote.processes import DESCENDANTS, READ_STATE, RUN_PROCESSES

# -- the templates --------------------------------------------------------------------------

# Staging. Vars: b (base dir), c (code dir), done (the marker file name). Says "present" if the
# code is unpacked already; else "absent", and unpacks the archive then sent on stdin into the
# content-addressed directory, atomically; a failed unpack leaves nothing half-written.
STAGE = """\
set -e
test -e "$c/$done" && { echo present; exit 0; }
echo absent
umask 077
test -d "$b"/code || { mkdir -p "$b"/code; chmod 700 "$b"; }
t="$b"/code/.incoming.$$
mkdir -m 755 "$t" 2>/dev/null || { t=$(mktemp -d "$b"/code/.incoming.XXXXXX); chmod 755 "$t"; }
trap 'df -Pk "$t" 2>/dev/null | awk "NR==2 {print \\"free space there: \\" \\$4 \\" KiB\\"}" >&2
rm -rf "$t"' EXIT
tar -xzf - -C "$t"
: > "$t/$done"
mv -T "$t" "$c" 2>/dev/null || rm -rf "$t"
trap - EXIT
"""

# The run's wrapper, written to run.sh and started detached as the leader of its own session.
# It records its pid (= process group), host timestamps and, atomically, the exit code. A trap
# (not an ignore, which children would inherit) keeps it alive through TERM so that it can
# still write the exit file. The job's processes carry MULTIHOST_RUN_DIR (so that escaped ones
# can be found) and the stack hook's dir; the wrapper itself does not, so it never stops itself.
# Started as ``run.sh gate`` (LAUNCH_WATCH), it is up before the word and waits for "go" on
# stdin (anything else or the end: exit 5, nothing run): after the word, no fork stands
# between the host and its job's start but the job's own. Its start time is the mtime of an
# empty started file (a builtin ``: >``; READ_STATE reads it).
WRAPPER = f"""\
cd "${{0%/*}}" || exit 1
r=$PWD
echo $$ > pid
reaper=${{MULTIHOST_SUBREAPER:-}}
unset MULTIHOST_SUBREAPER
if [ "${{1:-}}" = gate ]; then
  go=; n=0; read -r go n || :
  case $n in '' | *[!0-9]*) n=0 ;; esac
  # run --secret: "go N", then N lines KEY=VALUE, exported for the job alone (a pipe: no file)
  while [ "$n" -gt 0 ] && read -r l; do export "${{l%%=*}}=${{l#*=}}"; n=$((n - 1)); done
  l=
  exec </dev/null
  [ "$go" = go ] || exit 5
fi
: > started
trap ':' TERM INT HUP
MULTIHOST_RUN_DIR=$r MULTIHOST_STACK_DIR=$r/hook sh ./job.sh </dev/null >>log 2>&1
rc=$?
trap '' TERM
kill -TERM -$$ 2>/dev/null
{DESCENDANTS}{RUN_PROCESSES}
if [ -n "$reaper" ]; then stop_own $$; else out=$(stop_run "$r" $$); fi
[ "$out" = 0 ] || echo "$out" > escaped
date +%s.%N > ended
echo $rc > exit.tmp && mv -f exit.tmp exit
"""

# Launch. Vars: b (base), r (run dir), and the files' contents: command, env, job, wrapper,
# hook. Writes the run's state files, starts the wrapper detached, prints its process group.
_WRITE_RUN = """\
set -e
umask 077
mkdir -p "$r"
chmod 700 "$b"
test ! -e "$r"/pid || { echo "$r exists: use a new --run-name" >&2; exit 3; }
mkdir -p "$r"/hook
printf '%s' "$hook" > "$r"/hook/sitecustomize.py
printf '%s' "$command" > "$r"/command
printf '%s' "$env" > "$r"/env
printf '%s' "$job" > "$r"/job.sh
printf '%s' "$wrapper" > "$r"/run.sh
: > "$r"/log
"""
# The wrapper's start: through python3 (where there is one), which makes itself a child
# subreaper and execs sh (the setting survives exec; the pid, the session and the group stay).
# What Python changes on its way in is put back first, so the job inherits exactly what it
# would from sh: SIGPIPE and SIGXFSZ (ignored by Python) to their defaults, LC_CTYPE (which
# Python's locale coercion sets in a C locale) as the shell had it.
_REAPER = """\
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
"""
_START = (
    _REAPER
    + """\
setsid "$@" "$r"/run.sh </dev/null >/dev/null 2>&1 &
# the wrapper writes the same pid once sh runs; written here too, so that a status asked at
# once never finds the run without one while python3 starts
echo $! > "$r"/pid
echo $!
"""
)
LAUNCH = _WRITE_RUN + _START

# The log from byte o to stdout as it grows, while this shell lives (t: the tail's pid).
_TAIL = """\
tail -c +$((o + 1)) -f -s 0.2 --pid=$$ "$r"/log 2>/dev/null & t=$!
"""

# The gate of a launch that watches: every host writes its run's files, starts its log's tail
# and its wrapper (``run.sh gate``, holding at its own gate: a pipe from this shell, a FIFO
# unlinked once open) and says "ready PGID" (the wrapper's process group); then waits for the
# runner's word on stdin. The runner
# sends "go" to every host at once when all are ready, and each host passes it on to its
# wrapper: the jobs start together, with no fork between the word and a job's start but the
# job's own. "stop" (one host could not be launched), or the channel's end (the runner gone),
# closes the pipe: the wrapper ends without running anything, the run's directory goes. This
# shell's own end closes the pipe too, and the tail follows this shell (--pid). The process
# group comes with "ready", so no log byte can come ahead of it, and nothing is written back
# between the word and the job's start (on shared cores, 256 hosts' replies held up their
# jobs). The script that holds a gate is one { } group: the shell reads all of it before it
# runs any, so stdin then holds only the word.
_GATE = (
    """\
mkfifo -m 600 "$r"/gate
set +e
"""
    + _TAIL
    + """\
# shellcheck disable=SC2094 # one FIFO, both ends on purpose: a pipe this shell holds
exec 3<>"$r"/gate 4<"$r"/gate
rm -f "$r"/gate
"""
    + _REAPER
    + """\
setsid "$@" "$r"/run.sh gate <&4 >/dev/null 2>&1 3>&- 4<&- &
w=$!
exec 4<&-
echo "ready $w"
go=; n=0; read -r go n || :
if [ "$go" != go ]; then
  exec 3>&-
  wait $w
  kill $t 2>/dev/null; wait $t
  rm -rf "$r"
  exit 5
fi
case $n in '' | *[!0-9]*) n=0 ;; esac
# run --secret: N lines KEY=VALUE after the word, passed on to the wrapper in memory only
# (shell variables and the pipe; printf is a builtin: no command line shows them)
i=0; sec=
while [ "$i" -lt "$n" ] && read -r l; do sec="$sec$l
"; i=$((i + 1)); done
printf 'go %s\n%s' "$i" "$sec" >&3
sec=; l=
exec 3>&-
"""
)

# Watching. Vars: r (run dir), o (byte offset). Streams the log from o until the exit file
# appears, or until the job's process group has been gone for 3 s without one ("vanished");
# then says on stderr "end EXIT STARTED ENDED STOPPED SIZE ESCAPED". The exit file is looked
# for every 0.2 s at first, then every 0.5 s, then every second (each look forks a sleep: on
# a thousand hosts sharing cores, polling fast for long costs more than it gains). When this
# shell started the job's wrapper (LAUNCH_WATCH), the wrapper's end cuts the sleep short: a
# trapped CHLD ends ``wait`` at once in dash (Debian's and Ubuntu's sh), so a short job's end
# is seen at once, and LAUNCH_WATCH looks every second from the start (a fork a second, not
# five, on every host just as all the jobs start); other shells wait out the sleep.
_POLL = f"""\
gone=0; pg=
trap : CHLD
while [ ! -e "$r"/exit ]; do
  sleep $s & z=$!
  # cut short (status > 128): the sleep still runs, and is ours to stop
  wait $z || kill $z 2>/dev/null
  kill -0 $t 2>/dev/null || exit 3
  # our parent (sshd's session, or the local runner) gone: nobody reads us any more
  [ ! -d /proc/$$ ] || [ -d /proc/$PPID ] || {{ kill $t 2>/dev/null; exit 4; }}
  [ -n "$pg" ] || {{ read -r pg < "$r"/pid; }} 2>/dev/null
  # gone: tenths of a second the group has been seen gone
  if [ -n "$pg" ] && ! kill -0 -"$pg" 2>/dev/null; then gone=$((gone + d)); else gone=0; fi
  [ $gone -lt 30 ] || [ -e "$r"/exit ] || break
  n=$((n + 1))
  case $n in 3) s=0.5 d=5 ;; 8) s=1 d=10 ;; esac
done
kill $t 2>/dev/null; wait $t 2>/dev/null
{READ_STATE}[ -e "$r"/exit ] || exit=vanished
size=$(wc -c < "$r"/log)
echo "end $exit $started $ended $stopped $size $escaped" >&2
exit 0
"""
WATCH = _TAIL + "n=0; s=0.2; d=2\n" + _POLL

# Launch behind the gate, then watch on the same channel (one channel and round trip less per
# host): "ready PGID", then (after "go") the log from its first byte
# and the "end ..." line as WATCH. Vars: LAUNCH's and o. It polls each second from the start
# (n=8 is past the back-off's steps): the job's end comes as a CHLD, not from the poll.
# A launch behind the gate that fails before it is ready (a full disk) takes its run's directory
# with it: it may have gone out before the host's staging finished (core.prepare), and the
# runner's release only removes an empty one.
_WRITE_HELD = _WRITE_RUN.replace(
    'mkdir -p "$r"/hook\n', 'trap \'rm -rf "$r"\' EXIT\nmkdir -p "$r"/hook\n'
)
_GATE_HELD = _GATE.replace('echo "ready $w"\n', 'trap - EXIT\necho "ready $w"\n')
LAUNCH_WATCH = "{\n" + _WRITE_HELD + _GATE_HELD + "n=8; s=1; d=10\n" + _POLL + "}\n"

# Finishing. Vars: r, o. First line: exit code, start, end, stop signal, escaped ("-" when
# missing); then the log from byte o. "missing" when the run's directory is gone.
FINISH = f"""\
test -d "$r" || {{ echo missing; exit 0; }}
{READ_STATE}echo "$exit $started $ended $stopped $escaped"
tail -c +$((o + 1)) "$r"/log
"""

# Status. Var: r. One line "exit started ended stopped pid alive size mtime escaped", then
# the log's last line (mtime: when the log last grew, host clock).
STATUS = f"""\
test -d "$r" || {{ echo missing; exit 0; }}
{READ_STATE}pg=-; {{ read -r pg < "$r"/pid; }} 2>/dev/null
alive=no
[ "$pg" = - ] || ! kill -0 -"$pg" 2>/dev/null || alive=yes
mt=$(date -r "$r"/log +%s 2>/dev/null) || mt=-
size=$(wc -c < "$r"/log)
echo "$exit $started $ended $stopped $pg $alive $size $mt $escaped"
tail -n 1 "$r"/log
"""

# Claiming the run's name. Vars: b, r. Creates the run's directory, refusing a name already
# there (exit 3) or a symbolic link in its place: every host is claimed before any job starts.
CLAIM = """\
umask 077
mkdir -p "$b" "${r%/*}" && chmod 700 "$b" || exit 1
if [ -L "$r" ]; then echo "$r is a symbolic link: refusing to use it" >&2; exit 3; fi
mkdir "$r" 2>/dev/null || { echo "run $r exists on this host: use a new --run-name" >&2; exit 3; }
"""

# A new run's first (and, before its launch, only) channel to a host: the claim above, then
# STAGE; one round trip less per host than the two apart. Vars: b, r, c, done.
CLAIM_STAGE = CLAIM + STAGE

# Undoing a claim when another host refused (or a later step failed). Var: r. The directory
# holds at most the environment key it claimed (envkey).
RELEASE = """\
rm -f "$r"/envkey
rmdir "$r" 2>/dev/null
exit 0
"""

# Stopping. Vars: r, sig (a signal name), ticks (tenths of a second of grace). Signals the
# run's process group, KILLs it after the grace (then records 128+9), stops what escaped the
# group. Says finished, nopid, vanished, stopped or killed, then how many escaped; "gone N" when
# the run directory is gone: the N processes found by their MULTIHOST_RUN_DIR were stopped.
KILL = f"""\
{DESCENDANTS}{RUN_PROCESSES}umask 077
# the run's directory removed under a live job: its processes still carry the marker
test -d "$r" || {{ echo gone "$(stop_run "$r" -)"; exit 0; }}
test -e "$r"/exit && {{ echo finished 0; exit 0; }}
i=0; while [ ! -s "$r"/pid ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
pg=; {{ read -r pg < "$r"/pid; }} 2>/dev/null
test -n "$pg" || {{ echo nopid 0; exit 0; }}
if ! kill -0 -"$pg" 2>/dev/null; then
  sleep 1
  test -e "$r"/exit && {{ echo finished 0; exit 0; }}
  echo vanished "$(stop_run "$r" "$pg")"
  exit 0
fi
echo "$sig" > "$r"/stopped
kill -"$sig" -"$pg" 2>/dev/null
i=0; while [ ! -e "$r"/exit ] && [ $i -lt "$ticks" ]; do sleep 0.1; i=$((i + 1)); done
if [ -e "$r"/exit ]; then
  esc=-; {{ read -r esc < "$r"/escaped; }} 2>/dev/null; echo stopped "$esc"; exit 0
fi
echo KILL > "$r"/stopped
# the wrapper's descendants (its group and what it adopted), but not the wrapper: it then
# writes the exit file itself, as at any end
kids "$pg"
esc=0
for e in $all; do [ "${{e#*:}}" = "$pg" ] || esc=$((esc+1)); done
[ "$esc" = 0 ] || echo "$esc" > "$r"/escaped
for e in $all; do kill -KILL "${{e%%:*}}" 2>/dev/null; done
i=0; while [ -n "$all" ] && [ ! -e "$r"/exit ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -e "$r"/exit ]; then
  # the wrapper does not answer: the whole group, and the run's processes by their marker
  kill -KILL -"$pg" 2>/dev/null
  sleep 0.2
  more=$(stop_run "$r" "$pg")
  esc=$((esc + more))
  [ "$esc" = 0 ] || echo "$esc" > "$r"/escaped
  date +%s.%N > "$r"/ended; echo 137 > "$r"/exit.tmp; mv -f "$r"/exit.tmp "$r"/exit
fi
echo killed "$esc"
"""

# Cleaning. Vars: r, b, age (minutes), incoming (minutes). Removes this finished run's
# directory, then staged code dirs older than age that no remaining run's job.sh uses (and
# interrupted uploads older than incoming); prints each removed code hash.
CLEAN = """\
if [ -e "$r" ]; then
  test -e "$r"/exit || { echo "$r is still running" >&2; exit 1; }
  rm -rf "$r"
fi
find "$b"/code -mindepth 1 -maxdepth 1 -type d \\( ! -name ".*" -mmin +"$age" \\
  -o -name ".incoming.*" -mmin +"$incoming" \\) 2>/dev/null | while read -r d; do
  h=${d##*/}
  grep -rqsF --include=job.sh "/code/$h" "$b"/runs || { rm -rf "$d" && echo "$h"; }
done
exit 0
"""

# Listing what to pull. Vars: w (the run's work dir), pats (patterns, one a line). Expands each
# pattern on the host (a relative one in $w, a leading ~/ in $HOME) and prints NUL-terminated
# records: "P dir" first (the work dir, absolute), "F size mtime path" for a readable regular
# file (directories are walked, symbolic links below them not followed), "D path" for one it
# cannot read, "M pattern" when nothing matches, "W pattern" for a relative pattern when the
# work dir is gone. Needs GNU find (-readable, -printf).
PULL_LIST = """\
wd=yes
if cd "$w" 2>/dev/null; then printf 'P %s\\0' "$PWD"; else wd=no; fi
set -f
IFS='
'
for p in $pats; do
  case $p in
    \\~) p=$HOME ;;
    \\~/*) p=$HOME/${p#\\~/} ;;
  esac
  case $p in
    /*) ;;
    *) [ "$wd" = yes ] || { printf 'W %s\\0' "$p"; continue; } ;;
  esac
  found=no
  set +f
  for f in $p; do
    [ -e "$f" ] || continue
    found=yes
    case $f in -*) f=./$f ;; esac  # never an option or expression to find
    find -H "$f" -type f \\( -readable -printf 'F %s %T@ %p\\0' -o -printf 'D %p\\0' \\)
  done
  set -f
  [ "$found" = yes ] || printf 'M %s\\0' "$p"
done
exit 0
"""


def remote_path(path: str) -> str:
    """A remote path as a quoted shell word, a leading ``~/`` left to the host's $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def script(template: str, *, paths: dict[str, str] | None = None, **values: object) -> str:
    """``template`` with a prelude assigning each value once, quoted (``paths``: remote paths,
    whose ``~/`` the host expands)."""
    prelude = [f"{k}={remote_path(v)}" for k, v in (paths or {}).items()]
    prelude += [f"{k}={shlex.quote(str(v))}" for k, v in values.items()]
    return "\n".join(prelude) + "\n" + template


TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: (template, the variables its prelude assigns)
    "stage": (STAGE, ("b", "c", "done")),
    "wrapper": (WRAPPER, ()),
    "launch": (LAUNCH, ("b", "r", "command", "env", "job", "wrapper", "hook")),
    "watch": (WATCH, ("r", "o")),
    "launch_watch": (LAUNCH_WATCH, ("b", "r", "command", "env", "job", "wrapper", "hook", "o")),
    "finish": (FINISH, ("r", "o")),
    "status": (STATUS, ("r",)),
    "claim": (CLAIM, ("b", "r")),
    "claim_stage": (CLAIM_STAGE, ("b", "r", "c", "done")),
    "release": (RELEASE, ("r",)),
    "kill": (KILL, ("r", "sig", "ticks")),
    "clean": (CLEAN, ("r", "b", "age", "incoming")),
    "pull_list": (PULL_LIST, ("w", "pats")),
}
