"""What every mode of a run shares: per-host slots, events to the handler, when to stop,
stopping and closing, the record on disk and the result.

The steps (:mod:`~multihost.core.prepare`, :mod:`~multihost.core.start`,
:mod:`~multihost.core.watch`) act on the hosts through one :class:`Supervisor`; the modes
(:class:`~multihost.core.run.Run`, :class:`~multihost.core.attach.Attach`, ``Stop``) compose
it with the steps they need.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from multihost.core.livehost import LiveHost
from multihost.defaults import DEFAULTS
from multihost.errors import EnvFailed, HostError, UsageError
from multihost.events import Event, HostEvent, Note
from multihost.model import Fleet, Host, Job, State
from multihost.options import RunOptions
from multihost.remote.commands import Paths
from multihost.results.records import HostResult, RunResult, Staging
from multihost.runs.launch import stop
from multihost.runs.record import RunRecord, SSHRecord, write_record
from multihost.transport import Connection
from multihost.transport.fanout import Outcome, map_hosts

T = TypeVar("T")
U = TypeVar("U")


class Supervisor:
    """A run's shared state and its policy; every host's state change goes through here."""

    def __init__(
        self,
        fleet: Fleet,
        job: Job,
        options: RunOptions,
        on_event: Callable[[Event], None] | None,
        *,
        code_hash: str = "",
        observe_only: bool = False,
        stop_signal: str = "TERM",
    ) -> None:
        if not fleet.hosts:
            raise UsageError("no hosts to run on")
        self.fleet, self.job, self.options = fleet, job, options
        self.log_dir = options.log_dir / job.run_name
        self.emit: Callable[[Event], None] = on_event or (lambda _e: None)
        self.slots = {h.process_id: LiveHost(h) for h in fleet}
        self.shared: set[int] = set()  # connections owned by the caller: never closed here
        self.wake = asyncio.Event()  # something changed: a host ended, Ctrl-C, a hang
        self.interrupted = False
        self.timed_out = False
        self.first_failure: str | None = None
        self.code_hash = code_hash
        self.observe_only = observe_only  # following only: Ctrl-C leaves the hosts' jobs alone
        self.stop_signal = stop_signal
        self.env_names: tuple[str, ...] = ()  # --env names already kept out of the record
        self.stacks_wanted = asyncio.Event()
        self.hung: str | None = None
        self.staging: Staging | None = None
        self.env_failure: EnvFailed | None = None  # the locked environment failed: not started
        # the locked environment (multihost.envsync): per-host variables its phase adds to the
        # job (MULTIHOST_ENV), and the bytes it sent from here
        self.extra_env: dict[int, dict[str, str]] = {}
        self.env_bytes = 0
        # attach/stop: the record being followed; what this supervisor does not own (the job,
        # the code and where it came from, the run's settings, staging) is kept from it
        self.recorded: RunRecord | None = None
        self._last_write = 0.0

    def interrupt(self) -> None:
        """Ask the run to stop everywhere (Ctrl-C, SIGTERM): it then ends with exit 130."""
        self.interrupted = True
        self.wake.set()

    @property
    def connections(self) -> dict[int, Connection]:
        """The open connections by process id (after a reconnect, the new ones)."""
        return {pid: s.conn for pid, s in self.slots.items() if s.conn is not None}

    def request_stacks(self) -> None:
        """Take every host's stacks now and report them (a key or signal in the live view)."""
        self.stacks_wanted.set()

    def paths(self, host: Host) -> Paths:
        """Where the run lives on ``host``."""
        return Paths.for_host(host, self.job, self.code_hash)

    def stop_reason(self) -> str | None:
        """Why every host should be stopped now (None: let them run)."""
        if self.observe_only:
            return None
        if self.interrupted:
            return "interrupted"
        if self.hung:
            return self.hung
        if self.timed_out:
            return f"timeout after {self.options.timeout:g} s"
        if self.first_failure and self.options.fail_fast:
            return self.first_failure
        return None

    # -- the hosts' states ----------------------------------------------------------------
    def set_state(self, slot: LiveHost, state: State, detail: str = "") -> None:
        """``slot`` is now in ``state``: tell the handler; a final state is recorded."""
        slot.state = state
        self.emit(HostEvent(slot.host, state, detail))
        if state.final:
            self.write_record()

    def fail(self, host: Host, state: State, reason: str) -> None:
        """``host`` ended badly; the first such host is the run's first failure."""
        slot = self.slots[host.process_id]
        if state is not State.KILLED or not slot.exit or not slot.exit.stopped_by:
            slot.error = slot.error or (reason if state in (State.ERROR, State.LOST) else None)
        if self.first_failure is None and not (state is State.KILLED and self.stop_reason()):
            self.first_failure = f"{host.name} {reason}"
            self.note(f"{host.name} failed first: {reason}", "error")
        self.set_state(slot, state, reason)
        self.wake.set()

    def not_started(self, why: str) -> None:
        """Every host not yet in a final state ends as an error: nothing started, ``why``."""
        for slot in self.slots.values():
            if not slot.state.final:
                slot.error = f"not started: {why}"
                self.set_state(slot, State.ERROR, slot.error)

    def note(self, text: str, level: str = "info") -> None:
        self.emit(Note(text, level))

    # -- fan-out that Ctrl-C can cut short --------------------------------------------------
    async def phase(
        self,
        fn: Callable[[Host], Awaitable[T]],
        limit: int | None,
        timeout: float | None,
        what: str,
    ) -> list[Outcome[T]]:
        """``fn`` on every host (``fanout.map_hosts``), cut short by Ctrl-C."""
        return await self.unless_interrupted(
            map_hosts(fn, list(self.fleet), limit=limit, timeout=timeout, what=what),
            [Outcome(h) for h in self.fleet],
        )

    async def unless_interrupted(self, coro: Awaitable[U], cut: U) -> U:
        """``coro``'s result, or ``cut`` when Ctrl-C comes first."""
        work = asyncio.ensure_future(coro)
        waiter = asyncio.ensure_future(self.wake.wait())
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return cut
        return work.result()

    # -- stopping and closing ---------------------------------------------------------------
    async def stop_all(self, reason: str) -> None:
        """TERM every still-running host's process group, KILL after the grace period."""
        targets = [s for s in self.slots.values() if s.sink and s.paths and not s.state.final]
        targets = [s for s in targets if s.conn is not None]
        if not targets:
            return
        self.note(f"stopping {len(targets)} host(s): {reason}", "error")

        async def stop_one(host: Host) -> str:
            slot = self.slots[host.process_id]
            assert slot.conn is not None
            assert slot.paths is not None
            if not slot.state.final:  # it may have ended since it was picked: keep how
                self.set_state(slot, State.STOPPING)
            return await stop(slot.conn, slot.paths, self.stop_signal, self.options.grace)

        await map_hosts(
            stop_one,
            [s.host for s in targets],
            timeout=self.options.grace + DEFAULTS.stop_slack,
            what="stop",
        )

    async def hold_early(self) -> None:
        """The launches sent while preparing (core.prepare) that the start never took: each
        is told to stop, which removes its run's directory, and read to its end."""
        early = {pid: s.early for pid, s in self.slots.items() if s.early is not None}
        for pid in early:
            self.slots[pid].early = None

        async def hold(host: Host) -> None:
            try:
                ready = await early[host.process_id]
            except (HostError, asyncio.CancelledError):
                return  # never ready: its script ends with its channel
            ready.hold()
            await ready.drain()

        hosts = [h for h in self.fleet if h.process_id in early]
        await map_hosts(hold, hosts, timeout=self.options.launch_timeout, what="launch")

    async def close_all(self) -> None:
        """Hold the launches never started, close the shells never launched on, and every
        connection the run opened."""
        await self.hold_early()
        shells = [s.shell for s in self.slots.values() if s.shell is not None]
        for slot in self.slots.values():
            slot.shell = None
        for done in await asyncio.gather(*(sh.close() for sh in shells), return_exceptions=True):
            del done  # never launched: nothing ran on it
        conns = [s.conn for p, s in self.slots.items() if s.conn and p not in self.shared]
        for result in await asyncio.gather(*(c.close() for c in conns), return_exceptions=True):
            del result  # a connection that fails to close cleanly is already gone

    # -- the record and the result ----------------------------------------------------------
    def finish(self) -> RunResult:
        """The run's result, with its record written one last time."""
        self.write_record(force=True)
        return RunResult(
            run_name=self.job.run_name,
            hosts=tuple(s.result(final=True) for s in self.slots.values()),
            log_dir=self.log_dir,
            first_failure=self.first_failure,
            interrupted=self.interrupted,
            timed_out=self.timed_out,
            staging=self.staging,
            stepped=sum(1 for s in self.slots.values() if s.exit is not None and s.exit.stepped),
        )

    def write_record(self, force: bool = False) -> None:
        """``run.json`` now (at most every ``manifest_interval`` s unless ``force``)."""
        now = time.monotonic()
        if (not force and now - self._last_write < DEFAULTS.manifest_interval) or (
            not self.log_dir.is_dir()
        ):
            return
        self._last_write = now
        opts = self.options
        job, hidden = self.job, self.env_names
        was = self.recorded
        if was is not None:  # following a run: its record says what was kept
            job, hidden = was.job, was.env_names
        elif not opts.record_env and job.env:  # values may be secrets: names only
            job, hidden = replace(job, env={}), (*hidden, *job.env)

        def env(slot: LiveHost) -> dict[str, str] | None:
            if slot.env is None:
                return None
            return {k: v for k, v in slot.env.items() if k not in hidden}

        record = RunRecord(
            run_name=self.job.run_name,
            job=job,
            env_names=hidden,
            hosts=tuple(s.result(env=env(s)) for s in self.slots.values()),
            code_hash=self.code_hash,
            script_dir=str(opts.script_dir.resolve()),
            fail_fast=opts.fail_fast,
            grace=opts.grace,
            ssh=SSHRecord(
                config=tuple(str(p) for p in opts.ssh.config),
                host_keys=opts.ssh.host_keys,
                connect_timeout=opts.ssh.connect_timeout,
            ),
            first_failure=self.first_failure,
            interrupted=self.interrupted,
            timed_out=self.timed_out,
            staging=self.staging,
        )
        if was is not None:
            whole = len(record.hosts) == len(was.hosts)  # else some hosts (--workers): not all
            record = replace(
                record,
                code_hash=was.code_hash,
                script_dir=was.script_dir,
                fail_fast=was.fail_fast,
                grace=was.grace,
                ssh=was.ssh,
                staging=was.staging,
                timed_out=was.timed_out or record.timed_out,
                interrupted=was.interrupted or (record.interrupted and whole),
                first_failure=was.first_failure or record.first_failure,
                hosts=_merged(was.hosts, record.hosts),
            )
        write_record(self.log_dir, record)


def _merged(was: tuple[HostResult, ...], now: tuple[HostResult, ...]) -> tuple[HostResult, ...]:
    """The run's hosts in its record's order: those followed now as they are now, the others
    (not followed: ``--workers``) as they were recorded."""
    mine = {h.host.process_id: h for h in now}
    return tuple(mine.get(h.host.process_id, h) for h in was)
