"""Pure planning: each host's environment and the exact shell text the runner sends it.

Everything the runner adds to a remote command line is shell-quoted here; the user's
own ``--cmd`` is passed to ``sh -c`` untouched, as one quoted argument.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import UsageError
from multihost.model import Fleet, Host, Job

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMPLETE = ".multihost-complete"


def check_run_name(name: str) -> str:
    """Run names become remote paths: letters, digits, ``._-``, and ``/`` between parts."""
    if not _RUN_NAME.match(name) or ".." in name.split("/"):
        raise UsageError(f"bad run name {name!r}: use letters, digits, '.', '_', '-' (and '/')")
    return name


def parse_env(items: list[str]) -> dict[str, str]:
    """``K=V`` strings → mapping; a missing ``=`` or a bad name is a usage error."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise UsageError(f"--env expects NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def shell_path(path: str) -> str:
    """A remote path as shell text: quoted, with a leading ``~/`` left to the remote $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class Paths:
    """Where one host keeps staged code and this run's state (unexpanded remote paths)."""

    base: str
    code: str
    run: str

    @classmethod
    def for_host(cls, host: Host, job: Job, code_hash: str) -> Paths:
        base = (host.remote_dir or job.remote_dir).rstrip("/") or "/"
        return cls(base, f"{base}/code/{code_hash}", f"{base}/runs/{job.run_name}")


def host_env(host: Host, fleet: Fleet, job: Job, internal: Mapping[int, str]) -> dict[str, str]:
    """The variables a host's command sees: JAX/Megascale wiring, run identity, then ``--env``.

    ``internal`` maps process ids to the address other workers use to reach that host.
    """
    first = fleet.hosts[0]
    coordinator = internal.get(first.process_id) or first.internal_address or first.address
    if ":" in coordinator and not coordinator.startswith("["):
        coordinator = f"[{coordinator}]"
    env = {
        "JAX_COORDINATOR_ADDRESS": f"{coordinator}:{job.coordinator_port}",
        "JAX_PROCESS_ID": str(host.process_id),
        "JAX_PROCESS_COUNT": str(len(fleet)),
        "MULTIHOST_RUN": job.run_name,
        "MULTIHOST_SLICE_ID": str(host.slice_id),
        "MULTIHOST_WORKER_ID": str(host.worker_id),
        "MULTIHOST_NUM_SLICES": str(fleet.num_slices),
    }
    if fleet.num_slices > 1:
        env |= {
            "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator}:{job.megascale_port}",
            "MEGASCALE_PORT": str(job.megascale_port),
            "MEGASCALE_NUM_SLICES": str(fleet.num_slices),
            "MEGASCALE_SLICE_ID": str(host.slice_id),
        }
    return env | dict(job.env)


def job_script(paths: Paths, env: Mapping[str, str], command: str) -> str:
    """``job.sh``: the exact directory, environment and command of this host's run."""
    lines = [
        "# multihost job: this host's exact environment and command",
        f"cd {shell_path(paths.code)} || exit 126",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        # the stack hook (multihost stack) first on the path, the user's PYTHONPATH kept after it
        '[ -z "${MULTIHOST_STACK_DIR:-}" ] || '
        'export PYTHONPATH="$MULTIHOST_STACK_DIR${PYTHONPATH:+:$PYTHONPATH}"',
        f"exec sh -c {shlex.quote(command)}",
    ]
    return "\n".join(lines) + "\n"


