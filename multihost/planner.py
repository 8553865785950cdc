"""One planner: settings in, a frozen :class:`Plan` out — the fleet, the job and the run's
options, by the same rules for the CLI (``vars(args)``), the API (its keywords), sweeps and
``call``.

Settings are named as the schema's flags (``multihost.settings.schema``) by their ``dest``;
a name that is not a setting is ignored, and ``None`` means "not given". The rules, once:
cloud fleets (``--prefix``) trust host keys on first use, fall back to the gcloud key and warn
about stale accelerator holders; local workers get a free coordinator port (a given one must
be free); the ssh config, the log dir and the code dir are checked before anything starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.commands import JOIN_ENV, check_run_name
from multihost.defaults import DEFAULTS as D
from multihost.defaults import GOOGLE_KEY
from multihost.errors import SettingError, UsageError
from multihost.model import Fleet, Job
from multihost.options import RunOptions, default_run_name
from multihost.settings.checks import (
    check_code_dir,
    check_log_dir,
    check_port,
    coordinator_port,
    device_glob,
    env_of,
    log_dir,
    ssh_config,
    utf8,
)
from multihost.sources import CloudFound, FleetSpec, Found, resolve, workers
from multihost.transport import HostKeyPolicy, SSHOptions

if TYPE_CHECKING:
    from multihost.fleetops.reachable import Reached


@dataclass(frozen=True)
class Settings:
    """What a plan is made from: the schema's settings (and the API's few more), typed."""

    cmd: str = ""
    jax_job: str | None = None  # the command is a JAX job that needs every process: what it is
    run_name: str | None = None
    # where: exactly one of hosts (a list, an inventory, or a Fleet), local, prefix
    hosts: str | Fleet | None = None
    local: int | None = None
    prefix: str | None = None
    project: str | None = None
    zone: str | None = None
    ip: str = "auto"
    user: str | None = None
    tunnel_through_iap: bool = False
    workers: str | None = None  # some of the hosts (multihost.sources.workers); None: all
    exclude_workers: str | None = None
    iap_per_host: bool = False
    # how to reach the hosts
    ssh: SSHOptions | None = None  # the API's own starting point (default: by the fleet)
    ssh_config: str | Path | None = None
    host_keys: HostKeyPolicy | None = None
    connect_timeout: float | None = None
    connect_limit: int = D.connect_limit
    wait: float | None = None  # s to wait for slices READY and hosts answering (inf: no limit)
    progress: Callable[[str], None] | None = None  # told how a --wait goes, in words
    # the job and its code
    script_dir: str | Path = Path(".")
    exclude: Sequence[str] = ()
    max_stage_bytes: int | None = None  # refuse a bigger code dir before anything starts
    env: Mapping[str, object] | Sequence[str] = ()
    remote_dir: str = D.remote_dir
    coordinator_port: int | None = None
    megascale_port: int = D.megascale_port
    # how the run goes
    log_dir: str | Path | None = None
    pull: str | Sequence[str] = ()  # paths or globs copied back from every host after the run
    pull_to: str | Path | None = None  # run --pull's destination: never staged
    grace: float = D.grace
    timeout: float | None = None
    reconnect_timeout: float = D.reconnect_timeout
    stage_timeout: float = D.stage_timeout
    launch_timeout: float = D.launch_timeout
    stage_via: str = D.stage_via
    stage_bucket: str = D.stage_bucket
    fail_fast: bool = True
    detach: bool = False
    record_env: bool = False
    secret: Sequence[str] = ()  # KEY=NAME (run only; values read here, in memory only)
    hang_timeout: float | None = None
    on_hang: str = "stop"
    trace: float | None = None
    trace_after: float | None = D.trace_after
    jax_init: bool = True  # the hook joins JAX processes to one job (MULTIHOST_JAX_INIT)
    kill_stale: bool | None = None
    stale: str | None = None  # "off", "warn" or "kill" (default: by kill_stale and the fleet)
    device_glob: str | None = None
    # the locked environment (multihost.envsync)
    no_sync: bool = False
    extra: Sequence[str] = ()
    all_extras: bool = False
    group: Sequence[str] = ()
    no_dev: bool = False
    setup: str | None = None
    requirements: str | Path | None = None  # a fully pinned requirements file (no uv.lock)
    host_uv: str = D.host_uv  # a builder without uv: the runner's when it fits, or fetched
    lock_dir: str | Path | None = None  # call: the project its staged uv.lock was copied from
    no_add_key: bool = False  # --prefix: never touch metadata or the OS Login profile
    add_key: bool = False  # first contact wanted: a run, a sweep, `hosts --check` (not a flag)
    dry_run: bool = False  # a plan only, to print: no first contact, no host asked anything

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> Settings:
        """The settings in ``given`` (``vars(args)``, keywords); others are not ours."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in given.items() if k in names and v is not None})


