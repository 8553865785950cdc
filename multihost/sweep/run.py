"""``multihost sweep``: every point of a grid as a run on the same connections, code staged once.

Points go to groups of hosts as the groups free up: one group (the whole fleet) by default,
one per slice with ``--parallel slice``, or groups of K hosts with ``--parallel hosts:K``;
each group is its own JAX job with its own coordinator and process numbering.
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
from multihost.errors import EnvFailed, UsageError
from multihost.events import Event
from multihost.model import Fleet, Host, Job
from multihost.options import RunOptions
from multihost.recordfile import private_dir, write_atomic
from multihost.runrecord import MANIFEST, dumps
from multihost.runresult import Staging
from multihost.stage import Archive, pack
from multihost.sweep.grid import Point
from multihost.sweep.results import Record, ResultsStore, point_status
from multihost.transport import Connection

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
        attempt, candidate = 1, name
        while (self.options.log_dir / candidate / MANIFEST).exists():
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
        options = replace(self.options, timeout=self.spec.point_timeout, fail_fast=True)
        if options.pull_to is not None:  # pull=: each point's files in a folder of their own
            options = replace(options, pull_to=options.pull_to / PurePath(job.run_name).name)
        conns = {h.process_id: self._conns[_key(h)] for h in group}
        run = Run(group, job, options, self._on_event, connections=conns, staged=archive)
        self._runs.add(run)
        started = time.time()
        try:
            result = await run.execute()
        finally:
            self._runs.discard(run)
        if run.env_failure is not None and self.env_failure is None:
            self.env_failure, failed = run.env_failure, run.env_failure.host
            self.stopped = f"the locked environment failed on {failed.name} ({failed.target})"
        for host in group:  # a host that reconnected during the run keeps its new connection
            if host.process_id in run.connections:
                self._conns[_key(host)] = run.connections[host.process_id]
        if result.interrupted:
            return None  # not recorded: --resume runs it again
        if result.timed_out:
            reason = f"timed out after {self.spec.point_timeout:g} s"
        else:
            reason = f"failed: {result.first_failure}" if result.first_failure else "failed"
        found = result.result()  # process 0's result line, read as the run ended
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
            "groups": [[h.target for h in g] for g in self.groups],
            "code_hash": archive.short,
            "updated": time.time(),
        }
