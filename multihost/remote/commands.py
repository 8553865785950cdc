"""Pure planning: each host's environment and the exact shell text the runner sends it.

Everything the runner adds to a remote command line is shell-quoted here; the user's
own ``--cmd`` is passed to ``sh -c`` untouched, as one quoted argument.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import re
import shlex
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multihost import remote
from multihost.errors import UsageError
from multihost.model import Fleet, Host, Job
from multihost.remote import carried, remote_path, script, sourced
from multihost.remote.envsync import PROBE
from multihost.remote.staging import python_source

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMPLETE = ".multihost-complete"
JOIN_ENV = "MULTIHOST_JAX_INIT"  # "0": the staged hook leaves jax.distributed to the program
CACHE_ENV = "MULTIHOST_COMPILE_CACHE"  # the host's compile cache dir, for the staged hook
CACHE_MAX_ENV = "MULTIHOST_COMPILE_CACHE_MAX"  # its cap in bytes (the hook removes the oldest)
CACHE_DIR = "compile-cache"  # under the host's base (--remote-dir)


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
        base = host_base(host, job)
        return cls(base, f"{base}/code/{code_hash}", f"{base}/runs/{job.run_name}")

    @property
    def kit(self) -> str:
        """Where the host keeps this multihost's kit (:func:`kit`)."""
        return f"{self.base}/kit/{kit().short}"


def host_base(host: Host, job: Job) -> str:
    """The host's base directory (its own ``remote_dir``, else the job's), unexpanded."""
    return (host.remote_dir or job.remote_dir).rstrip("/") or "/"


def cache_env(host: Host, job: Job) -> dict[str, str]:
    """The compile cache the staged hook gives the host's JAX processes: ``BASE/compile-cache``
    and its cap (none when ``job.compile_cache`` is 0, ``--no-compile-cache``)."""
    if job.compile_cache <= 0:
        return {}
    return {CACHE_ENV: f"{host_base(host, job)}/{CACHE_DIR}", CACHE_MAX_ENV: str(job.compile_cache)}


def host_env(host: Host, fleet: Fleet, job: Job, internal: Mapping[int, str]) -> dict[str, str]:
    """The variables a host's command sees: JAX/Megascale wiring, run identity, the compile
    cache, then ``--env`` (a user's own ``MULTIHOST_COMPILE_CACHE*`` wins).

    ``internal`` maps process ids to the address other workers use to reach that host. On some
    of the fleet's hosts (``job.workers``) there is no JAX job to wire: each host keeps its
    numbers in the whole fleet and is told which hosts run (``MULTIHOST_WORKERS``).
    """
    if job.workers:
        return (
            {
                "MULTIHOST_RUN": job.run_name,
                "MULTIHOST_SLICE_ID": str(host.slice_id),
                "MULTIHOST_WORKER_ID": str(host.worker_id),
                "MULTIHOST_PROCESS_ID": str(host.process_id),
                "MULTIHOST_WORKERS": job.workers,
            }
            | cache_env(host, job)
            | dict(job.env)
        )
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
    return env | cache_env(host, job) | dict(job.env)


def job_script(paths: Paths, env: Mapping[str, str], command: str) -> str:
    """``job.sh``: the exact directory, environment and command of this host's run. It is data
    the host keeps (and ``--dry-run`` shows), generated with every value ``shlex.quote``d; the
    scripts that act on hosts are the constant templates in ``multihost.remote``."""
    lines = [
        "# multihost job: this host's exact environment and command",
        f"cd {shell_path(paths.code)} || exit 126",
        *(f"export {k}={_env_word(k, v)}" for k, v in env.items()),
        # the stack hook (multihost stack) first on the path, the user's PYTHONPATH kept after it
        '[ -z "${MULTIHOST_STACK_DIR:-}" ] || '
        'export PYTHONPATH="$MULTIHOST_STACK_DIR${PYTHONPATH:+:$PYTHONPATH}"',
        # the locked environment (multihost.envsync): its bin first on the path, VIRTUAL_ENV set
        '[ -z "${MULTIHOST_ENV:-}" ] || '
        '{ export VIRTUAL_ENV="$MULTIHOST_ENV"; export PATH="$MULTIHOST_ENV/bin:$PATH"; }',
        # a host without python: the run's bin (python is its python3) last on the path
        '[ ! -d "${MULTIHOST_RUN_DIR:-}/bin" ] || export PATH="$PATH:$MULTIHOST_RUN_DIR/bin"',
        f"exec sh -c {shlex.quote(command)}",
    ]
    return "\n".join(lines) + "\n"


def _env_word(name: str, value: str) -> str:
    """A variable's value as a shell word: the compile cache's ``~/`` left to the host's $HOME
    (a path the job's own scripts may use as it is), every other value as given."""
    return shell_path(value) if name == CACHE_ENV else shlex.quote(value)


TRACE_BODY = "# hook_text: the staged hook gets everything below this line\n"
HOOK_END = 'if __name__ == "sitecustomize":'


HOOK_PARTS = ("hooktrace.py", "hookstart.py", "hooksteps.py")  # tracer; start-up, cache; steps


