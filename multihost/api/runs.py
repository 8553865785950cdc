"""The Python API: what the CLI does, callable from a notebook or a script.

Every blocking function works both in a plain script and inside a running event loop
(Jupyter): there the work runs on a private event loop in a worker thread
(``multihost.bridge``). Keywords are the CLI's settings (``multihost.planner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from multihost.api.keywords import (
    OnOutput,
    Stream,
    check_options,
    events_of,
    on_stderr,
    output_events,
    planned,
    wants_pod,
)
from multihost.api.keywords import plan_run as plan_run
from multihost.bridge import blocking, ctrl_c
from multihost.core import Attach, Run, Stop
from multihost.defaults import DEFAULTS
from multihost.errors import UsageError
from multihost.events import Event
from multihost.model import Fleet
from multihost.options import default_log_dir
from multihost.planner import DryRun, Plan, dry_run
from multihost.results.records import HostResult, RunResult
from multihost.runs.past import (
    find_run,
    host_statuses,
    mark_states,
    options_from_record,
    sync_logs,
)
from multihost.sources import FleetSpec, resolve

if TYPE_CHECKING:
    from multihost.pods.ops import Around
    from multihost.results.records import PullResult


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
    spec = FleetSpec(
        hosts=hosts, local=local, prefix=prefix, project=project, zone=zone, ip=ip, user=user
    )
    return resolve(spec).fleet


@overload
async def run_async(command: str, *, dry_run: Literal[True], **options: Any) -> DryRun: ...
@overload
async def run_async(
    command: str, *, dry_run: Literal[False] = ..., **options: Any
) -> RunResult: ...
async def run_async(command: str, **options: Any) -> RunResult | DryRun:
    """Run ``command`` on every host at once; returns every host's result (never raises for
    one). Keywords: see :func:`run`."""
    check_options("run_async", options)
    p = await asyncio.to_thread(plan_run, command, options, "run_async")  # may ask gcloud
    if options.get("dry_run"):
        return await asyncio.to_thread(dry_run, p)
    events = events_of(options, p.fleet.hosts[0].process_id)
    return await Run(p.fleet, p.job, p.options, events).execute()


@overload
def run(command: str, *, dry_run: Literal[True], **options: Any) -> DryRun: ...
@overload
def run(command: str, *, dry_run: Literal[False] = ..., **options: Any) -> RunResult: ...
def run(command: str, **options: Any) -> RunResult | DryRun:
    """Run ``command`` on every host at once and wait; works inside Jupyter too.

    The fleet: ``hosts=`` (``"h0,h1"``, an inventory path or a Fleet), ``local=N`` or
    ``prefix=`` (with ``project=``, ``zone=``, ``ip=``); ``user=``, ``ssh_config=``. The job:
    ``env=``, ``run_name=``, ``script_dir=``, ``stage_via=`` ("auto", "direct", "peer",
    "gs://BUCKET"). Output: ``stream=`` ("all", "host0", "none")
    and ``on_output=(host_name, line)``. Any :class:`multihost.RunOptions` field (``timeout=``,
    ``fail_fast=``, ``log_dir=``, ``detach=``, ...). ``profile=`` layers the config files
    under the keywords (see :func:`plan_run`). ``dry_run=True``: nothing runs anywhere; the
    value is the :class:`DryRun` (each host's environment and exact command, what
    ``run --dry-run`` prints). A pod around the run, as ``run --prefix NAME --up --down``:
    ``up=True`` makes pod ``prefix`` first when missing (``tpu_type=``, ``runtime_version=``,
    ``zones=``... or the profile's), ``down=True`` deletes it when the run ends however it
    ends, its cost said (``say=``, default stderr); ``autodown=`` arms it. An unknown keyword
    is a TypeError.
    """
    check_options("run", options)  # here, so that a bad keyword fails at once
    result = execute({**options, "cmd": command}, _Called(options))
    assert result is not None  # run()'s dry run is a DryRun
    return result


class RunView(Protocol):
    """Who a run is for, and how it is shown and stopped: ``run()``'s caller (its lines
    printed or handed to ``on_output=``, Ctrl-C stops every host) or ``multihost run`` (a live
    status line, SIGTERM and SIGHUP too, the tables at the end)."""

    def say(self, text: str) -> None:
        """What the pod's life around the run tells."""

    @property
    def progress(self) -> Callable[[str], None] | None:
        """Where a ``--wait`` for the fleet says how it goes (None: not said)."""

    def planned(self, plan: Plan) -> None:
        """The run is planned (its fleet known): what the source warned of and first contact
        did, said."""

    def event(self, event: Event) -> None:
        """One of the run's events."""

    def execute(self, run: Run) -> RunResult:
        """The run to its end, under this view's interrupt policy."""

    def dry(self, plan: Plan) -> DryRun | None:
        """A dry run: the plan as data, or shown."""

    def finished(self, result: RunResult) -> None:
        """The run has ended, and the work after it (pulls, traces, TPU logs) with it."""


def execute(
    settings: Mapping[str, Any], view: RunView, *, config: Mapping[str, Any] | None = None
) -> RunResult | DryRun | None:
    """The one way a run goes, for ``run()`` and ``multihost run``: a pod's life around it
    when its settings ask for one (``up=``, ``down=``...; ``config``: what a profile says of
    a pod), ``--payload``'s command, the plan, then its dry run or the run to its end, each
    step told to ``view``. Returns the result (a dry run's: what ``view.dry`` gives)."""
    given = with_payload(settings, config)
    pod: contextlib.AbstractContextManager[Around | None] = contextlib.nullcontext()
    if wants_pod(given):  # the pod's modules only then: a plain run's start stays light
        from multihost.api.pods import around

        pod = around(given, view.say, config=config)
    with pod as box:
        p = planned(given["cmd"], {"progress": view.progress, **_given(given)})
        view.planned(p)
        if given.get("dry_run"):
            return view.dry(p)
        result = view.execute(Run(p.fleet, p.job, p.options, view.event))
        if box is not None:
            box.ending = f"exit {result.exit_code}"
        view.finished(result)
    return result