@dataclass(frozen=True)
class Reach:
    """The hosts and how to reach them."""

    fleet: Fleet
    ssh: SSHOptions
    cloud: bool = False
    warnings: tuple[str, ...] = ()  # what the fleet's source had to say
    notes: tuple[str, ...] = ()  # what first contact did (a key added, and where)
    subset: str = ""  # --workers chose some of the hosts: these, folded ("": every host)


@dataclass(frozen=True)
class Plan:
    """What one run is: its fleet, its job, its options (and the source's warnings)."""

    fleet: Fleet
    job: Job
    options: RunOptions
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what first contact did (said in the run's header)


def reach(settings: Settings | Mapping[str, Any]) -> Reach:
    """The fleet (resolved once: a --prefix asks gcloud) and the SSH options for it; for a run
    (``add_key``) on a --prefix fleet, first contact too: the user's key accepted, host keys
    pinned."""
    s = settings if isinstance(settings, Settings) else Settings.of(settings)
    warnings: tuple[str, ...] = ()
    found_cloud: CloudFound | None = None
    started = time.monotonic()
    if s.workers is not None:
        workers.parse(s.workers)  # a bad spec is refused before the fleet is looked for
    if s.exclude_workers is not None:
        workers.parse(s.exclude_workers, "--exclude-workers")
    if isinstance(s.hosts, Fleet):
        if s.local is not None or s.prefix is not None:
            raise ValueError("give exactly one of hosts=, local= or prefix=")
        fleet, cloud = s.hosts, False
    else:
        spec = FleetSpec(
            hosts=s.hosts,
            local=s.local,
            prefix=s.prefix,
            project=s.project,
            zone=s.zone,
            ip=s.ip,
            user=s.user,
            tunnel_through_iap=s.tunnel_through_iap,
            iap_per_host=s.iap_per_host,
        )
        found = resolve(spec) if s.wait is None else _waited(spec, s)
        fleet, cloud, warnings = found.fleet, spec.cloud, found.warnings
        found_cloud = found.cloud
    fleet, subset = workers.select(fleet, s.workers, s.exclude_workers)  # before any contact
    ssh = s.ssh or SSHOptions(
        host_keys="accept-new" if cloud else "strict",
        fallback_identity=GOOGLE_KEY if cloud else None,
    )
    if s.host_keys is not None:
        ssh = replace(ssh, host_keys=s.host_keys)
    if s.connect_timeout is not None:
        ssh = replace(ssh, connect_timeout=s.connect_timeout)
    if s.ssh_config is not None:
        ssh = replace(ssh, config=ssh_config(s.ssh_config))
    if not fleet.local:
        from multihost.transport.sshconfig import include_loop

        loop = include_loop(ssh.config)
        if loop is not None:
            raise SettingError(f"ssh config: an Include loop: {loop}")
    notes: tuple[str, ...] = ()
    if found_cloud is not None and s.add_key:  # first contact (not for a dry run)
        if not s.no_add_key:
            fleet, notes = _first_contact(fleet, ssh, found_cloud, s)
        if ssh.host_keys == "accept-new":
            from multihost.fleetops.contact import pin_host_keys

            ssh, unpublished = pin_host_keys(fleet, ssh, found_cloud)
            if unpublished:
                verb = "publishes" if len(unpublished) == 1 else "publish"
                warnings += (
                    f"{', '.join(unpublished)} {verb} no host keys (guest attributes "
                    "hostkeys/*): trusting their workers' keys on first use",
                )
    if s.wait is not None and not fleet.local and not s.dry_run:
        _wait_reachable(fleet, ssh, s, max(s.wait - (time.monotonic() - started), 0.0))
    return Reach(fleet, ssh, cloud, warnings, notes, subset)


# -- first contact: the user's key accepted, as gcloud does -------------------------------------
def _first_contact(
    fleet: Fleet, ssh: SSHOptions, where: CloudFound, s: Settings
) -> tuple[Fleet, tuple[str, ...]]:
    from multihost.fleetops.contact import first_contact

    def wait(fleet: Fleet, seconds: float) -> Reached:
        return _wait_reachable(fleet, ssh, s, seconds, auth=True)

    say = s.progress or (lambda _: None)
    return first_contact(fleet, ssh, where, user=s.user, say=say, wait=wait, seconds=_key_wait())


def _key_wait() -> float:
    """How long a pushed key may take to be accepted (gcloud: 10 tries, 5 s apart)."""
    return float(os.environ.get("MULTIHOST_KEY_WAIT", D.key_wait))


# -- --wait: slices READY, then hosts answering ----------------------------------------------
def _poll() -> float:
    """Seconds between gcloud polls (each call costs ~1 s of CPU); tests shorten it."""
    return float(os.environ.get("MULTIHOST_WAIT_POLL", D.wait_poll))


def _waited(spec: FleetSpec, s: Settings) -> Found:
    from multihost.sources.queued import wait_until_ready

    say = s.progress or (lambda _: None)
    found: Found = wait_until_ready(lambda: resolve(spec), s.wait or 0.0, say, _poll())
    return found


def _wait_reachable(
    fleet: Fleet, ssh: SSHOptions, s: Settings, seconds: float, *, auth: bool = False
) -> Reached:
    from multihost.bridge import blocking
    from multihost.fleetops.reachable import wait_reachable

    say = s.progress or (lambda _: None)
    reached: Reached = blocking(
        lambda: wait_reachable(
            fleet, ssh, seconds, say, limit=s.connect_limit, poll=min(_poll(), 2.0), auth=auth
        )
    )
    return reached


def plan(settings: Settings | Mapping[str, Any]) -> Plan:
    """The fleet, the job and the options of a run; bad input is refused before anything
    starts (a UsageError; a SettingError is also a ValueError)."""
    s = settings if isinstance(settings, Settings) else Settings.of(settings)
    check_port("coordinator_port", s.coordinator_port)
    check_port("megascale_port", s.megascale_port)
    command, env = utf8("cmd", s.cmd), env_of(s.env)  # refused before any host is asked
    # a run connects: the user's key accepted first; a dry run only prints what it would do
    where = reach(replace(s, add_key=not s.dry_run))
    job = Job(
        command=command,
        run_name=check_run_name(s.run_name or default_run_name()),
        env=env | ({} if s.jax_init else {JOIN_ENV: "0"}),
        remote_dir=s.remote_dir,
        coordinator_port=coordinator_port(where.fleet, s.coordinator_port),
        megascale_port=s.megascale_port,
        workers=where.subset,
    )
    jax = s.jax_job or ("--trace" if s.trace is not None else None)
    if where.subset and jax:
        raise UsageError(workers.refusal(jax, where.subset))
    if s.trace is not None and s.trace > D.trace_max:
        raise UsageError(f"--trace {s.trace:g}: at most {D.trace_max:g} seconds")
    logs = log_dir(s.log_dir)
    check_log_dir(logs)
    script_dir = Path(s.script_dir).expanduser()
    from multihost.envsync.request import request as environment
    from multihost.stage import excluded, outputs_excluded

    pulled = Path("multihost-pull")  # where pulls land by default (made by an earlier pull)
    outputs = [logs, *([pulled] if pulled.is_dir() else [])]
    outputs += [Path(s.pull_to)] if s.pull_to else []
    excludes = tuple(s.exclude)
    if script_dir.is_dir():  # the run's own outputs there are never staged
        excludes += outputs_excluded(script_dir, outputs, job.run_name)
    check_code_dir(script_dir, excludes, s.max_stage_bytes)
    from multihost.stagevia import parse as parse_stage_via

    options = RunOptions(
        script_dir=script_dir,
        excludes=excludes,
        log_dir=logs,
        ssh=where.ssh,
        connect_limit=s.connect_limit,
        fail_fast=s.fail_fast,
        grace=s.grace,
        timeout=s.timeout,
        stage_timeout=s.stage_timeout,
        stage_via=str(parse_stage_via(s.stage_via)),
        stage_bucket=str(parse_stage_via(s.stage_bucket)) if s.stage_bucket else "",
        launch_timeout=s.launch_timeout,
        reconnect_timeout=s.reconnect_timeout,
        detach=s.detach,
        record_env=s.record_env,
        secrets=_secrets(s, job),
        hang_timeout=s.hang_timeout,
        on_hang=s.on_hang,
        trace=s.trace,
        trace_after=s.trace_after,
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
        setup=s.setup,
        host_uv=s.host_uv,
    )
    return Plan(where.fleet, job, options, where.warnings, where.notes)


def _secrets(s: Settings, job: Job) -> tuple[tuple[str, str], ...]:
    """``--secret KEY=NAME`` pairs, checked (their values are read only at the launch)."""
    if not s.secret:
        return ()  # multihost.secrets (and the cloud modules under it) only when one is given
    from multihost.secrets import parse_secrets

    pairs = parse_secrets(tuple(s.secret))
    if pairs and s.detach:
        raise UsageError("--secret is handed over at the gated start: not with --detach")
    clash = sorted({k for k, _ in pairs} & set(job.env))
    if clash:
        raise UsageError(f"{clash[0]} is given both as --env and as --secret")
    return pairs