# Shell functions. ``marked DIR`` prints "pid pgrp" for every live process of the run whose
# directory is DIR, found by the MULTIHOST_RUN_DIR in its environment (the wrapper itself has
# none). ``stop_run DIR GROUP`` TERMs them all, KILLs what is left after about 2 s (JAX, for
# one, catches SIGTERM), and prints how many had escaped the process group GROUP (setsid
# daemons, double forks).
_ESCAPED = """\
marked() {
  grep -lsxzF "MULTIHOST_RUN_DIR=$1" /proc/[0-9]*/environ | while read -r e; do
    p=${e#/proc/}; p=${p%/environ}
    s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    s=${s##*) }
    # shellcheck disable=SC2086 # the stat fields, split on purpose: state ppid pgrp
    set -- $s
    [ "$1" = Z ] || echo "$p $3"
  done
}
stop_run() {
  out=0
  for e in $(marked "$1" | tr ' ' :); do
    kill -TERM "${e%%:*}" 2>/dev/null || continue
    [ "${e#*:}" = "$2" ] || out=$((out+1))
  done
  i=0
  while [ $i -lt 20 ] && [ -n "$(marked "$1")" ]; do sleep 0.1; i=$((i+1)); done
  for e in $(marked "$1" | tr ' ' :); do kill -KILL "${e%%:*}" 2>/dev/null; done
  echo $out
}
"""

# Runs detached as the leader of its own session. It records its pid (= process group),
# host timestamps and, atomically, the exit code. A trap (not an ignore, which children
# would inherit) keeps it alive through TERM so that it can still write the exit file. The
# job's processes carry MULTIHOST_RUN_DIR (so that escaped ones can be found) and the stack
# hook's dir; the wrapper itself does not, so it never stops itself.
WRAPPER = f"""\
cd "${{0%/*}}" || exit 1
r=$PWD
echo $$ > pid
date +%s.%N > started
trap ':' TERM INT HUP
MULTIHOST_RUN_DIR=$r MULTIHOST_STACK_DIR=$r/hook sh ./job.sh </dev/null >>log 2>&1
rc=$?
trap '' TERM
kill -TERM -$$ 2>/dev/null
{_ESCAPED}
esc=$(stop_run "$r" $$)
[ "$esc" = 0 ] || echo "$esc" > escaped
date +%s.%N > ended
echo $rc > exit.tmp && mv -f exit.tmp exit
"""


@functools.cache
def _hook_text() -> str:
    """The stack hook staged into each run (``multihost stack``; see diagnose/hook.py)."""
    return (Path(__file__).parent / "diagnose" / "hook.py").read_text()


def stage_command(paths: Paths) -> str:
    """Says ``present`` if this code hash is unpacked already; else says ``absent`` and unpacks
    the archive then sent on stdin into the content-addressed directory, atomically."""
    code, base = shell_path(paths.code), shell_path(paths.base)
    return (
        f"set -e; test -e {code}/{COMPLETE} && {{ echo present; exit 0; }}; echo absent; "
        f"umask 077; test -d {base}/code || {{ mkdir -p {base}/code; chmod 700 {base}; }}; "
        f't={base}/code/.incoming.$$; mkdir -m 755 "$t" 2>/dev/null || '
        f'{{ t=$(mktemp -d {base}/code/.incoming.XXXXXX); chmod 755 "$t"; }}; '
        # a failed unpack (a full disk, say) leaves nothing half-written and says what is free
        'trap \'df -Pk "$t" 2>/dev/null | '
        'awk "NR==2 {print \\"free space there: \\" \\$4 \\" KiB\\"}" >&2; '
        'rm -rf "$t"\' EXIT; '
        f'tar -xzf - -C "$t"; : > "$t"/{COMPLETE}; '
        f'mv -T "$t" {code} 2>/dev/null || rm -rf "$t"; trap - EXIT'
    )


def launch_script(paths: Paths, env: Mapping[str, str], command: str) -> str:
    """Fed to ``sh -s``: writes the run's state files and starts the wrapper detached.

    Prints the process group id once the job has started.
    """
    run = shell_path(paths.run)
    files = {
        "command": command + "\n",
        "env": "".join(f"{k}={v}\n" for k, v in env.items()),
        "job.sh": job_script(paths, env, command),
        "run.sh": WRAPPER,
    }
    writes = [f"printf '%s' {shlex.quote(text)} > {run}/{name}" for name, text in files.items()]
    hook = f"printf '%s' {shlex.quote(_hook_text())} > {run}/hook/sitecustomize.py"
    return "\n".join(
        [
            "set -e",
            "umask 077",
            f"mkdir -p {run}",
            f"chmod 700 {shell_path(paths.base)}",
            f"test ! -e {run}/pid || {{ echo {run}' exists: use a new --run-name' >&2; exit 3; }}",
            f"mkdir -p {run}/hook",
            hook,
            *writes,
            f": > {run}/log",
            f"setsid sh {run}/run.sh </dev/null >/dev/null 2>&1 &",
            "echo $!",
        ]
    )


