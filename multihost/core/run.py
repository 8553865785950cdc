"""A new run: pack the code, prepare every host, start the job everywhere, watch it end."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from multihost.core.postrun import after_run, check_pull
from multihost.core.prepare import Prepare
from multihost.core.start import start_all
from multihost.core.steps import HostStep, host_steps
from multihost.core.supervisor import Supervisor
from multihost.core.watch import watch_all
from multihost.errors import EnvFailed, PortBusy, UsageError
from multihost.events import Event
from multihost.model import Fleet, Job
from multihost.options import RunOptions
from multihost.results.records import RunResult
from multihost.runs.files import private_dir
from multihost.runs.record import MANIFEST, watch_lock
from multihost.staging.archive import Archive, pack
from multihost.transport import Connection


class Run:
    """A new run of a job on a fleet. ``await Run(...).execute()`` returns a RunResult."""

    def __init__(
        self,
        fleet: Fleet,
        job: Job,
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
        *,
        connections: Mapping[int, Connection] | None = None,
        staged: Archive | None = None,
        steps: Sequence[HostStep] | None = None,
    ) -> None:
        """``connections`` (by process id) and ``staged`` code let several runs share one
        session (a sweep): those hosts are neither connected nor staged again, nor closed.
        ``steps``: extra per-host preparation steps (default: ``steps.host_steps``)."""
        self.sup = Supervisor(fleet, job, options, on_event)
        self._staged = staged
        self._steps = host_steps(options) if steps is None else tuple(steps)
        self._after: asyncio.Task[RunResult] | None = None  # the work after the run, under way
        for pid, conn in (connections or {}).items():
            self.sup.slots[pid].conn = conn
            self.sup.shared.add(pid)

    @property
    def log_dir(self) -> Path:
        return self.sup.log_dir

    @property
    def connections(self) -> dict[int, Connection]:
        """The open connections by process id (after a reconnect, the new ones)."""
        return self.sup.connections

    @property
    def env_failure(self) -> EnvFailed | None:
        """Why the locked environment failed (the first host's cause), when that is why
        nothing started."""
        return self.sup.env_failure

    def interrupt(self) -> None:
        """Ask the run to stop everywhere (Ctrl-C, SIGTERM): it then ends with exit 130; the
        work after the run (``multihost.core.postrun``), when under way, ends where it is."""
        self.sup.interrupt()
        if self._after is not None:
            self._after.cancel()

    def request_stacks(self) -> None:
        """Take every host's stacks now and report them."""
        self.sup.request_stacks()

    async def execute(self) -> RunResult:
        """Run the whole pipeline, then the work after it (``multihost.core.postrun``: traces,
        a failed run's TPU logs, ``pull=``); never raises for a single host's failure."""
        sup = self.sup
        started = time.monotonic()
        check_pull(sup.options, sup.job.run_name)
        archive = self._staged
        if archive is None:
            archive = await asyncio.to_thread(pack, sup.options.script_dir, sup.options.excludes)
        sup.code_hash = archive.short
        if (sup.log_dir / MANIFEST).exists():
            raise UsageError(f"run {sup.job.run_name!r} already exists in {sup.options.log_dir}")
        made = [p for p in (sup.log_dir, *sup.log_dir.parents) if not p.exists()]
        private_dir(sup.log_dir)
        try:
            result = await self._execute(started, archive)
        except PortBusy as exc:  # nothing started on any host: leave nothing here either
            if made:
                shutil.rmtree(sup.log_dir, ignore_errors=True)
            for p in made[1:]:
                with contextlib.suppress(OSError):
                    p.rmdir()  # only if still empty
            port, h = sup.job.coordinator_port, exc.host
            raise UsageError(
                f"coordinator port {port} is busy on host 0 ({h.name}, {h.target}): "
                f"{exc.message}; pick another with --coordinator-port"
            ) from None
        if sup.options.detach:
            return result
        return await self._after_run(result)

    async def _after_run(self, result: RunResult) -> RunResult:
        """The work after the run; an interrupt ends it with what it had."""
        self._after = asyncio.create_task(after_run(result, self.sup.options, self.sup.emit))
        try:
            return await self._after
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return replace(result, interrupted=True)
        finally:
            self._after = None

    async def _execute(self, started: float, archive: Archive) -> RunResult:
        sup = self.sup
        sup.note(
            f"run {sup.job.run_name}: {len(sup.fleet)} host(s), code {archive.short} "
            f"({archive.files} files, {len(archive.data) / 1024:.1f} KiB); "
            f"logs in {sup.log_dir}"
        )
        prepare = Prepare(sup, archive, staged=self._staged is not None, steps=self._steps)
        with watch_lock(sup.log_dir):
            try:
                if await prepare() and not sup.interrupted:
                    await start_all(sup)
                    if not sup.options.detach:
                        await watch_all(sup, started)
            finally:
                await sup.close_all()
                for slot in sup.slots.values():
                    if slot.sink is not None:
                        slot.sink.close()
            return sup.finish()
