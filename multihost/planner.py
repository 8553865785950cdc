"""One planner: settings in, a frozen :class:`Plan` out — the fleet, the job and the run's
options, by the same rules for the CLI (``vars(args)``), the API (its keywords), sweeps and
``call``.

Settings are named as the schema's flags (``multihost.settings.schema``) by their ``dest``
(and its ``KEYWORDS``, the API's own); a name that is not a setting is ignored, and ``None``
means "not given". Each lands by its name in the one record that reads it: how the fleet is
reached (``fleetops.reach.ReachSettings``), :class:`Settings` (what the planner works out), or
the ``RunOptions`` field of the same name. The rules, once: cloud fleets (``--prefix``) trust
host keys on first use, fall back to the gcloud key and warn about stale accelerator holders;
local workers get a free coordinator port (a given one must be free); the ssh config, the log
dir and the code dir are checked before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from multihost.defaults import DEFAULTS as D
from multihost.defaults import given_fields
from multihost.errors import UsageError
from multihost.fleetops.reach import ReachSettings, reach
from multihost.model import Fleet, Host, Job
from multihost.options import RunOptions, default_run_name
from multihost.remote.commands import JOIN_ENV, check_run_name, job_script, plan_host
from multihost.settings.checks import (
    check_code_dir,
    check_log_dir,
    check_port,
    coordinator_port,
    device_glob,
    env_of,
    log_dir,
    remote_base,
    utf8,
)
from multihost.sources import workers

DERIVED = (
    "script_dir",
    "excludes",
    "log_dir",
    "ssh",
    "stage_via",
    "stage_bucket",
    "secrets",
    "pull",
    "pull_to",
    "stale",
    "device_glob",
    "environment",
)
"""The fields of ``RunOptions`` that :func:`plan` works out; every other field is the setting
of its own name, taken as given (or the field's default)."""


@dataclass(frozen=True)
class Settings:
    """What a plan is made from, by the settings' names (the schema's dests): how to reach the
    fleet, what the planner itself reads, and ``RunOptions``' other fields as given."""

    where: ReachSettings = field(default_factory=ReachSettings)
    options: RunOptions = field(default_factory=RunOptions)  # its fields not DERIVED, as given
    cmd: str = ""
    jax_job: str | None = None  # the command is a JAX job that needs every process: what it is
    run_name: str | None = None
    # the job and its code
    script_dir: str | Path = Path(".")
    exclude: Sequence[str] = ()
    max_stage_bytes: int | None = None  # refuse a bigger code dir before anything starts
    env: Mapping[str, object] | Sequence[str] = ()
    remote_dir: str = D.remote_dir
    coordinator_port: int | None = None
    megascale_port: int = D.megascale_port
    jax_init: bool = True  # the hook joins JAX processes to one job (MULTIHOST_JAX_INIT)
    compile_cache: bool = True  # each host's persistent compile cache (Job.compile_cache)
    compile_cache_max: int = D.compile_cache_max  # its cap, bytes
    # how the run goes
    log_dir: str | Path | None = None
    pull: str | Sequence[str] = ()  # paths or globs copied back from every host after the run
    pull_to: str | Path | None = None  # run --pull's destination: never staged
    stage_via: str = D.stage_via
    stage_bucket: str = D.stage_bucket
    secret: Sequence[str] = ()  # KEY=NAME (run only; values read here, in memory only)
    kill_stale: bool | None = None
    stale: str | None = None  # "off", "warn" or "kill" (default: by kill_stale and the fleet)
    device_glob: str | None = None
    # the locked environment (multihost.envsync)
    no_sync: bool = False
    extra: Sequence[str] = ()
    all_extras: bool = False
    group: Sequence[str] = ()
    no_dev: bool = False
    requirements: str | Path | None = None  # a fully pinned requirements file (no uv.lock)
    lock_dir: str | Path | None = None  # call: the project its staged uv.lock was copied from

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> Settings:
        """The settings in ``given`` (``vars(args)``, keywords); others are not ours."""
        own = {k: v for k, v in given_fields(cls, given).items() if k not in _WHOLE}
        named = {k: v for k, v in given_fields(RunOptions, given).items() if k not in DERIVED}
        return cls(where=ReachSettings.of(given), options=RunOptions(**named), **own)

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every setting a plan is made from, by name: the API's keywords, the CLI's dests."""
        own = {f.name for f in fields(cls)} - set(_WHOLE)
        named = {f.name for f in fields(RunOptions)} - set(DERIVED)
        return frozenset(own | named | ReachSettings.names())


_WHOLE = ("where", "options")  # made from other settings, never given by these names


@dataclass(frozen=True)
class Plan:
    """What one run is: its fleet, its job, its options (and the source's warnings)."""

    fleet: Fleet
    job: Job
    options: RunOptions
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what first contact did (said in the run's header)


def plan(settings: Settings | Mapping[str, Any]) -> Plan:
    """The fleet, the job and the options of a run; bad input is refused before anything
    starts (a UsageError; a SettingError is also a ValueError)."""
    s = settings if isinstance(settings, Settings) else Settings.of(settings)
    check_port("coordinator_port", s.coordinator_port)
    check_port("megascale_port", s.megascale_port)
    command, env = utf8("cmd", s.cmd), env_of(s.env)  # refused before any host is asked
    # a run connects: the user's key accepted first; a dry run only prints what it would do
    where = reach(_located(s.where), add_key=not s.where.dry_run)
    job = Job(
        command=command,
        run_name=check_run_name(s.run_name or default_run_name()),
        env=env | ({} if s.jax_init else {JOIN_ENV: "0"}),
        remote_dir=remote_base(s.remote_dir),
        coordinator_port=coordinator_port(where.fleet, s.coordinator_port),
        megascale_port=s.megascale_port,
        workers=where.subset,
        compile_cache=s.compile_cache_max if s.compile_cache else 0,
    )
    trace = s.options.trace
    jax = s.jax_job or ("--trace" if trace is not None else None)
    if where.subset and jax:
        raise UsageError(workers.refusal(jax, where.subset))
    if trace is not None and trace > D.trace_max:
        raise UsageError(f"--trace {trace:g}: at most {D.trace_max:g} seconds")
    logs = log_dir(s.log_dir)
    check_log_dir(logs)
    script_dir = Path(s.script_dir).expanduser()
    from multihost.envsync.request import request as environment
    from multihost.staging.archive import excluded, outputs_excluded

    pulled = Path("multihost-pull")  # where pulls land by default (made by an earlier pull)
    outputs = [logs, *([pulled] if pulled.is_dir() else [])]
    outputs += [Path(s.pull_to)] if s.pull_to else []
    excludes = tuple(s.exclude)
    if script_dir.is_dir():  # the run's own outputs there are never staged
        excludes += outputs_excluded(script_dir, outputs, job.run_name)
    check_code_dir(script_dir, excludes, s.max_stage_bytes)
    from multihost.staging.via import parse as parse_stage_via

    options = replace(
        s.options,
        script_dir=script_dir,
        excludes=excludes,
        log_dir=logs,
        ssh=where.ssh,
        stage_via=str(parse_stage_via(s.stage_via)),
        stage_bucket=str(parse_stage_via(s.stage_bucket)) if s.stage_bucket else "",
        secrets=_secrets(s, job),
        pull=(s.pull,) if isinstance(s.pull, str) else tuple(s.pull),
        pull_to=None if s.pull_to is None else Path(s.pull_to).expanduser(),
        stale=s.stale or ("kill" if s.kill_stale else ("warn" if where.cloud else "off")),
        device_glob=s.device_glob or device_glob(),
        environment=environment(
            script_dir,
            sync=not s.no_sync,
            extras=tuple(s.extra),
            all_extras=s.all_extras,
            groups=tuple(s.group),
            no_dev=s.no_dev,
            requirements=None if s.requirements is None else Path(s.requirements),
            lock_excluded=excluded("uv.lock", excludes),
            lock_dir=None if s.lock_dir is None else Path(s.lock_dir).expanduser(),
        ),
    )
    return Plan(where.fleet, job, options, where.warnings, where.notes)


def _located(where: ReachSettings) -> ReachSettings:
    """A --prefix pod that multihost made is found where its record says (zone failover may
    have put it anywhere), unless --zone says otherwise (``multihost.pods.records.located``)."""
    spec = where.spec
    if spec.prefix is None:
        return where
    from multihost.pods.records import located

    zone, project = located(spec.prefix, spec.zone, spec.project)
    return replace(where, spec=replace(spec, zone=zone, project=project))


def _secrets(s: Settings, job: Job) -> tuple[tuple[str, str], ...]:
    """``--secret KEY=NAME`` pairs, checked (their values are read only at the launch)."""
    if not s.secret:
        return ()  # multihost.secrets (and the cloud modules under it) only when one is given
    from multihost.secrets import parse_secrets

    pairs = parse_secrets(tuple(s.secret))
    if pairs and s.options.detach:
        raise UsageError("--secret is handed over at the gated start: not with --detach")
    clash = sorted({k for k, _ in pairs} & set(job.env))
    if clash:
        raise UsageError(f"{clash[0]} is given both as --env and as --secret")
    return pairs


# -- a dry run: what the plan would send each host, nothing done anywhere ----------------------
@dataclass(frozen=True)
class HostPreview:
    """One host of a :class:`DryRun`: who it is, its environment and the exact command."""

    host: Host
    run_dir: str  # where its run would live (an unexpanded remote path)
    env: Mapping[str, str]  # every variable its command would see from multihost
    job: str  # job.sh: the directory, the environment and the command, exactly as it would run
    launch: str  # the exact text the runner would send the host to start it

    def lines(self) -> Iterator[str]:
        """What ``run --dry-run`` prints for this host."""
        h = self.host
        yield f"### {h.name} ({h.target}) process {h.process_id}"
        yield from (f"# {k}={v}" for k, v in self.env.items())
        yield f"# job.sh, started detached in {self.run_dir}:"
        yield self.job.rstrip("\n")
        yield "# run on the host (its values assigned first, each quoted):"
        yield self.launch.rstrip("\n")


@dataclass(frozen=True)
class DryRun:
    """What a run would do, and nothing done: ``run --dry-run`` and ``multihost.run(...,
    dry_run=True)``. The code is packed here (to name its hash); no host is connected to, no
    process started, no file written anywhere."""

    run_name: str
    command: str
    code: str  # the code's content hash (as run.json and the hosts' code dirs name it)
    files: int
    bytes: int  # the packed code's size
    hosts: tuple[HostPreview, ...]
    warnings: tuple[str, ...] = ()  # what the fleet's source had to say

    @property
    def header(self) -> str:
        return f"# code {self.code}: {self.files} files, {self.bytes} bytes"

    def lines(self) -> Iterator[str]:
        yield self.header
        for h in self.hosts:
            yield from h.lines()

    def __str__(self) -> str:
        return "\n".join(self.lines()) + "\n"

    def __repr__(self) -> str:
        return f"<DryRun {self.run_name}: {len(self.hosts)} host(s), code {self.code}>"


def preview_hosts(p: Plan, code: str) -> Iterator[HostPreview]:
    """Each host's part of the plan's dry run, one at a time (a huge fleet prints as it goes)."""
    for h in p.fleet:
        hp = plan_host(h, p.fleet, p.job, code)
        env = MappingProxyType(dict(hp.env))  # read-only, as the record is frozen
        yield HostPreview(
            h, hp.paths.run, env, job_script(hp.paths, hp.env, p.job.command), hp.launch
        )


def dry_run(p: Plan) -> DryRun:
    """The plan's :class:`DryRun`: its code packed (nothing leaves this machine)."""
    from multihost.staging.archive import pack

    archive = pack(p.options.script_dir, p.options.excludes)
    return DryRun(
        p.job.run_name,
        p.job.command,
        archive.short,
        archive.files,
        len(archive.data),
        tuple(preview_hosts(p, archive.short)),
        p.warnings,
    )