_STATE_FILES = ("started", "ended", "stopped", "escaped")


def _read_state(run: str) -> str:
    """Shell that sets $exit $started $ended $stopped $escaped from the run's files (``-`` if
    missing; $exit is ``empty`` when the exit file exists but says nothing), builtins only."""
    reads = "; ".join(f'{n}=-; read -r {n} < "$r"/{n} 2>/dev/null' for n in _STATE_FILES)
    return (
        f'r={run}; {reads}; exit=-; [ ! -e "$r"/exit ] || '
        '{ read -r exit < "$r"/exit; [ -n "$exit" ] || exit=empty; }'
    )


def watch_command(paths: Paths, offset: int) -> str:
    """Streams the host's log from byte ``offset`` until the exit file appears, or until the
    job's process group is gone for 3 s without one (``vanished``); then says on stderr
    ``end EXIT STARTED ENDED STOPPED SIZE ESCAPED`` (SIZE: the log's final length in bytes)."""
    run = shell_path(paths.run)
    return (
        f"tail -c +{offset + 1} -f -s 0.2 {run}/log 2>/dev/null & t=$!; n=0; gone=0; pg=; "
        f"while [ ! -e {run}/exit ]; do sleep 0.2; kill -0 $t 2>/dev/null || exit 3; "
        # Our parent (sshd's session, or the local runner) gone: nobody reads us any more.
        "[ ! -d /proc/$$ ] || [ -d /proc/$PPID ] || { kill $t 2>/dev/null; exit 4; }; "
        # Once a second: is the job's process group still there?
        "n=$((n+1)); [ $((n % 5)) = 0 ] || continue; "
        f'[ -n "$pg" ] || read -r pg < {run}/pid 2>/dev/null; '
        '{ [ -n "$pg" ] && ! kill -0 -"$pg" 2>/dev/null; } && gone=$((gone+1)) || gone=0; '
        f"[ $gone -lt 3 ] || [ -e {run}/exit ] || break; done; "
        f"kill $t 2>/dev/null; wait $t 2>/dev/null; {_read_state(run)}; "
        '[ -e "$r"/exit ] || exit=vanished; '
        'size=$(wc -c < "$r"/log); '
        'echo "end $exit $started $ended $stopped $size $escaped" >&2; exit 0'
    )


def finish_command(paths: Paths, offset: int) -> str:
    """First line: exit code, start, end, stop signal, escaped (``-`` if missing); then the
    log from ``offset``."""
    return (
        f'{_read_state(shell_path(paths.run))}; test -d "$r" || {{ echo missing; exit 0; }}; '
        f'echo "$exit $started $ended $stopped $escaped"; tail -c +{offset + 1} "$r"/log'
    )


def status_command(paths: Paths) -> str:
    """One line ``exit started ended stopped pid alive size mtime escaped``, then the log's
    last line (mtime: when the log last grew, host clock, epoch seconds)."""
    return (
        f'{_read_state(shell_path(paths.run))}; test -d "$r" || {{ echo missing; exit 0; }}; '
        'pg=-; read -r pg < "$r"/pid 2>/dev/null; alive=no; '
        '[ "$pg" = - ] || ! kill -0 -"$pg" 2>/dev/null || alive=yes; '
        'mt=$(date -r "$r"/log +%s 2>/dev/null) || mt=-; size=$(wc -c < "$r"/log); '
        'echo "$exit $started $ended $stopped $pg $alive $size $mt $escaped"; tail -n 1 "$r"/log'
    )


def claim_command(paths: Paths) -> str:
    """Creates the run's directory on the host, refusing a name already there (or a symbolic
    link in its place): every host is claimed before any job starts."""
    run, base = shell_path(paths.run), shell_path(paths.base)
    return (
        f'umask 077; b={base}; r={run}; mkdir -p "$b" "${{r%/*}}" && chmod 700 "$b" || exit 1; '
        'if [ -L "$r" ]; then echo "$r is a symbolic link: refusing to use it" >&2; exit 3; fi; '
        'mkdir "$r" 2>/dev/null || { echo "run $r exists on this host: use a new --run-name" >&2; '
        "exit 3; }"
    )


