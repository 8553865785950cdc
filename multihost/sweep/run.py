"""``multihost sweep``: every point of a grid as a run on the same connections, code staged once.

Points go to groups of hosts as the groups free up: one group (the whole fleet) by default,
one per slice with ``--parallel slice``, or groups of K hosts with ``--parallel hosts:K``;
each group is its own JAX job with its own coordinator and process numbering.

With ``--warm`` each group's points run in its warm processes (``multihost.warm``): one
Python per host, started once, JAX joined once. A point that needs another layout (its
interpreter, the variables its command sets) gets new ones; so does the point after one
that ended them (``os._exit``, a crash, its timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import PurePath

from multihost.core import Run
from multihost.core.prepare import Prepare
from multihost.core.supervisor import Supervisor
from multihost.errors import EnvFailed, UsageError, WarmError
from multihost.events import Event
from multihost.model import Fleet, Host, Job, State
from multihost.options import RunOptions
from multihost.results.records import HostResult, RunResult, Staging
from multihost.runs.files import private_dir, write_atomic
from multihost.runs.record import dumps
from multihost.staging.archive import Archive, pack
from multihost.sweep.grid import Point
from multihost.sweep.results import Record, ResultsStore, point_status
from multihost.transport import Connection
from multihost.warm.pieces import Layout, Piece, from_command
from multihost.warm.warmset import WarmSet

# A sweep's settings over the caller's: each point is bounded by its point_timeout and fails
# fast (see Sweep._point), a host lost mid-point is retried for the default time.
SWEEP_SETTINGS = {"timeout": None, "fail_fast": True, "reconnect_timeout": None}


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep: the command template, its points, and how to run and judge them."""

    name: str
    template: str
    points: tuple[Point, ...]
    grid_names: tuple[str, ...]
    metric: str = "tflops_per_device"
    higher_is_better: bool = True
    repeat: int = 1
    point_timeout: float | None = None
    resume: bool = False
    parallel: str = "none"
    warm: bool = False  # every point in warm processes (multihost.warm)


# What a warm point cannot do: each is a run's own (its log, its pulls, its trace).
WARM_REFUSES = {"pull": "--pull", "trace": "--trace", "hang_timeout": "--hang-timeout"}


def warm_pieces(spec: SweepSpec, options: RunOptions) -> dict[str, tuple[Layout, Piece]]:
    """Each point's command as a warm layout and piece; a UsageError before anything starts
    when one cannot run warm, or a setting it cannot take is given."""
    for name, flag in WARM_REFUSES.items():
        if getattr(options, name):
            raise UsageError(f"--warm runs the points in warm processes: {flag} is not taken")
    return {
        cmd: from_command(cmd, options.script_dir)
        for cmd in {p.command(spec.template) for p in spec.points}
    }


def host_groups(fleet: Fleet, parallel: str) -> list[Fleet]:
    """The fleet split into independent jobs, each numbered from process 0."""
    if parallel == "none":
        return [fleet]
    if parallel == "slice":
        return [Fleet.from_slices([s]) for s in fleet.slices()]
    kind, _, size = parallel.partition(":")
    if kind != "hosts" or not size.isdigit() or int(size) < 1:
        raise UsageError(f"--parallel expects slice or hosts:K, got {parallel!r}")
    k = int(size)
    if len(fleet) % k:
        raise UsageError(f"--parallel hosts:{k} does not divide the fleet's {len(fleet)} hosts")
    hosts = list(fleet)
    return [Fleet.from_slices([hosts[i : i + k]]) for i in range(0, len(hosts), k)]


def _key(host: Host) -> tuple[str, str | None, int | None, str | None]:
    """A host's identity independent of its numbering in a group."""
    return (host.address, host.user, host.port, host.remote_dir)


