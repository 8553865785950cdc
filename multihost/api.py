"""The Python API: what the CLI does, callable from a notebook or a script.

Every blocking function works both in a plain script and inside a running event loop
(Jupyter): there the work runs on a private event loop in a worker thread.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from multihost.defaults import DEFAULTS
from multihost.errors import UsageError
from multihost.fleetops.preflight import free_port
from multihost.model import Fleet, Job, RunResult
from multihost.plan import check_run_name, parse_env
from multihost.runner import Attach, Run, Stop
from multihost.runs import (
    HostStatus,
    find_run,
    host_statuses,
    mark_states,
    options_from_record,
    record_paths,
    sync_logs,
)
from multihost.runstate import Event, Note, RunOptions, default_log_dir, default_run_name
from multihost.sources import FleetSpec, resolve, spec_fields
from multihost.stream import Line
from multihost.transport import SSHOptions

if TYPE_CHECKING:
    from multihost.copyback import PullResult
    from multihost.diagnose.stacks import StackReport

T = TypeVar("T")
Stream = Literal["all", "host0", "none"]
OnOutput = Callable[[str, str], None]
GOOGLE_KEY = "~/.ssh/google_compute_engine"  # as the CLI: the gcloud key for --prefix fleets

_FLEET = spec_fields()  # hosts, local, prefix, project, zone, ip, user
_JOB = ("remote_dir", "coordinator_port", "megascale_port")
_OPTIONS = tuple(f.name for f in fields(RunOptions))
_SSH = ("host_keys", "connect_timeout")  # SSHOptions fields a keyword may set
_OWN = ("env", "run_name", "ssh_config", "on_event", "on_output", "stream", "profile", *_SSH)
ACCEPTED: tuple[str, ...] = tuple(sorted({*_FLEET, *_JOB, *_OPTIONS, *_OWN}))


def make_fleet(
    hosts: str | Fleet | None = None,
    local: int | None = None,
    *,
    prefix: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    ip: str = "auto",
    user: str | None = None,
) -> Fleet:
    """A Fleet from ``hosts`` (a list spec, an inventory path, or a Fleet), ``local`` N, or
    the Cloud TPU slices named ``prefix``."""
    if isinstance(hosts, Fleet):
        return hosts
    if sum(x is not None for x in (hosts, local, prefix)) != 1:
        raise ValueError("give exactly one of hosts=, local= or prefix=")
    spec = FleetSpec(hosts=hosts, local=local, prefix=prefix, project=project, zone=zone, ip=ip,
                     user=user)  # fmt: skip
    return resolve(spec).fleet


def check_options(function: str, given: Mapping[str, object], extra: tuple[str, ...] = ()) -> None:
    """A TypeError naming the first unknown keyword and every accepted one."""
    allowed = {*ACCEPTED, *extra}
    for name in given:
        if name not in allowed:
            raise TypeError(
                f"{function}() got an unexpected keyword argument {name!r}; "
                f"it accepts: {', '.join(sorted(allowed))}"
            )


@dataclass(frozen=True)
class Plan:
    """What one API call runs: the fleet, the job, the options and where events go."""

    fleet: Fleet
    job: Job
    options: RunOptions
    on_event: Callable[[Event], None]


def plan_run(
    command: str, kwargs: Mapping[str, Any], function: str = "run", extra: tuple[str, ...] = ()
) -> Plan:
    """Keyword arguments (checked; ``extra`` are the caller's own) → fleet, job, options: the
    CLI's layering, as values."""
    check_options(function, kwargs, extra)
    kw = dict(kwargs)
    profile = kw.pop("profile", None)
    if profile is not None:
        kw = with_profile(profile, kw)
    hosts = kw.pop("hosts", None)
    spec_kw = {n: kw.pop(n) for n in _FLEET if n in kw and n != "hosts"}
    if isinstance(hosts, Fleet):
        if spec_kw.get("local") is not None or spec_kw.get("prefix") is not None:
            raise ValueError("give exactly one of hosts=, local= or prefix=")
        fleet, cloud = hosts, False
    else:
        spec = FleetSpec(hosts=hosts, **spec_kw)
        fleet, cloud = resolve(spec).fleet, spec.cloud
    run_name = kw.pop("run_name", None)
    if fleet.local and "coordinator_port" not in kw:
        # Local workers share this machine's ports: a free one, so two local runs never meet.
        kw["coordinator_port"] = free_port()
    job = Job(
        command=command,
        run_name=check_run_name(run_name or default_run_name()),
        env={str(k): str(v) for k, v in dict(kw.pop("env", None) or {}).items()},
        **{n: kw.pop(n) for n in _JOB if n in kw},
    )
    ssh_config = kw.pop("ssh_config", None)
    ssh = kw.pop("ssh", None) or SSHOptions(
        host_keys="accept-new" if cloud else "strict",
        fallback_identity=GOOGLE_KEY if cloud else None,
    )
    ssh = replace(ssh, **{n: kw.pop(n) for n in _SSH if n in kw and kw[n] is not None})
    if ssh_config is not None:
        if not Path(ssh_config).expanduser().is_file():
            raise ValueError(f"ssh config {ssh_config} does not exist")
        ssh = replace(ssh, config=(Path(ssh_config).expanduser(),))
    on_event = output_events(kw.pop("stream", "all"), kw.pop("on_output", None),
                             kw.pop("on_event", None))  # fmt: skip
    for name in ("script_dir", "log_dir"):
        if name in kw:
            kw[name] = Path(kw[name]).expanduser()
    if "excludes" in kw:
        kw["excludes"] = tuple(kw["excludes"])
    if "stage_via" in kw:  # "direct", "peer" or "gs://BUCKET[/PREFIX]" (multihost.stagevia)
        from multihost.stagevia import parse

        kw["stage_via"] = str(parse(str(kw["stage_via"])))
    options = RunOptions(ssh=ssh, **{"stale": "warn" if cloud else "off", **kw})
    if not options.script_dir.is_dir():
        raise ValueError(f"script_dir {options.script_dir} is not a directory")
    return Plan(fleet, job, options, on_event)


def with_profile(profile: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` over the config files' values (their top tables, then ``profile``'s), as the
    CLI layers them: keywords win, ``env`` is merged, a given fleet replaces the configured one.
    The files are found from ``script_dir`` (default: the current directory)."""
    from multihost.settings.layers import Resolved
    from multihost.settings.schema import SOURCES

    resolved = Resolved.load(Path(given.get("script_dir") or ".").expanduser(), profile)
    configured: dict[str, Any] = {}
    for key, (value, _) in resolved.values.items():
        if key == "exclude":
            configured["excludes"] = tuple(value)
        elif key == "env":
            configured["env"] = {**parse_env(value), **dict(given.get("env") or {})}
        elif key == "kill-stale":
            if value:
                configured["stale"] = "kill"
        elif key not in ("python", "max-stage-bytes"):  # the CLI's own (--payload, a refusal)
            configured[key.replace("-", "_")] = value
    if any(given.get(k) is not None for k in SOURCES):
        for key in SOURCES:
            configured.pop(key, None)
    merged = {**configured, **given}
    if "env" in configured:
        merged["env"] = configured["env"]  # the given env already merged over it
    return merged


def print_lines(host: str, texts: Sequence[str]) -> None:
    """The default output: ``[s0/w1] line`` on stdout (the notebook cell, the terminal), a
    batch of lines in one write."""
    prefix = f"[{host}] "
    sys.stdout.write(prefix + f"\n{prefix}".join(texts) + "\n")
    sys.stdout.flush()


def output_events(
    stream: str, on_output: OnOutput | None, on_event: Callable[[Event], None] | None
) -> Callable[[Event], None]:
    """Run events → ``on_output(host_name, line)`` for the lines ``stream`` selects ("all",
    "host0" or "none"); errors and warnings about the run go to stderr."""
    if stream not in ("all", "host0", "none"):
        raise ValueError(f"stream must be 'all', 'host0' or 'none', not {stream!r}")

    def handle(event: Event) -> None:
        if on_event is not None:
            on_event(event)
        if isinstance(event, Line):
            if stream == "all" or (stream == "host0" and event.host.process_id == 0):
                if on_output is None:
                    print_lines(event.host.name, event.texts)
                    return
                for text in event.texts:
                    on_output(event.host.name, text)
        elif isinstance(event, Note) and event.level != "info":
            print(f"multihost: {event.text}", file=sys.stderr, flush=True)

    return handle


def blocking(
    make: Callable[[], Coroutine[Any, Any, T]], interrupt: Callable[[], None] | None = None
) -> T:
    """``asyncio.run(make())``; inside a running event loop (Jupyter), the same on a private
    loop in a worker thread, blocking until it is done. ``make`` is only called where the
    coroutine is run, so none is ever left un-awaited.

    With ``interrupt`` (a supervisor's), Ctrl-C (a kernel interrupt) asks it to stop every
    host and the call then returns what it returns; a second Ctrl-C leaves at once.
    """
    box: dict[str, Any] = {}

    async def main() -> T:
        loop = box["loop"] = asyncio.get_running_loop()
        hook = threading.current_thread() is threading.main_thread()
        if hook and interrupt is not None:
            loop.add_signal_handler(signal.SIGINT, _once, loop, interrupt)
        try:
            return await make()
        finally:
            if hook and interrupt is not None:
                loop.remove_signal_handler(signal.SIGINT)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())

    finished = threading.Event()  # not Thread.join: an interrupted join can report the end

    def work() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=work, name="multihost", daemon=True).start()
    stopping = False
    while not finished.is_set():
        try:
            finished.wait()
        except KeyboardInterrupt:
            if stopping or interrupt is None or "loop" not in box:
                raise
            stopping = True
            print("multihost: interrupted: stopping every host (again to leave now)",
                  file=sys.stderr, flush=True)  # fmt: skip
            box["loop"].call_soon_threadsafe(interrupt)
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _once(loop: asyncio.AbstractEventLoop, interrupt: Callable[[], None]) -> None:
    """The first Ctrl-C stops every host; the next one is a KeyboardInterrupt again."""
    print("multihost: interrupted: stopping every host (again to leave now)",
          file=sys.stderr, flush=True)  # fmt: skip
    loop.remove_signal_handler(signal.SIGINT)
    interrupt()


async def run_async(command: str, **options: Any) -> RunResult:
    """Run ``command`` on every host at once; returns every host's result (never raises for
    one). Keywords: see :func:`run`."""
    check_options("run_async", options)
    plan = await asyncio.to_thread(plan_run, command, options, "run_async")  # may ask gcloud
    return await Run(plan.fleet, plan.job, plan.options, plan.on_event).execute()


def run(command: str, **options: Any) -> RunResult:
    """Run ``command`` on every host at once and wait; works inside Jupyter too.

    The fleet: ``hosts=`` (``"h0,h1"``, an inventory path or a Fleet), ``local=N`` or
    ``prefix=`` (with ``project=``, ``zone=``, ``ip=``); ``user=``, ``ssh_config=``. The job:
    ``env=``, ``run_name=``, ``script_dir=``, ``stage_via=`` ("direct", "peer",
    "gs://BUCKET"). Output: ``stream=`` ("all", "host0", "none")
    and ``on_output=(host_name, line)``. Any :class:`RunOptions` field (``timeout=``,
    ``fail_fast=``, ``log_dir=``, ``detach=``, ...). ``profile=`` layers the config files
    under the keywords (see :func:`with_profile`). An unknown keyword is a TypeError.
    """
    plan = plan_run(command, options)  # checked here, so that a bad keyword fails at once
    runner = Run(plan.fleet, plan.job, plan.options, plan.on_event)
    return blocking(runner.execute, runner.interrupt)


def _record(run_name: str, log_dir: str | Path | None) -> tuple[Path, Path, Any]:
    logs = Path(log_dir).expanduser() if log_dir is not None else default_log_dir()
    run_dir, record = find_run(logs, run_name)
    return logs, run_dir, record


def status(
    run_name: str, *, log_dir: str | Path | None = None, refresh: bool | None = None
) -> list[HostStatus]:
    """Every host's state: asked of the hosts while the run is running (or ``refresh=True``),
    else from its run.json. A host that cannot be asked keeps its last recorded state, with
    ``error`` saying why."""
    logs, run_dir, record = _record(run_name, log_dir)
    if not (refresh or (refresh is None and record.state == "running")):
        return [HostStatus.of_record(h) for h in record.hosts]
    ssh = options_from_record(record, logs).ssh
    statuses = blocking(lambda: host_statuses(record, ssh))
    mark_states(run_dir, record, statuses)
    out = []
    for h, o in zip(record.hosts, statuses, strict=True):
        if o.value is not None:
            out.append(o.value)
        else:
            out.append(replace(HostStatus.of_record(h), error=o.error.message if o.error else "?"))
    return out


def attach(
    run_name: str,
    *,
    log_dir: str | Path | None = None,
    stream: Stream = "all",
    on_output: OnOutput | None = None,
    reconnect_timeout: float | None = None,
) -> RunResult:
    """Follow an existing run from where its local logs end, to every host's exit."""
    logs, _, record = _record(run_name, log_dir)
    options = options_from_record(record, logs, reconnect_timeout=reconnect_timeout)
    runner = Attach(record, options, output_events(stream, on_output, None))
    return blocking(runner.execute, runner.interrupt)


def kill(
    run_name: str,
    *,
    signal: str = "TERM",
    grace: float | None = None,
    log_dir: str | Path | None = None,
) -> RunResult:
    """Send ``signal`` to every host's process group, KILL after ``grace`` s; wait for each."""
    logs, _, record = _record(run_name, log_dir)
    options = options_from_record(record, logs, grace=grace, reconnect_timeout=0.0)
    events = output_events("none", None, None)
    return blocking(lambda: Stop(record, options, events, signal=signal).execute())


def pull_logs(run_name: str, *, log_dir: str | Path | None = None) -> dict[str, Path]:
    """Bring each host's local log up to date (what ``multihost logs RUN`` does); returns the
    local log of every host by name. A host that cannot be reached is said on stderr."""
    logs, run_dir, record = _record(run_name, log_dir)
    ssh = options_from_record(record, logs).ssh
    for o in blocking(lambda: sync_logs(run_dir, record, ssh)):
        if o.error:
            print(f"multihost: {o.host.name}: {o.error.message}", file=sys.stderr, flush=True)
    return {h.host.name: run_dir / h.log for h in record.hosts}


def pull(
    run_name: str,
    paths: str | Sequence[str],
    *,
    to: str | Path | None = None,
    log_dir: str | Path | None = None,
    limit: int | None = None,
) -> list[PullResult]:
    """Copy files, directories or globs back from every host of a run (``multihost pull``)
    into ``to`` (default ``./multihost-pull/RUN``), one folder per host; returns each host's
    result (files, bytes, and every problem: no match, unreadable, unreachable)."""
    from multihost.copyback import default_dest, pull_run

    logs, _, record = _record(run_name, log_dir)
    ssh = options_from_record(record, logs).ssh
    patterns = [paths] if isinstance(paths, str) else list(paths)
    dest = Path(to).expanduser() if to is not None else default_dest(run_name)
    return blocking(
        lambda: pull_run(record, patterns, dest, ssh, limit=limit or DEFAULTS.pull_limit)
    )


def stacks(
    run_name: str,
    *,
    log_dir: str | Path | None = None,
    native: bool = False,
    all_threads: bool = False,
) -> StackReport:
    """Every host's Python stacks right now, grouped (``multihost stack`` as data): the groups
    (hosts, frames; odd ones out first), the stragglers, the hosts that could not answer. The
    raw dumps are saved under the run's log dir."""
    from multihost.diagnose.collect import take

    logs, run_dir, record = _record(run_name, log_dir)
    if record.state != "running":
        raise UsageError(f"run {run_name} is {record.state}: there are no stacks to take")
    opts = options_from_record(record, logs)
    dirs = {pid: paths.run for pid, paths in record_paths(record).items()}
    report, _ = blocking(
        lambda: take(record.fleet.hosts, dirs, opts.ssh, run_dir, native=native,
                     all_threads=all_threads, limit=opts.connect_limit)
    )  # fmt: skip
    return report
