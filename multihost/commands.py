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

from multihost import remote
from multihost.errors import UsageError
from multihost.model import Fleet, Host, Job
from multihost.remote import remote_path, script

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMPLETE = ".multihost-complete"
JOIN_ENV = "MULTIHOST_JAX_INIT"  # "0": the staged hook leaves jax.distributed to the program


def check_run_name(name: str, *, nested: bool = False) -> str:
    """Run names become local and remote paths: letters, digits, ``._-``, not starting with
    ``.`` or ``-``, at most 100 characters; ``/`` between parts only for the names a sweep
    builds itself (``nested``)."""
    from multihost.defaults import DEFAULTS

    limit = DEFAULTS.run_name_max
    if len(name) > limit:
        raise UsageError(f"run name too long ({len(name)} characters, at most {limit})")
    if name == "last":
        raise UsageError("'last' is not a run name: `multihost status last` means the latest run")
    if "/" in name and not nested:
        raise UsageError(f"bad run name {name!r}: no '/' (use letters, digits, '.', '_', '-')")
    if not _RUN_NAME.match(name) or ".." in name.split("/"):
        raise UsageError(
            f"bad run name {name!r}: use letters, digits, '.', '_', '-', starting with a "
            "letter or digit"
        )
    return name


def parse_env(items: list[str]) -> dict[str, str]:
    """``K=V`` strings → mapping; a missing ``=``, a name that is not a shell identifier or a
    value with a NUL or newline is a usage error."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise UsageError(f"--env expects NAME=VALUE with NAME a shell identifier, got {item!r}")
        if "\0" in value or "\n" in value or "\r" in value:
            raise UsageError(f"--env {name}: the value has a NUL or newline character")
        env[name] = value
    return env


shell_path = remote_path  # a remote path as a quoted shell word (``~/`` left to $HOME)


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

    ``internal`` maps process ids to the address other workers use to reach that host. On some
    of the fleet's hosts (``job.workers``) there is no JAX job to wire: each host keeps its
    numbers in the whole fleet and is told which hosts run (``MULTIHOST_WORKERS``).
    """
    if job.workers:
        return {
            "MULTIHOST_RUN": job.run_name,
            "MULTIHOST_SLICE_ID": str(host.slice_id),
            "MULTIHOST_WORKER_ID": str(host.worker_id),
            "MULTIHOST_PROCESS_ID": str(host.process_id),
            "MULTIHOST_WORKERS": job.workers,
        } | dict(job.env)
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
    """``job.sh``: the exact directory, environment and command of this host's run. It is data
    the host keeps (and ``--dry-run`` shows), generated with every value ``shlex.quote``d; the
    scripts that act on hosts are the constant templates in ``multihost.remote``."""
    lines = [
        "# multihost job: this host's exact environment and command",
        f"cd {shell_path(paths.code)} || exit 126",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        # the stack hook (multihost stack) first on the path, the user's PYTHONPATH kept after it
        '[ -z "${MULTIHOST_STACK_DIR:-}" ] || '
        'export PYTHONPATH="$MULTIHOST_STACK_DIR${PYTHONPATH:+:$PYTHONPATH}"',
        # the locked environment (multihost.envsync): its bin first on the path, VIRTUAL_ENV set
        '[ -z "${MULTIHOST_ENV:-}" ] || '
        '{ export VIRTUAL_ENV="$MULTIHOST_ENV"; export PATH="$MULTIHOST_ENV/bin:$PATH"; }',
        f"exec sh -c {shlex.quote(command)}",
    ]
    return "\n".join(lines) + "\n"


TRACE_BODY = "# hook_text: the staged hook gets everything below this line\n"
HOOK_END = 'if __name__ == "sitecustomize":'


@functools.cache
def hook_text() -> str:
    """The hook staged into each run as ONE self-contained ``sitecustomize.py`` (``multihost
    stack``, ``multihost trace``, ``multihost top``): diagnose/hook.py with the bodies of
    diagnose/hooktrace.py (the tracer) and diagnose/hooksteps.py (the step watch) put in
    before its closing ``if __name__ == "sitecustomize":`` block."""
    folder = Path(__file__).parent / "diagnose"
    hook = (folder / "hook.py").read_text()
    parts = [
        (folder / name).read_text().split(TRACE_BODY, 1)[1].lstrip("\n")
        for name in ("hooktrace.py", "hooksteps.py")
    ]
    at = hook.rindex(HOOK_END)
    return hook[:at] + "\n\n".join(parts) + "\n\n" + hook[at:]


def stage_command(paths: Paths, *, claim: bool = False) -> str:
    """Says ``present`` if this code hash is unpacked already; else says ``absent`` and unpacks
    the archive then sent on stdin into the content-addressed directory, atomically. With
    ``claim``, first claims the run's directory as ``claim_command`` does (exit 3: taken)."""
    if claim:
        where = {"b": paths.base, "r": paths.run, "c": paths.code}
        return script(remote.CLAIM_STAGE, paths=where, done=COMPLETE)
    return script(remote.STAGE, paths={"b": paths.base, "c": paths.code}, done=COMPLETE)