class Sweep:
    """Runs a sweep; ``on_record`` hears about each point as it completes, ``on_staged`` how
    the code reached the hosts (once, before the first point).

    A point whose locked environment cannot be built (``EnvFailed``) stops the sweep: the
    points left are recorded as not run, since each would only fail the same way."""

    def __init__(
        self,
        fleet: Fleet,
        spec: SweepSpec,
        base: Job,
        options: RunOptions,
        on_record: Callable[[Record], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_staged: Callable[[Staging], None] | None = None,
    ) -> None:
        self.fleet, self.spec, self.base, self.options = fleet, spec, base, options
        self.dir = options.log_dir / spec.name
        self.store = ResultsStore(self.dir)
        self.groups = host_groups(fleet, spec.parallel)
        self._on_record = on_record or (lambda _r: None)
        self._on_event = on_event
        self._on_staged = on_staged or (lambda _s: None)
        self._conns: dict[tuple[str, str | None, int | None, str | None], Connection] = {}
        self._runs: set[Run] = set()
        self.pieces = warm_pieces(spec, options) if spec.warm else {}
        self._warm: dict[int, WarmSet] = {}  # each group's warm processes (--warm)
        self._sets = 0  # warm sets started, for their names
        self._failed_starts = 0  # warm sets in a row that did not start
        self._session: Supervisor | None = None  # while connecting and staging
        self.interrupted = False
        self.staging: Staging | None = None
        self.env_failure: EnvFailed | None = None  # a point's environment failed: no more start
        self.stopped: str | None = None  # why the points left were not run

    def interrupt(self) -> None:
        """Stop the runs in flight everywhere and start no more points."""
        self.interrupted = True
        if self._session is not None:
            self._session.interrupt()
        for run in list(self._runs):
            run.interrupt()
        for warm in list(self._warm.values()):
            warm.interrupt()

    def todo(self) -> list[tuple[Point, int]]:
        """(point, repeat) still to run; with --resume, those already ok are skipped."""
        done = self.store.completed_ok() if self.spec.resume else set()
        items = [(p, r) for p in self.spec.points for r in range(self.spec.repeat)]
        return [(p, r) for p, r in items if (p.id, r) not in done]

    async def execute(self) -> list[Record]:
        """Stage once, then run every point still to do; returns this session's records."""
        archive = await asyncio.to_thread(pack, self.options.script_dir, self.options.excludes)
        private_dir(self.dir)
        write_atomic(self.dir / "sweep.json", dumps(self._describe(archive)))
        try:
            await self._open(archive)
            queue: asyncio.Queue[tuple[Point, int]] = asyncio.Queue()
            for item in self.todo():
                queue.put_nowait(item)
            records: list[Record] = []
            async with asyncio.TaskGroup() as tg:
                for index, group in enumerate(self.groups):
                    tg.create_task(self._worker(index, group, archive, queue, records))
            while self.stopped is not None and not queue.empty():
                point, repeat = queue.get_nowait()
                self._record(
                    Record(
                        point=point.id,
                        repeat=repeat,
                        values=point.as_dict(),
                        status=f"not run: {self.stopped}",
                        command=point.command(self.spec.template),
                    ),
                    records,
                )
            return records
        finally:
            sets, self._warm = list(self._warm.values()), {}
            await asyncio.gather(*(w.close() for w in sets), return_exceptions=True)
            await asyncio.gather(*(c.close() for c in self._conns.values()), return_exceptions=True)

    async def _open(self, archive: Archive) -> None:
        """One connection per host for the whole sweep, and the code staged on each as a run
        stages it (``--stage-via``: multihost.core.prepare)."""
        session = Supervisor(
            self.fleet, self.base, self.options, self._on_event, code_hash=archive.short
        )
        self._session = session
        try:
            outcomes = await Prepare(session, archive).session()
        finally:
            self._session = None
            for host in self.fleet:
                if (conn := session.slots[host.process_id].conn) is not None:
                    self._conns[_key(host)] = conn
        failed = [o for o in outcomes if o.error]
        if failed:
            raise UsageError(
                "cannot start the sweep: "
                + "; ".join(o.error.args[0] for o in failed[:5] if o.error)
                + (f" (and {len(failed) - 5} more)" if len(failed) > 5 else "")
            )
        self.staging = session.staging
        if self.staging is not None:
            self._on_staged(self.staging)

    async def _worker(
        self,
        index: int,
        group: Fleet,
        archive: Archive,
        queue: asyncio.Queue[tuple[Point, int]],
        records: list[Record],
    ) -> None:
        while not self.interrupted and self.stopped is None:
            try:
                point, repeat = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            record = await self._run_point(index, group, archive, point, repeat)
            if record is not None:
                self._record(record, records)

    def _record(self, record: Record, records: list[Record]) -> None:
        self.store.append(record)
        records.append(record)
        self._on_record(record)

    def _run_name(self, point: Point, repeat: int) -> str:
        name = f"{self.spec.name}/{point.id}" + (f"-r{repeat}" if self.spec.repeat > 1 else "")
        return self._unique(name)

    def _unique(self, name: str) -> str:
        """``name``, or ``name.2``, ... : the first whose folder is not there yet (a run's, a
        warm point's, from an earlier session of a resumed sweep)."""
        attempt, candidate = 1, name
        while (self.options.log_dir / candidate).exists():
            attempt += 1
            candidate = f"{name}.{attempt}"
        return candidate

    async def _run_point(
        self, index: int, group: Fleet, archive: Archive, point: Point, repeat: int
    ) -> Record | None:
        job = replace(
            self.base,
            command=point.command(self.spec.template),
            run_name=self._run_name(point, repeat),
            coordinator_port=self.base.coordinator_port + index,  # groups may share a machine
        )
        started = time.time()
        if self.spec.warm:
            warm = await self._warm_point(index, group, archive, job)
            if warm is None:
                return None  # interrupted: not recorded, --resume runs it again
            result = warm
        else:
            result = await self._cold_point(group, archive, job)
        if result.interrupted:
            return None  # not recorded: --resume runs it again
        if result.timed_out:
            reason = f"timed out after {self.spec.point_timeout:g} s"
        else:
            reason = f"failed: {result.first_failure}" if result.first_failure else "failed"
        found = result.result()  # process 0's result line, read as the point ended
        return Record(
            point=point.id,
            repeat=repeat,
            values=point.as_dict(),
            status=point_status(result.ok, reason, found),
            result=found or {},
            run=job.run_name,
            command=job.command,
            started=started,
            ended=time.time(),
        )

    async def _cold_point(self, group: Fleet, archive: Archive, job: Job) -> RunResult:
        """The point as a run of its own, on the sweep's connections."""
        options = replace(self.options, timeout=self.spec.point_timeout, fail_fast=True)
        if options.pull_to is not None:  # pull=: each point's files in a folder of their own
            options = replace(options, pull_to=options.pull_to / PurePath(job.run_name).name)
        conns = {h.process_id: self._conns[_key(h)] for h in group}
        run = Run(group, job, options, self._on_event, connections=conns, staged=archive)
        self._runs.add(run)
        try:
            result = await run.execute()
        finally:
            self._runs.discard(run)
        self._after(run, group)
        return result

    def _after(self, run: Run, group: Fleet) -> None:
        """What a run (a point's, or warm processes') leaves to the sweep: why its locked
        environment failed (the points left are then not run), its connections."""
        if run.env_failure is not None and self.env_failure is None:
            self.env_failure, failed = run.env_failure, run.env_failure.host
            self.stopped = f"the locked environment failed on {failed.name} ({failed.target})"
        for host in group:  # a host that reconnected during the run keeps its new connection
            if host.process_id in run.connections:
                self._conns[_key(host)] = run.connections[host.process_id]

    async def _warm_point(
        self, index: int, group: Fleet, archive: Archive, job: Job
    ) -> RunResult | None:
        """The point in the group's warm processes, started first if it has none of its
        layout; None when interrupted."""
        layout, piece = self.pieces[job.command]
        warm = self._warm.get(index)
        if warm is not None and warm.layout != layout:
            del self._warm[index]
            await warm.close()
            warm = None
        if warm is None:
            started = await self._start_warm(index, group, archive, job, layout)
            if isinstance(started, str):
                return None if self.interrupted else _not_started(group, job.run_name, started)
            warm = started
        done = await warm.do(piece, job.run_name, self.spec.point_timeout)
        if done.broken is not None:  # the next point starts new ones
            self._warm.pop(index, None)
            await warm.close()
            self._after(warm.run, group)
        return None if done.result.interrupted else done.result

    async def _start_warm(
        self, index: int, group: Fleet, archive: Archive, job: Job, layout: Layout
    ) -> WarmSet | str:
        """The group's warm processes started; else why not (two in a row: the sweep stops)."""
        self._sets += 1
        name = self._unique(f"{self.spec.name}/warm-{self._sets}")
        conns = {h.process_id: self._conns[_key(h)] for h in group}
        warm = WarmSet(
            group,
            job,
            self.options,
            layout,
            name,
            self._on_event,
            connections=conns,
            staged=archive,
        )
        self._warm[index] = warm
        try:
            await warm.start()
        except WarmError as exc:
            self._warm.pop(index, None)
            self._after(warm.run, group)
            self._failed_starts += 1
            if self._failed_starts >= 2 and self.stopped is None and not self.interrupted:
                self.stopped = f"{exc} (twice in a row)"
            return str(exc)
        self._failed_starts = 0
        return warm

    def _describe(self, archive: Archive) -> dict[str, object]:
        spec = self.spec
        return {
            "sweep": spec.name,
            "template": spec.template,
            "grid_names": list(spec.grid_names),
            "points": [p.label for p in spec.points],
            "metric": spec.metric,
            "higher_is_better": spec.higher_is_better,
            "repeat": spec.repeat,
            "parallel": spec.parallel,
            "warm": spec.warm,
            "groups": [[h.target for h in g] for g in self.groups],
            "code_hash": archive.short,
            "updated": time.time(),
        }


def _not_started(group: Fleet, name: str, why: str) -> RunResult:
    """A warm point whose processes did not start: every host an error saying why."""
    hosts = tuple(HostResult(h, State.ERROR, error=f"not started: {why}") for h in group)
    return RunResult(run_name=name, hosts=hosts, first_failure=why)
