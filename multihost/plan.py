"""Pure planning: each host's environment and the exact shell text the runner sends it.

Everything the runner adds to a remote command line is shell-quoted here; the user's
own ``--cmd`` is passed to ``sh -c`` untouched, as one quoted argument.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass

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


def default_run_name() -> str:
    """``20261123-054213-3fa9``: sorts by start time; the random suffix keeps runs started
    in the same second (gathered API calls) apart."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


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
        f"exec sh -c {shlex.quote(command)}",
    ]
    return "\n".join(lines) + "\n"


# Runs detached as the leader of its own session. It records its pid (= process group),
# host timestamps and, atomically, the exit code. A trap (not an ignore, which children
# would inherit) keeps it alive through TERM so that it can still write the exit file.
WRAPPER = """\
cd "${0%/*}" || exit 1
echo $$ > pid
date +%s.%N > started
trap ':' TERM INT HUP
sh ./job.sh </dev/null >>log 2>&1
rc=$?
trap '' TERM
kill -TERM -$$ 2>/dev/null
date +%s.%N > ended
echo $rc > exit.tmp && mv -f exit.tmp exit
"""


def stage_command(paths: Paths) -> str:
    """Says ``present`` if this code hash is unpacked already; else says ``absent`` and unpacks
    the archive then sent on stdin into the content-addressed directory, atomically."""
    code, base = shell_path(paths.code), shell_path(paths.base)
    return (
        f"set -e; test -e {code}/{COMPLETE} && {{ echo present; exit 0; }}; echo absent; "
        f"umask 077; test -d {base}/code || {{ mkdir -p {base}/code; chmod 700 {base}; }}; "
        f't={base}/code/.incoming.$$; mkdir -m 755 "$t" 2>/dev/null || '
        f'{{ t=$(mktemp -d {base}/code/.incoming.XXXXXX); chmod 755 "$t"; }}; '
        f'tar -xzf - -C "$t"; : > "$t"/{COMPLETE}; '
        f'mv -T "$t" {code} 2>/dev/null || rm -rf "$t"'
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
    return "\n".join(
        [
            "set -e",
            "umask 077",
            f"mkdir -p {run}",
            f"chmod 700 {shell_path(paths.base)}",
            f"test ! -e {run}/pid || {{ echo {run}' exists: use a new --run-name' >&2; exit 3; }}",
            *writes,
            f": > {run}/log",
            f"setsid sh {run}/run.sh </dev/null >/dev/null 2>&1 &",
            "echo $!",
        ]
    )


_STATE_FILES = ("exit", "started", "ended", "stopped")


def _read_state(run: str) -> str:
    """Shell that sets $exit $started $ended $stopped from the run's files (``-`` if missing),
    with builtins only."""
    reads = "; ".join(f'{n}=-; read {n} < "$r"/{n} 2>/dev/null' for n in _STATE_FILES)
    return f"r={run}; {reads}"


def watch_command(paths: Paths, offset: int) -> str:
    """Streams the host's log from byte ``offset`` until the exit file appears; then says on
    stderr ``end EXIT STARTED ENDED STOPPED SIZE`` (SIZE: the log's final length in bytes)."""
    run = shell_path(paths.run)
    return (
        f"tail -c +{offset + 1} -f -s 0.2 {run}/log 2>/dev/null & t=$!; "
        f"while [ ! -e {run}/exit ]; do sleep 0.2; kill -0 $t 2>/dev/null || exit 3; "
        # Our parent (sshd's session, or the local runner) gone: nobody reads us any more.
        "[ ! -d /proc/$$ ] || [ -d /proc/$PPID ] || { kill $t 2>/dev/null; exit 4; }; done; "
        f"kill $t 2>/dev/null; wait $t 2>/dev/null; {_read_state(run)}; "
        'set -- $(wc -c < "$r"/log); echo "end $exit $started $ended $stopped $1" >&2; exit 0'
    )


def finish_command(paths: Paths, offset: int) -> str:
    """First line: exit code, start, end, stop signal (``-`` if missing); then the log."""
    return (
        f'{_read_state(shell_path(paths.run))}; test -d "$r" || {{ echo missing; exit 0; }}; '
        f'echo "$exit $started $ended $stopped"; tail -c +{offset + 1} "$r"/log'
    )


def status_command(paths: Paths) -> str:
    """One line ``exit started ended stopped pid alive size``, then the log's last line."""
    run = shell_path(paths.run)
    fields = " ".join(
        f'"$(cat {run}/{n} 2>/dev/null || echo -)"'
        for n in ("exit", "started", "ended", "stopped", "pid")
    )
    return (
        f"test -d {run} || {{ echo missing; exit 0; }}; "
        f"pg=$(cat {run}/pid 2>/dev/null); alive=no; "
        'test -n "$pg" && kill -0 -"$pg" 2>/dev/null && alive=yes; '
        f'printf \'%s %s %s %s %s %s %s\\n\' {fields} "$alive" "$(wc -c < {run}/log)"; '
        f"tail -n 1 {run}/log"
    )


def kill_command(paths: Paths, signal: str, grace: float) -> str:
    """Signals the run's process group, KILLs it after ``grace`` s; records 128+9 if it had to."""
    run = shell_path(paths.run)
    ticks = max(1, int(grace * 10))
    sig = shlex.quote(signal)
    return (
        f'umask 077; r={run}; test -e "$r"/exit && {{ echo finished; exit 0; }}; '
        'i=0; while [ ! -s "$r"/pid ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; '
        'pg=; read pg < "$r"/pid 2>/dev/null; test -n "$pg" || { echo nopid; exit 0; }; '
        f'echo {sig} > "$r"/stopped; kill -{sig} -"$pg" 2>/dev/null; i=0; '
        f'while [ ! -e "$r"/exit ] && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done; '
        'test -e "$r"/exit && { echo stopped; exit 0; }; '
        'echo KILL > "$r"/stopped; kill -KILL -"$pg" 2>/dev/null; sleep 0.2; '
        'test -e "$r"/exit || { date +%s.%N > "$r"/ended; echo 137 > "$r"/exit.tmp; '
        'mv -f "$r"/exit.tmp "$r"/exit; }; echo killed'
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
