"""The pipeline for one run: connect → stage → launch everywhere → stream → stop → results."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from multihost.errors import HostError, HostLost, UsageError
from multihost.fanout import Outcome, map_hosts
from multihost.fleetops import stale_on
from multihost.launch import launch, stop
from multihost.manifest import MANIFEST, host_from_json, run_record, watch_lock, write_json_atomic
from multihost.model import Fleet, Host, HostResult, Job, RunResult, State
from multihost.plan import HostPlan, Paths, plan_hosts
from multihost.runstate import Event, HostEvent, Note, RunOptions, Slot
from multihost.stage import Archive, pack, stage
from multihost.stream import Exit, LogSink, classify, follow
from multihost.transport import Connection, connect

T = TypeVar("T")


class Run:
    """One run of a job on a fleet. ``await Run(...).execute()`` returns a RunResult."""

    def __init__(
        self,
        fleet: Fleet,
        job: Job,
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
        *,
        connections: Mapping[int, Connection] | None = None,
        staged: Archive | None = None,
    ) -> None:
        """``connections`` (by process id) and ``staged`` code let several runs share one
        session (a sweep): those hosts are neither connected nor staged again, nor closed."""
        if not fleet.hosts:
            raise UsageError("no hosts to run on")
        self.fleet, self.job, self.options = fleet, job, options
        self._shared = dict(connections or {})
        self._staged = staged
        self.log_dir = options.log_dir / job.run_name
        self._emit = on_event or (lambda _e: None)
        self._slots = {h.process_id: Slot(h) for h in fleet}
        self._wake = asyncio.Event()
        self._interrupted = False
        self._timed_out = False
        self._first_failure: str | None = None
        self._archive: Archive | None = None
        self._code_hash: str | None = None
        for pid, conn in self._shared.items():
            self._slots[pid].conn = conn
        self._attached = False
        self.stop_signal = "TERM"
        self.observe_only = False  # following only: Ctrl-C leaves the hosts' jobs alone
        self._last_write = 0.0

    # -- public ---------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Ask the run to stop everywhere (Ctrl-C, SIGTERM): it then ends with exit 130."""
        self._interrupted = True
        self._wake.set()

    @classmethod
    def attach(
        cls,
        record: dict[str, Any],
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
    ) -> Run:
        """A Run rebuilt from its ``run.json``: it streams from the local offsets onwards."""
        fleet = Fleet(tuple(host_from_json(h["host"]) for h in record["hosts"]))
        job_data = dict(record["job"])
        job = Job(**{k: v for k, v in job_data.items() if k in Job.__dataclass_fields__})
        run = cls(fleet, job, options, on_event)
        run._attached = True
        run._code_hash = record.get("code_hash") or ""
        run._first_failure = record.get("first_failure")
        for data, slot in zip(record["hosts"], run._slots.values(), strict=True):
            paths = Paths.for_host(slot.host, job, run._code_hash)
            slot.plan = HostPlan(slot.host, paths, dict(data.get("env") or {}), "")
            slot.bytes_sent = int(data.get("bytes_sent") or 0)
            state = State(data.get("state", "running"))
            if state is State.ERROR:  # never launched: nothing to attach to
                slot.state, slot.error = state, data.get("error")
            else:
                slot.sink = LogSink(slot.host, run.log_dir / data["log"], run._emit)
        return run

    async def execute(self) -> RunResult:
        """Run the whole pipeline; never raises for a single host's failure."""
        started = time.monotonic()
        if self._attached:
            with watch_lock(self.log_dir):
                try:
                    await map_hosts(
                        self._reattach_one, list(self.fleet), limit=self.options.connect_limit,
                        timeout=self.options.ssh.connect_timeout + 10, what="connect",
                    )  # fmt: skip
                    await self._watch_all(started)
                finally:
                    await self._close_all()
                return self._finish()
        archive = self._staged
        if archive is None:
            archive = await asyncio.to_thread(pack, self.options.script_dir, self.options.excludes)
        self._archive = archive
        self._code_hash = archive.short
        if (self.log_dir / MANIFEST).exists():
            raise UsageError(f"run {self.job.run_name!r} already exists in {self.options.log_dir}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._note(
            f"run {self.job.run_name}: {len(self.fleet)} host(s), code {archive.short} "
            f"({archive.files} files, {len(archive.data) / 1024:.1f} KiB); "
            f"logs in {self.log_dir}"
        )
        with watch_lock(self.log_dir):
            try:
                if await self._prepare() and not self._interrupted:
                    await self._launch_all()
                    if not self.options.detach:
                        await self._watch_all(started)
            finally:
                await self._close_all()
                for slot in self._slots.values():
                    if slot.sink is not None:
                        slot.sink.close()
            return self._finish()

    # -- phases -----------------------------------------------------------------------------
    async def _prepare(self) -> bool:
        """Connect to and stage code on every host; launch nothing unless all succeed."""
        opts = self.options
        outcomes = await self._phase(
            self._connect_one, opts.connect_limit, opts.ssh.connect_timeout + 10, "connect"
        )
        if all(o.ok for o in outcomes) and self._staged is None:
            outcomes = await self._phase(self._stage_one, None, opts.stage_timeout, "staging")
        if all(o.ok for o in outcomes) and opts.stale != "off" and not self.fleet.local:
            outcomes = await self._phase(self._stale_one, None, 60.0, "stale check")
        failed = [o for o in outcomes if not o.ok]
        for o in failed:
            self._fail(o.host, State.ERROR, o.error.message if o.error else "failed")
        if failed or self._interrupted:
            why = (
                "interrupted"
                if self._interrupted and not failed
                else (f"{failed[0].host.name} could not be prepared")
            )
            for slot in self._slots.values():
                if not slot.state.final:
                    self._set(slot, State.ERROR, f"not started: {why}")
                    slot.error = f"not started: {why}"
            self._write_manifest(force=True)
            return False
        return True

    async def _phase(
        self, fn: Callable[[Host], Awaitable[T]], limit: int | None, timeout: float, what: str
    ) -> list[Outcome[T]]:
        """A fan-out phase that Ctrl-C can cut short."""
        work = asyncio.ensure_future(
            map_hosts(fn, list(self.fleet), limit=limit, timeout=timeout, what=what)
        )
        waiter = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return [Outcome(h) for h in self.fleet]
        return work.result()

    async def _connect_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        if slot.conn is not None:  # shared by the caller's session
            return
        self._set(slot, State.CONNECTING)
        slot.conn = await connect(host, self.options.ssh)

    async def _reattach_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        if slot.sink is not None:
            try:
                slot.conn = await connect(host, self.options.ssh)
            except HostError as exc:  # the watcher keeps trying until the reconnect timeout
                self._set(slot, State.RECONNECTING, exc.message)

    async def _stage_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        assert slot.conn is not None
        assert self._archive is not None
        self._set(slot, State.STAGING)
        paths = Paths.for_host(host, self.job, self._archive.short)
        slot.bytes_sent = await stage(slot.conn, self._archive, paths)

    async def _stale_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        assert slot.conn is not None
        kill = self.options.stale == "kill"
        found = await stale_on(slot.conn, kill=kill, device_glob=self.options.device_glob)
        if found.holders or found.lockfile:
            hint = "" if kill else " (--kill-stale stops them)"
            self._note(f"{host.name}: {found.summary()}{hint}", "warning")

    async def _launch_all(self) -> None:
        assert self._archive is not None
        internal = {
            pid: s.host.internal_address or (s.conn.peer_address if s.conn else s.host.address)
            for pid, s in self._slots.items()
        }
        for plan in plan_hosts(self.fleet, self.job, self._archive.short, internal):
            slot = self._slots[plan.host.process_id]
            slot.plan = plan
            slot.sink = LogSink(plan.host, self.log_dir / f"{plan.host.file_stem}.log", self._emit)
        self._write_manifest(force=True)
        outcomes = await map_hosts(
            self._launch_one, list(self.fleet), timeout=self.options.launch_timeout, what="launch"
        )
        for o in outcomes:
            if o.error:
                self._fail(o.host, State.ERROR, o.error.message)
        self._write_manifest(force=True)

    async def _launch_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        assert slot.conn is not None
        assert slot.plan is not None
        self._set(slot, State.STARTING)
        pgid = await launch(slot.conn, slot.plan)
        self._set(slot, State.RUNNING, f"pgid {pgid}")

    async def _watch_all(self, started: float) -> None:
        watchers = {
            asyncio.ensure_future(self._watch_one(s)): s
            for s in self._slots.values()
            if s.sink is not None and s.state not in (State.ERROR,)
        }
        deadline = None if self.options.timeout is None else started + self.options.timeout
        stopper: asyncio.Future[Any] | None = None
        if self._stop_reason():
            stopper = asyncio.ensure_future(self._stop_all(self._stop_reason() or ""))
        pending = set(watchers)
        while pending:
            self._wake.clear()
            waiter = asyncio.ensure_future(self._wake.wait())
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if stopper is not None and stopper.done():
                left = 10.0  # after stopping, hosts get a last moment to report
            done, _ = await asyncio.wait(
                pending | {waiter}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            pending -= done
            if not done and stopper is not None and stopper.done():
                break
            if deadline is not None and time.monotonic() >= deadline and not self._timed_out:
                self._timed_out = True
                self._note(f"timeout: the run took longer than {self.options.timeout:g} s", "error")
            if self.observe_only and self._interrupted:
                break
            reason = self._stop_reason()
            if reason and stopper is None:
                stopper = asyncio.ensure_future(self._stop_all(reason))
        for task in pending:
            task.cancel()
            if not self.observe_only:
                slot = watchers[task]
                self._fail(slot.host, State.LOST, "did not report an exit after being stopped")
        if stopper is not None:
            await asyncio.gather(stopper, return_exceptions=True)
        await asyncio.gather(*watchers, return_exceptions=True)

    def _stop_reason(self) -> str | None:
        if self.observe_only:
            return None
        if self._interrupted:
            return "interrupted"
        if self._timed_out:
            return f"timeout after {self.options.timeout:g} s"
        if self._first_failure and self.options.fail_fast:
            return self._first_failure
        return None

    async def _watch_one(self, slot: Slot) -> None:
        assert slot.plan is not None
        assert slot.sink is not None
        try:
            slot.exit = await self._follow_reconnecting(slot)
        except HostError as exc:
            self._fail(slot.host, State.LOST, exc.message)
            return
        finally:
            slot.sink.close()
        state = classify(slot.exit)
        if state is State.DONE:
            self._set(slot, state, "exit 0")
        elif state is State.KILLED and slot.exit.stopped_by:
            slot.error = f"stopped by multihost (SIG{slot.exit.stopped_by})"
            self._set(slot, state, slot.error)
        else:
            self._fail(slot.host, state, slot.result().reason)

    async def _follow_reconnecting(self, slot: Slot) -> Exit:
        """Follow the log; when the connection drops, reconnect with backoff and resume at the
        byte offset. Gives up after ``reconnect_timeout`` without a connection."""
        assert slot.plan is not None
        assert slot.sink is not None
        give_up: float | None = None
        delay = 0.5
        while True:
            if slot.conn is None:
                try:
                    slot.conn = await connect(slot.host, self.options.ssh)
                    self._set(slot, State.RUNNING, "connected")
                    give_up, delay = None, 0.5
                except HostError as exc:
                    reason = exc.message
            if slot.conn is not None:
                try:
                    return await follow(slot.conn, slot.plan.paths, slot.sink)
                except HostLost as exc:
                    reason = exc.message
                    with contextlib.suppress(Exception):
                        await slot.conn.close()
                    slot.conn = None
            now = time.monotonic()
            give_up = give_up or now + self.options.reconnect_timeout
            if now >= give_up or self._stop_reason():
                raise HostLost(slot.host, f"{reason}; gave up reconnecting")
            self._set(slot, State.RECONNECTING, reason)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def _stop_all(self, reason: str) -> None:
        """TERM every still-running host's process group, KILL after the grace period."""
        targets = [
            s for s in self._slots.values() if s.sink and s.plan and s.conn and not s.state.final
        ]
        if not targets:
            return
        self._note(f"stopping {len(targets)} host(s): {reason}", "error")

        async def stop_one(host: Host) -> str:
            slot = self._slots[host.process_id]
            assert slot.conn is not None
            assert slot.plan is not None
            self._set(slot, State.STOPPING)
            return await stop(slot.conn, slot.plan.paths, self.stop_signal, self.options.grace)

        await map_hosts(
            stop_one, [s.host for s in targets], timeout=self.options.grace + 20, what="stop"
        )

    @property
    def connections(self) -> dict[int, Connection]:
        """The open connections by process id (after a reconnect, the new ones)."""
        return {pid: s.conn for pid, s in self._slots.items() if s.conn is not None}

    async def _close_all(self) -> None:
        conns = [s.conn for p, s in self._slots.items() if s.conn and p not in self._shared]
        for result in await asyncio.gather(*(c.close() for c in conns), return_exceptions=True):
            del result  # a connection that fails to close cleanly is already gone

    # -- bookkeeping ------------------------------------------------------------------------
    def _set(self, slot: Slot, state: State, detail: str = "") -> None:
        slot.state = state
        self._emit(HostEvent(slot.host, state, detail))
        if state.final:
            self._write_manifest()

    def _fail(self, host: Host, state: State, reason: str) -> None:
        slot = self._slots[host.process_id]
        if state is not State.KILLED or not slot.exit or not slot.exit.stopped_by:
            slot.error = slot.error or (reason if state in (State.ERROR, State.LOST) else None)
        if self._first_failure is None and not (state is State.KILLED and self._stop_reason()):
            self._first_failure = f"{host.name} {reason}"
            self._note(f"{host.name} failed first: {reason}", "error")
        self._set(slot, state, reason)
        self._wake.set()

    def _note(self, text: str, level: str = "info") -> None:
        self._emit(Note(text, level))

    def _finish(self) -> RunResult:
        self._write_manifest(force=True)
        return RunResult(
            run_name=self.job.run_name,
            hosts=tuple(s.result() for s in self._slots.values()),
            log_dir=self.log_dir,
            first_failure=self._first_failure,
            interrupted=self._interrupted,
            timed_out=self._timed_out,
        )

    def _write_manifest(self, force: bool = False) -> None:
        now = time.monotonic()
        if (not force and now - self._last_write < 0.5) or not self.log_dir.is_dir():
            return
        self._last_write = now
        opts = self.options
        write_json_atomic(
            self.log_dir / MANIFEST,
            run_record(
                self.job,
                self._code_hash,
                opts,
                [s.result() for s in self._slots.values()],
                [s.plan for s in self._slots.values()],
                first_failure=self._first_failure,
                interrupted=self._interrupted,
                timed_out=self._timed_out,
            ),
        )


def summarize(results: Iterable[HostResult]) -> dict[State, int]:
    """How many hosts are in each state."""
    counts: dict[State, int] = {}
    for r in results:
        counts[r.state] = counts.get(r.state, 0) + 1
    return counts


def with_run_name(job: Job, name: str) -> Job:
    return replace(job, run_name=name)