def _given(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if v is not None}


def with_payload(settings: Mapping[str, Any], config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's settings, with ``--payload NAME [-- ARGS]`` (the command line's): the
    installed payloads are the code to stage and ``PYTHON NAME.py ARGS`` the command (PYTHON:
    ``python``, else this one with ``local``, else python3)."""
    payload = settings.get("payload")
    if payload is None:
        if settings.get("args"):
            raise UsageError(
                f"unexpected arguments {shlex.join(settings['args'])}: only --payload "
                "takes arguments after --"
            )
        return dict(settings)
    from multihost.staging.bundled import payload_command, payloads_dir

    configured = (config or {}).get("script_dir")
    if Path(settings.get("script_dir") or ".") not in (Path("."), configured):
        raise UsageError(
            "--payload stages the payloads that ship with multihost: leave out "
            "--script-dir, or run your own code with --cmd"
        )
    local = settings.get("local") is not None
    python = settings.get("python") or (sys.executable if local else "python3")
    return {
        **settings,
        "script_dir": payloads_dir(),
        "jax_job": f"--payload {payload}",
        "cmd": payload_command(payload, settings.get("args") or [], python),
    }


@dataclass
class _Called:
    """``run()``'s view: its keywords' ``stream=``, ``on_output=``, ``on_event=`` and
    ``say=``; Ctrl-C stops every host and ``run`` returns the result."""

    options: Mapping[str, Any]
    events: Callable[[Event], None] | None = None
    say: Callable[[str], None] = on_stderr

    def __post_init__(self) -> None:
        self.say = self.options.get("say") or on_stderr

    progress = None  # progress= is a keyword of its own, handed to the plan as given

    def planned(self, plan: Plan) -> None:
        self.events = events_of(self.options, plan.fleet.hosts[0].process_id)

    def event(self, event: Event) -> None:
        if self.events is not None:
            self.events(event)

    def execute(self, run: Run) -> RunResult:
        return blocking(run.execute, ctrl_c(run.interrupt))

    def dry(self, plan: Plan) -> DryRun:
        return dry_run(plan)

    def finished(self, result: RunResult) -> None:
        pass  # the result is the value


def find_record(run_name: str, log_dir: str | Path | None) -> tuple[Path, Path, Any]:
    """The run's log dir, its folder and its record (``log_dir``: default, the default one)."""
    logs = Path(log_dir).expanduser() if log_dir is not None else default_log_dir()
    run_dir, record = find_run(logs, run_name)
    return logs, run_dir, record


def status(
    run_name: str, *, log_dir: str | Path | None = None, refresh: bool | None = None
) -> list[HostResult]:
    """Every host's outcome so far: asked of the hosts while the run is running (or
    ``refresh=True``: then each also has ``log_bytes`` and ``log_mtime``), else from its
    run.json. A host that cannot be asked keeps its recorded outcome, with ``error`` saying
    why (after the error it had, if any)."""
    logs, run_dir, record = find_record(run_name, log_dir)
    if not (refresh or (refresh is None and record.state == "running")):
        return list(record.hosts)
    ssh = options_from_record(record, logs).ssh
    statuses = blocking(lambda: host_statuses(record, ssh))
    mark_states(run_dir, record, statuses)
    out = []
    for h, o in zip(record.hosts, statuses, strict=True):
        if o.value is not None:
            out.append(o.value)
        else:
            why = o.error.message if o.error else "?"
            out.append(replace(h, error=f"{h.error}; {why}" if h.error else why))
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
    logs, _, record = find_record(run_name, log_dir)
    options = options_from_record(record, logs, reconnect_timeout=reconnect_timeout)
    first = record.hosts[0].host.process_id  # of a run on some hosts (workers=): its first
    runner = Attach(record, options, output_events(stream, on_output, None, first))
    return blocking(runner.execute, ctrl_c(runner.interrupt))


def kill(
    run_name: str,
    *,
    signal: str = "TERM",
    grace: float | None = None,
    log_dir: str | Path | None = None,
) -> RunResult:
    """Send ``signal`` to every host's process group, KILL after ``grace`` s; wait for each."""
    logs, _, record = find_record(run_name, log_dir)
    options = options_from_record(record, logs, grace=grace, reconnect_timeout=0.0)
    events = output_events("none", None, None)
    return blocking(lambda: Stop(record, options, events, signal=signal).execute())


def pull_logs(run_name: str, *, log_dir: str | Path | None = None) -> dict[str, Path]:
    """Bring each host's local log up to date (what ``multihost logs RUN`` does); returns the
    local log of every host by name. A host that cannot be reached is said on stderr."""
    logs, run_dir, record = find_record(run_name, log_dir)
    ssh = options_from_record(record, logs).ssh
    for o in blocking(lambda: sync_logs(run_dir, record, ssh)):
        if o.error:
            print(f"multihost: {o.host.name}: {o.error.message}", file=sys.stderr, flush=True)
    logs = record.logs(run_dir)
    return {h.host.name: logs[h.host.process_id] for h in record.hosts}


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
    from multihost.runs.pull import default_dest, pull_run

    logs, _, record = find_record(run_name, log_dir)
    ssh = options_from_record(record, logs).ssh
    patterns = [paths] if isinstance(paths, str) else list(paths)
    dest = Path(to).expanduser() if to is not None else default_dest(run_name)
    return blocking(
        lambda: pull_run(record, patterns, dest, ssh, limit=limit or DEFAULTS.pull_limit)
    )