def launch_script(
    paths: Paths, env: Mapping[str, str], command: str, *, watch: bool = False
) -> str:
    """Run on the host: writes the run's state files and starts the wrapper detached.

    Prints the process group id once the job has started. With ``watch`` the script first
    says ``ready`` and waits at its gate for ``go`` on stdin (anything else, or stdin's end,
    removes the run's directory and starts nothing); after the process group the same
    channel goes on as ``watch_command(paths, 0)``.
    """
    extra = {"o": 0} if watch else {}
    return script(
        remote.LAUNCH_WATCH if watch else remote.LAUNCH,
        paths={"b": paths.base, "r": paths.run},
        command=command + "\n",
        env="".join(f"{k}={v}\n" for k, v in env.items()),
        job=job_script(paths, env, command),
        wrapper=remote.WRAPPER,
        hook=hook_text(),
        **extra,
    )


def watch_command(paths: Paths, offset: int) -> str:
    """Streams the host's log from byte ``offset`` until the exit file appears, or until the
    job's process group is gone for 3 s without one (``vanished``); then says on stderr
    ``end EXIT STARTED ENDED STOPPED SIZE ESCAPED STEPPED`` (SIZE: the log's final length in
    bytes; STEPPED: the job's processes that logged steps)."""
    return script(remote.WATCH, paths={"r": paths.run}, o=int(offset))


def finish_command(paths: Paths, offset: int) -> str:
    """First line: exit code, start, end, stop signal, escaped (``-`` if missing); then the
    log from ``offset``."""
    return script(remote.FINISH, paths={"r": paths.run}, o=int(offset))


def status_command(paths: Paths) -> str:
    """One line ``exit started ended stopped pid alive size mtime escaped``, then the log's
    last line (mtime: when the log last grew, host clock, epoch seconds)."""
    return script(remote.STATUS, paths={"r": paths.run})


def claim_command(paths: Paths) -> str:
    """Creates the run's directory on the host, refusing a name already there (or a symbolic
    link in its place): every host is claimed before any job starts."""
    return script(remote.CLAIM, paths={"b": paths.base, "r": paths.run})


def release_command(paths: Paths) -> str:
    """Undoes ``claim_command`` when another host refused: removes the empty run directory."""
    return script(remote.RELEASE, paths={"r": paths.run})


def kill_command(paths: Paths, signal: str, grace: float) -> str:
    """Signals the run's process group, KILLs it after ``grace`` s (then records 128+9), and
    stops processes of the run that escaped the group. Says ``finished``, ``nopid``,
    ``vanished``, ``stopped`` or ``killed``, then how many escaped processes it stopped."""
    if not signal.isalnum():
        raise ValueError(f"not a signal name: {signal!r}")
    ticks = max(1, int(grace * 10))
    return script(remote.KILL, paths={"r": paths.run}, sig=signal, ticks=ticks)


def clean_command(paths: Paths, older_than: float) -> str:
    """Removes this finished run's directory, then staged code dirs older than ``older_than``
    s that no remaining run's ``job.sh`` uses; prints each removed code hash."""
    minutes = max(0, int(older_than // 60))
    return script(
        remote.CLEAN,
        paths={"r": paths.run, "b": paths.base},
        age=minutes,
        incoming=max(minutes, 1440),
    )


@dataclass(frozen=True)
class HostPlan:
    """Everything one host is sent for a run, computed before any I/O."""

    host: Host
    paths: Paths
    env: dict[str, str]
    launch: str


def plan_hosts(
    fleet: Fleet,
    job: Job,
    code_hash: str,
    internal: Mapping[int, str] | None = None,
    *,
    watch: bool = False,
    extra: Mapping[int, Mapping[str, str]] | None = None,
) -> list[HostPlan]:
    """Per-host paths, env and launch script for the whole fleet (``watch``: launch scripts
    that go on to stream the log, see ``launch_script``; ``extra``: more variables per
    process id)."""
    return [plan_host(h, fleet, job, code_hash, internal, watch=watch, extra=extra) for h in fleet]


def plan_host(
    host: Host,
    fleet: Fleet,
    job: Job,
    code_hash: str,
    internal: Mapping[int, str] | None = None,
    *,
    watch: bool = False,
    extra: Mapping[int, Mapping[str, str]] | None = None,
) -> HostPlan:
    """One host's plan (see :func:`plan_hosts`); of ``internal`` only the first host's address
    matters (the coordinator's)."""
    paths = Paths.for_host(host, job, code_hash)
    env = host_env(host, fleet, job, internal or {})
    env |= (extra or {}).get(host.process_id, {})  # e.g. MULTIHOST_ENV (multihost.envsync)
    return HostPlan(host, paths, env, launch_script(paths, env, job.command, watch=watch))