@functools.cache
def hook_text() -> str:
    """The hook staged into each run as ONE self-contained ``sitecustomize.py`` (``multihost
    stack``, ``multihost trace``, start-up phases, the compile cache,
    ``multihost top``): diagnose/hook.py with the
    bodies of ``HOOK_PARTS`` put in before its closing ``if __name__ == "sitecustomize":``
    block."""
    folder = Path(__file__).parent.parent / "diagnose"  # multihost/diagnose/
    hook = (folder / "hook.py").read_text()
    parts = [(folder / p).read_text().split(TRACE_BODY, 1)[1].strip("\n") for p in HOOK_PARTS]
    at = hook.rindex(HOOK_END)
    return hook[:at] + "".join(f"{part}\n\n\n" for part in parts) + hook[at:]


@dataclass(frozen=True)
class Kit:
    """What every run needs on a host besides its code: the hook (``sitecustomize.py``), the
    wrapper (``run.sh``) and the scripts a run sends each time (claim, stage, launch, the
    environment's check). Staged by content, like the code: a host keeps it in
    ``BASE/kit/SHORT`` and a run sends only a line that sources a script from there. Its
    ``digest`` is the sha256 of its ``SHA256SUMS`` (``sha256sum``'s lines for its files), so a
    host checks every file of it on every run (``remote/kit.sh``): a stale or altered kit is
    sent again."""

    files: tuple[tuple[str, str], ...]  # (name, text), by name
    digest: str
    archive: bytes  # tar.gz of SHA256SUMS and the files

    @property
    def short(self) -> str:
        return self.digest[:16]

    @property
    def offer(self) -> tuple[bytes, bytes]:
        """What a host that lacks it says (``kit``), and what it is then sent: a line with
        the archive's length, then the archive."""
        return b"kit", f"{len(self.archive)}\n".encode() + self.archive


KIT_SCRIPTS = (remote.CLAIM, remote.CLAIM_STAGE, remote.LAUNCH, remote.LAUNCH_WATCH, PROBE)


@functools.cache
def kit() -> Kit:
    """This multihost's kit (see :class:`Kit`); a reproducible archive (no times, no owners)."""
    texts = {
        "run.sh": remote.WRAPPER,
        "sitecustomize.py": hook_text(),
        "env_probe.py": python_source("env_probe"),
        **{f"{s.name}.sh": s.text for s in KIT_SCRIPTS},
    }
    files = tuple(sorted(texts.items()))
    sums = "".join(f"{hashlib.sha256(t.encode()).hexdigest()}  {n}\n" for n, t in files)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, text in (("SHA256SUMS", sums), *files):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return Kit(files, hashlib.sha256(sums.encode()).hexdigest(), packed.getvalue())


def stage_command(paths: Paths, *, claim: bool = False) -> str:
    """Says ``present`` if this code hash is unpacked already; else says ``absent`` and unpacks
    the archive then sent on stdin into the content-addressed directory, atomically. With
    ``claim``, first makes sure the host holds the kit (it may say ``kit`` first: see
    :class:`Kit`), then claims the run's directory as ``claim_command`` does (exit 3: taken)."""
    if claim:
        where = {"b": paths.base, "r": paths.run, "c": paths.code}
        return carried(remote.CLAIM_STAGE, paths.kit, kit().digest, paths=where, done=COMPLETE)
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
    return sourced(
        remote.LAUNCH_WATCH if watch else remote.LAUNCH,
        paths.kit,
        paths={"b": paths.base, "r": paths.run, "k": paths.kit},
        command=command + "\n",
        env="".join(f"{k}={v}\n" for k, v in env.items()),
        job=job_script(paths, env, command),
        **extra,
    )


def watch_command(paths: Paths, offset: int) -> str:
    """Streams the host's log from byte ``offset`` until the exit file appears, or until the
    job's process group is gone for 3 s without one (``vanished``); then says on stderr
    ``end EXIT STARTED ENDED STOPPED SIZE ESCAPED STARTUP STEPPED`` (SIZE: the log's final length
    in bytes; STARTUP: the start-up phases, ``name=seconds,...``; STEPPED: the job's processes
    that logged steps)."""
    return script(remote.WATCH, paths={"r": paths.run}, o=int(offset))


def finish_command(paths: Paths, offset: int) -> str:
    """First line: exit code, start, end, stop signal, escaped, start-up (``-`` if missing);
    then the log from ``offset``."""
    return script(remote.FINISH, paths={"r": paths.run}, o=int(offset))


def status_command(paths: Paths) -> str:
    """One line ``exit started ended stopped pid alive size mtime escaped startup``, then the
    log's last line (mtime: when the log last grew, host clock, epoch seconds)."""
    return script(remote.STATUS, paths={"r": paths.run})


def claim_command(paths: Paths) -> str:
    """Makes sure the host holds the kit (it may say ``kit`` first: see :class:`Kit`), then
    creates the run's directory on the host, refusing a name already there (or a symbolic
    link in its place): every host is claimed before any job starts."""
    where = {"b": paths.base, "r": paths.run}
    return carried(remote.CLAIM, paths.kit, kit().digest, paths=where)


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
        kit=kit().short,
    )


def clean_cache_command(host: Host, job: Job, *, dry: bool = False) -> str:
    """Says the size in KiB of the host's compile cache (``BASE/compile-cache``; 0: none), then
    removes it (``dry``: only says)."""
    return script(
        remote.CLEAN_CACHE,
        paths={"d": f"{host_base(host, job)}/{CACHE_DIR}"},
        mode="dry" if dry else "rm",
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