def release_command(paths: Paths) -> str:
    """Undoes ``claim_command`` when another host refused: removes the empty run directory."""
    return f"rmdir {shell_path(paths.run)} 2>/dev/null; exit 0"


def kill_command(paths: Paths, signal: str, grace: float) -> str:
    """Signals the run's process group, KILLs it after ``grace`` s (then records 128+9), and
    stops processes of the run that escaped the group. Says ``finished``, ``nopid``,
    ``vanished`` (the group was already gone, no exit code), ``stopped`` or ``killed``, then
    how many escaped processes it stopped."""
    run = shell_path(paths.run)
    ticks = max(1, int(grace * 10))
    sig = shlex.quote(signal)
    return (
        f"{_ESCAPED}"
        f'umask 077; r={run}; test -e "$r"/exit && {{ echo finished 0; exit 0; }}; '
        'i=0; while [ ! -s "$r"/pid ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; '
        'pg=; read -r pg < "$r"/pid 2>/dev/null; test -n "$pg" || { echo nopid 0; exit 0; }; '
        'if ! kill -0 -"$pg" 2>/dev/null; then sleep 1; '
        'test -e "$r"/exit && { echo finished 0; exit 0; }; '
        'echo vanished "$(stop_run "$r" "$pg")"; exit 0; fi; '
        f'echo {sig} > "$r"/stopped; kill -{sig} -"$pg" 2>/dev/null; i=0; '
        f'while [ ! -e "$r"/exit ] && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done; '
        'test -e "$r"/exit && { esc=-; read -r esc < "$r"/escaped 2>/dev/null; '
        'echo stopped "$esc"; exit 0; }; '
        'echo KILL > "$r"/stopped; kill -KILL -"$pg" 2>/dev/null; sleep 0.2; '
        'esc=$(stop_run "$r" "$pg"); [ "$esc" = 0 ] || echo "$esc" > "$r"/escaped; '
        'test -e "$r"/exit || { date +%s.%N > "$r"/ended; echo 137 > "$r"/exit.tmp; '
        'mv -f "$r"/exit.tmp "$r"/exit; }; echo killed "$esc"'
    )


def clean_command(paths: Paths, older_than: float) -> str:
    """Removes this finished run's directory, then staged code dirs older than ``older_than``
    s that no remaining run's ``job.sh`` uses; prints each removed code hash."""
    run, base = shell_path(paths.run), shell_path(paths.base)
    minutes = max(0, int(older_than // 60))
    return (
        f'r={run}; b={base}; test ! -e "$r" || {{ test -e "$r"/exit && rm -rf "$r"; }} || '
        '{ echo "$r is still running" >&2; exit 1; }; '
        f'find "$b"/code -mindepth 1 -maxdepth 1 -type d \\( ! -name ".*" -mmin +{minutes} '
        f'-o -name ".incoming.*" -mmin +{max(minutes, 1440)} \\) 2>/dev/null | '
        "while read -r d; do h=${d##*/}; "
        'grep -qsF "/code/$h" "$b"/runs/*/job.sh || { rm -rf "$d" && echo "$h"; }; done; exit 0'
    )


@dataclass(frozen=True)
class HostPlan:
    """Everything one host is sent for a run, computed before any I/O."""

    host: Host
    paths: Paths
    env: dict[str, str]
    launch: str


def plan_hosts(
    fleet: Fleet, job: Job, code_hash: str, internal: Mapping[int, str] | None = None
) -> list[HostPlan]:
    """Per-host paths, env and launch script for the whole fleet."""
    plans = []
    for host in fleet:
        paths = Paths.for_host(host, job, code_hash)
        env = host_env(host, fleet, job, internal or {})
        plans.append(HostPlan(host, paths, env, launch_script(paths, env, job.command)))
    return plans
