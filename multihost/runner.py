"""A run's supervisor, one mode per class over a shared core.

- :class:`Run` launches a new run: connect → stage → launch everywhere → watch → results.
- :class:`Attach` follows an existing run from its record (``attach``; ``observe`` for
  ``logs --follow``, which never stops anything).
- :class:`Stop` stops an existing run on every host and waits for each to report.

Hosts are watched in one ``asyncio.TaskGroup``: an error in a watcher is never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from multihost import stagevia
from multihost.defaults import DEFAULTS
from multihost.diagnose.collect import collect_over, save
from multihost.diagnose.stacks import StackReport, group, summary_lines
from multihost.errors import (
    ConnectError,
    HostError,
    PortBusy,
    RemoteError,
    RunDirGone,
    RunNameTaken,
    UsageError,
)
from multihost.fanout import Outcome, map_hosts
from multihost.fleetops import port_busy, stale_on
from multihost.gather import host_ranges
from multihost.launch import Ready, claim, launch, launch_ready, name_taken, release, stop
from multihost.model import Fleet, Host, Job, RunResult, Staging, State
from multihost.plan import Paths, plan_hosts
from multihost.record import (
    MANIFEST,
    HostRecord,
    RunRecord,
    SSHRecord,
    private_dir,
    watch_lock,
    write_record,
)
from multihost.runstate import Event, HostEvent, Note, RunOptions, Slot, Transfer
from multihost.stage import Archive, pack, stage
from multihost.stream import Follower, LogSink, classify
from multihost.transport import Connection, burst, connect

T = TypeVar("T")
U = TypeVar("U")


class _Supervisor:
    """What every mode shares: per-host slots, events, the stop policy, stopping, the record."""

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
        self._emit = on_event or (lambda _e: None)
        self._slots = {h.process_id: Slot(h) for h in fleet}
        self._shared: set[int] = set()  # connections owned by the caller: never closed here
        self._wake = asyncio.Event()
        self._interrupted = False
        self._timed_out = False
        self._first_failure: str | None = None
        self._code_hash = code_hash
        self._observe_only = observe_only  # following only: Ctrl-C leaves the hosts' jobs alone
        self._stop_signal = stop_signal
        self._last_write = 0.0
        self._env_names: tuple[str, ...] = ()  # --env names already kept out of the record
        self._stacks_wanted = asyncio.Event()
        self._hung: str | None = None
        self._staging: Staging | None = None

    def interrupt(self) -> None:
        """Ask the run to stop everywhere (Ctrl-C, SIGTERM): it then ends with exit 130."""
        self._interrupted = True
        self._wake.set()

    @property
    def connections(self) -> dict[int, Connection]:
        """The open connections by process id (after a reconnect, the new ones)."""
        return {pid: s.conn for pid, s in self._slots.items() if s.conn is not None}

    def request_stacks(self) -> None:
        """Take every host's stacks now and report them (a key or signal in the live view)."""
        self._stacks_wanted.set()

    def _stop_reason(self) -> str | None:
        if self._observe_only:
            return None
        if self._interrupted:
            return "interrupted"
        if self._hung:
            return self._hung
        if self._timed_out:
            return f"timeout after {self.options.timeout:g} s"
        if self._first_failure and self.options.fail_fast:
            return self._first_failure
        return None

    async def _stop_all(self, reason: str) -> None:
        """TERM every still-running host's process group, KILL after the grace period."""
        targets = [s for s in self._slots.values() if s.sink and s.paths and not s.state.final]
        targets = [s for s in targets if s.conn is not None]
        if not targets:
            return
        self._note(f"stopping {len(targets)} host(s): {reason}", "error")

        async def stop_one(host: Host) -> str:
            slot = self._slots[host.process_id]
            assert slot.conn is not None
            assert slot.paths is not None
            self._set(slot, State.STOPPING)
            return await stop(slot.conn, slot.paths, self._stop_signal, self.options.grace)

        await map_hosts(
            stop_one, [s.host for s in targets],
            timeout=self.options.grace + DEFAULTS.stop_slack, what="stop",
        )  # fmt: skip

    async def _close_all(self) -> None:
        shells = [s.shell for s in self._slots.values() if s.shell is not None]
        for slot in self._slots.values():
            slot.shell = None
        for done in await asyncio.gather(*(sh.close() for sh in shells), return_exceptions=True):
            del done  # never launched: nothing ran on it
        conns = [s.conn for p, s in self._slots.items() if s.conn and p not in self._shared]
        for result in await asyncio.gather(*(c.close() for c in conns), return_exceptions=True):
            del result  # a connection that fails to close cleanly is already gone

    # -- bookkeeping ----------------------------------------------------------------------
    def _set(self, slot: Slot, state: State, detail: str = "") -> None:
        slot.state = state
        self._emit(HostEvent(slot.host, state, detail))
        if state.final:
            self._write_record()

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
        self._write_record(force=True)
        return RunResult(
            run_name=self.job.run_name,
            hosts=tuple(s.result() for s in self._slots.values()),
            log_dir=self.log_dir,
            first_failure=self._first_failure,
            interrupted=self._interrupted,
            timed_out=self._timed_out,
            staging=self._staging,
        )

    def _write_record(self, force: bool = False) -> None:
        now = time.monotonic()
        if (not force and now - self._last_write < DEFAULTS.manifest_interval) or (
            not self.log_dir.is_dir()
        ):
            return
        self._last_write = now
        opts = self.options
        job, hidden = self.job, self._env_names
        if not opts.record_env and job.env:  # values may be secrets: names only
            job, hidden = replace(job, env={}), (*hidden, *job.env)

        def env(slot: Slot) -> dict[str, str] | None:
            if slot.env is None:
                return None
            return {k: v for k, v in slot.env.items() if k not in hidden}

        write_record(
            self.log_dir,
            RunRecord(
                run_name=self.job.run_name,
                job=job,
                env_names=hidden,
                hosts=tuple(HostRecord.of(s.result(), env(s)) for s in self._slots.values()),
                code_hash=self._code_hash,
                script_dir=str(opts.script_dir.resolve()),
                fail_fast=opts.fail_fast,
                grace=opts.grace,
                ssh=SSHRecord(
                    config=tuple(str(p) for p in opts.ssh.config),
                    host_keys=opts.ssh.host_keys,
                    connect_timeout=opts.ssh.connect_timeout,
                ),
                first_failure=self._first_failure,
                interrupted=self._interrupted,
                timed_out=self._timed_out,
                staging=self._staging,
            ),
        )


class _Watcher(_Supervisor):
    """Follows every launched host to its exit in one task group, applying the stop policy."""

    async def _watch_all(self, started: float) -> None:
        """Follow every launched host to its exit, applying the stop policy as hosts end."""
        slots = [s for s in self._slots.values() if s.sink is not None and s.state != State.ERROR]
        async with asyncio.TaskGroup() as tg:
            watchers = {tg.create_task(self._watch_one(s)): s for s in slots}
            dog = tg.create_task(self._watchdog())
            await self._police(tg, watchers, started)
            dog.cancel()

    async def _watchdog(self) -> None:
        """Stacks on request (``request_stacks``), and when every live host has been silent
        for ``hang_timeout`` s: take them, name the stragglers, then stop (or only report)."""
        limit = self.options.hang_timeout
        quiet_since_report = 0.0
        while True:
            try:
                async with asyncio.timeout(1.0):
                    await self._stacks_wanted.wait()
            except TimeoutError:
                pass
            live = [s for s in self._slots.values() if s.sink and s.paths and s.conn]
            live = [s for s in live if not s.state.final]
            if self._stacks_wanted.is_set():
                self._stacks_wanted.clear()
                await self._take_stacks(live, "on request")
            if not limit or not live or self._observe_only:
                continue
            last = max(max(s.sink.last_output for s in live if s.sink), quiet_since_report)
            silent = time.monotonic() - last
            if silent < limit:
                continue
            report = await self._take_stacks(live, f"no output from any host for {silent:.0f} s")
            quiet_since_report = time.monotonic()
            if self.options.on_hang == "stop":
                who = host_ranges(report.stragglers) if report.stragglers else "none stands out"
                self._hung = f"hang: no output for {silent:.0f} s (straggler(s): {who})"
                if self._first_failure is None:
                    self._first_failure = self._hung
                self._wake.set()
                return

    async def _take_stacks(self, slots: list[Slot], why: str) -> StackReport:
        conns = {s.host.process_id: s.conn for s in slots if s.conn is not None}
        dirs = {s.host.process_id: s.paths.run for s in slots if s.paths is not None}
        dumps = await collect_over([s.host for s in slots if s.conn is not None], conns, dirs)
        folder = save(dumps, self.log_dir)
        report = group(d.stacks for d in dumps)
        lines = "\n".join(summary_lines(report))
        self._note(f"stacks ({why}), saved in {folder}:\n{lines}", "warning")
        return report

    async def _police(
        self, tg: asyncio.TaskGroup, watchers: Mapping[asyncio.Task[None], Slot], started: float
    ) -> None:
        """Wait for the watchers; start stopping everyone on a failure, timeout or interrupt;
        after the stop, give the hosts a last moment to report, then call the rest lost."""
        deadline = None if self.options.timeout is None else started + self.options.timeout
        stopper: asyncio.Task[None] | None = None
        pending = set(watchers)
        while pending:
            reason = self._stop_reason()
            if reason and stopper is None:
                stopper = tg.create_task(self._stop_all(reason))
            if self._observe_only and self._interrupted:
                break
            self._wake.clear()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if stopper is not None and stopper.done():
                left = DEFAULTS.last_report
            waiter = asyncio.ensure_future(self._wake.wait())
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
        for task in pending:
            task.cancel()
            if not self._observe_only:
                slot = watchers[task]
                self._fail(slot.host, State.LOST, "did not report an exit after being stopped")

    async def _watch_one(self, slot: Slot) -> None:
        assert slot.paths is not None
        assert slot.sink is not None

        def on_state(state: State, detail: str) -> None:
            self._set(slot, state, detail)

        follower = Follower(
            slot.host, slot.paths, slot.sink, self.options.ssh, conn=slot.conn,
            reconnect_timeout=self.options.reconnect_timeout, on_state=on_state,
            give_up=lambda: self._stop_reason() is not None, started=slot.started,
        )  # fmt: skip
        slot.started = None
        try:
            slot.exit = await follower.follow()
        except RunDirGone as exc:  # hook (issue 28): kill finds the run by its marker
            slot.conn = follower.conn
            slot.sink.close()
            await self._run_dir_gone(slot, exc)
            return
        except HostError as exc:
            self._fail(slot.host, State.LOST, exc.message)
            return
        finally:
            slot.conn = follower.conn
            slot.sink.close()
        state = classify(slot.exit)
        if slot.exit.escaped:
            self._note(
                f"{slot.host.name}: stopped {slot.exit.escaped} process(es) that had left the "
                "job's process group (setsid, daemons)", "warning",
            )  # fmt: skip
        if slot.exit.reason:
            slot.error = slot.exit.reason
            self._fail(slot.host, state, slot.exit.reason)
        elif state is State.DONE:
            self._set(slot, state, "exit 0")
        elif state is State.KILLED and slot.exit.stopped_by:
            slot.error = f"stopped by multihost (SIG{slot.exit.stopped_by})"
            self._set(slot, state, slot.error)
        else:
            self._fail(slot.host, state, slot.result().reason)

    async def _run_dir_gone(self, slot: Slot, exc: RunDirGone) -> None:
        """The run's directory was removed under its job. Stopping: the job's processes are
        found by the MULTIHOST_RUN_DIR in their environment and stopped; else it is lost."""
        if self._stop_reason() is None or slot.conn is None or slot.paths is None:
            self._fail(slot.host, State.LOST, f"{exc.message} (multihost kill stops what runs)")
            return
        # the stop under way does the same on this host: whichever comes first finds them
        await stop(slot.conn, slot.paths, self._stop_signal, self.options.grace)
        slot.error = (
            "stopped by multihost: its run directory was gone; its processes were found by "
            "their MULTIHOST_RUN_DIR and stopped"
        )
        self._set(slot, State.KILLED, slot.error)


class Run(_Watcher):
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
    ) -> None:
        """``connections`` (by process id) and ``staged`` code let several runs share one
        session (a sweep): those hosts are neither connected nor staged again, nor closed."""
        super().__init__(fleet, job, options, on_event)
        self._staged = staged
        self._archive: Archive | None = None
        for pid, conn in (connections or {}).items():
            self._slots[pid].conn = conn
            self._shared.add(pid)

    async def execute(self) -> RunResult:
        """Run the whole pipeline; never raises for a single host's failure."""
        started = time.monotonic()
        archive = self._staged
        if archive is None:
            archive = await asyncio.to_thread(pack, self.options.script_dir, self.options.excludes)
        self._archive = archive
        self._code_hash = archive.short
        if (self.log_dir / MANIFEST).exists():
            raise UsageError(f"run {self.job.run_name!r} already exists in {self.options.log_dir}")
        made = [p for p in (self.log_dir, *self.log_dir.parents) if not p.exists()]
        private_dir(self.log_dir)
        try:
            return await self._execute(started, archive)
        except PortBusy as exc:  # nothing started on any host: leave nothing here either
            if made:
                shutil.rmtree(self.log_dir, ignore_errors=True)
            for p in made[1:]:
                with contextlib.suppress(OSError):
                    p.rmdir()  # only if still empty
            port, h = self.job.coordinator_port, exc.host
            raise UsageError(
                f"coordinator port {port} is busy on host 0 ({h.name}, {h.target}): "
                f"{exc.message}; pick another with --coordinator-port"
            ) from None

    async def _execute(self, started: float, archive: Archive) -> RunResult:
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

    async def _prepare(self) -> bool:
        """Connect to and stage code on every host; launch nothing unless all succeed."""
        opts = self.options
        stale = opts.stale != "off" and not self.fleet.local
        direct = stagevia.parse(opts.stage_via).kind == "direct"
        if self._staged is None and direct and not stale:
            outcomes = await self._pipelined()
        else:
            outcomes = await self._phase(
                self._connect_one, opts.connect_limit,
                opts.ssh.connect_timeout + DEFAULTS.connect_slack, "connect",
            )  # fmt: skip
            if all(o.ok for o in outcomes) and self._checks_port:
                outcomes = await self._phase(
                    self._port_free, None, DEFAULTS.command_timeout, "coordinator port check"
                )
            if all(o.ok for o in outcomes) and self._staged is None:
                outcomes = await self._stage_all()
            if all(o.ok for o in outcomes) and stale:
                outcomes = await self._phase(
                    self._stale_one, None, DEFAULTS.stale_timeout, "stale check"
                )
            if all(o.ok for o in outcomes) and not self._interrupted:
                outcomes = await self._claim_all()
        failed = [o for o in outcomes if not o.ok]
        if busy := [o.error for o in failed if isinstance(o.error, PortBusy)]:
            for slot in self._slots.values():
                self._set(slot, State.ERROR, "not started: the coordinator port is busy")
            raise busy[0]
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
            self._write_record(force=True)
            return False
        return True

    async def _pipelined(self) -> list[Outcome[None]]:
        """Each host on its own as soon as it can: connect (at most ``connect_limit``
        handshakes at a time), then claim the run's directory and stage the code on one
        channel. Any failure releases every claim made, so nothing starts anywhere."""
        opts = self.options
        gate = asyncio.Semaphore(opts.connect_limit)
        connect_timeout = opts.ssh.connect_timeout + DEFAULTS.connect_slack

        async def one(host: Host) -> None:
            try:
                async with gate, asyncio.timeout(connect_timeout):
                    await self._connect_one(host)
            except HostError:
                raise  # ConnectTimeout too: it is a TimeoutError that says which limit
            except TimeoutError:
                raise RemoteError(host, f"connect timed out after {connect_timeout:g} s") from None
            try:
                async with asyncio.timeout(opts.stage_timeout):
                    await self._stage_checking_port(host)
                    if not opts.detach:  # the launch then only sends its script
                        slot = self._slots[host.process_id]
                        assert slot.conn is not None
                        slot.shell = await slot.conn.shell()
            except HostError:
                raise
            except TimeoutError:
                why = f"staging timed out after {opts.stage_timeout:g} s"
                raise RemoteError(host, why) from None

        outcomes = await self._phase(one, None, None, "prepare")
        staged = [stagevia.Staged("sent" if s.bytes_sent else "present", s.bytes_sent)
                  for s in self._slots.values()]  # fmt: skip
        sent = sum(s.conn.bytes_out for s in self._slots.values() if s.conn is not None)
        assert self._archive is not None
        self._staging = stagevia.summarize(
            stagevia.parse(opts.stage_via), self._archive, staged, sent, 0
        )
        if all(o.ok for o in outcomes) and not self._interrupted:
            return outcomes
        taken = [o.host for o in outcomes if isinstance(o.error, RunNameTaken)]
        unclaimed = (RunNameTaken, ConnectError)
        claimed = [o.host for o in outcomes if not isinstance(o.error, unclaimed)]
        conns = {pid: s.conn for pid, s in self._slots.items() if s.conn is not None}
        paths = {h.process_id: self._paths(h) for h in self.fleet}
        await release([h for h in claimed if h.process_id in conns], conns, paths,
                      opts.launch_timeout)  # fmt: skip
        if taken:
            for slot in self._slots.values():
                self._set(slot, State.ERROR, "not started: the run name is taken")
            self._write_record(force=True)
            raise name_taken(taken)
        return outcomes

    async def _claim_all(self) -> list[Outcome[None]]:
        """The run's directory on every host before any job starts (see launch.claim)."""
        conns = {pid: s.conn for pid, s in self._slots.items() if s.conn is not None}
        paths = {h.process_id: self._paths(h) for h in self.fleet}
        try:
            return await claim(list(self.fleet), conns, paths, self.options.launch_timeout)
        except UsageError:
            for slot in self._slots.values():
                self._set(slot, State.ERROR, "not started: the run name is taken")
            self._write_record(force=True)
            raise

    def _paths(self, host: Host) -> Paths:
        return Paths.for_host(host, self.job, self._code_hash)

    async def _phase(
        self,
        fn: Callable[[Host], Awaitable[T]],
        limit: int | None,
        timeout: float | None,
        what: str,
    ) -> list[Outcome[T]]:
        """A fan-out phase that Ctrl-C can cut short."""
        return await self._unless_interrupted(
            map_hosts(fn, list(self.fleet), limit=limit, timeout=timeout, what=what),
            [Outcome(h) for h in self.fleet],
        )

    async def _stage_all(self) -> list[Outcome[None]]:
        """The code on every host: from the runner to each, or ``--stage-via`` a seed per
        slice or a bucket (multihost.stagevia); counts what leaves the runner."""
        assert self._archive is not None
        via = stagevia.parse(self.options.stage_via)
        conns = {pid: s.conn for pid, s in self._slots.items() if s.conn is not None}
        before = sum(c.bytes_out for c in conns.values())
        if via.kind == "direct":
            outcomes = await self._phase(
                self._stage_one, None, self.options.stage_timeout, "staging"
            )
            staged = [stagevia.Staged("sent" if s.bytes_sent else "present", s.bytes_sent)
                      for s in self._slots.values()]  # fmt: skip
            uploaded = 0
        else:
            for slot in self._slots.values():
                self._set(slot, State.STAGING)
            paths = {h.process_id: Paths.for_host(h, self.job, self._code_hash) for h in self.fleet}
            results, uploaded = await self._unless_interrupted(
                stagevia.stage_fleet(via, list(self.fleet), conns, self._archive, paths,
                                     timeout=self.options.stage_timeout, note=self._note),
                ([Outcome[stagevia.Staged](h) for h in self.fleet], 0),
            )  # fmt: skip
            staged = [o.value for o in results if o.value is not None]
            for o in results:
                self._slots[o.host.process_id].bytes_sent = o.value.sent if o.value else 0
            outcomes = [Outcome[None](o.host, error=o.error) for o in results]
        sent = sum(c.bytes_out for c in conns.values()) - before + uploaded
        self._staging = stagevia.summarize(via, self._archive, staged, sent, int(uploaded > 0))
        return outcomes

    async def _unless_interrupted(self, coro: Awaitable[U], cut: U) -> U:
        """``coro``'s result, or ``cut`` when Ctrl-C comes first."""
        work = asyncio.ensure_future(coro)
        waiter = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return cut
        return work.result()

    @property
    def _checks_port(self) -> bool:
        """Whether host 0's coordinator port is checked before anything starts (over SSH; a
        ``--local`` run picked a free one; a sweep's runs share a session that checked)."""
        return not self.fleet.local and not self._shared

    async def _port_free(self, host: Host) -> None:
        """Raises PortBusy when ``host`` is host 0 and cannot bind the coordinator port."""
        slot = self._slots[host.process_id]
        if host.process_id != 0 or slot.conn is None:
            return
        port = self.job.coordinator_port
        if why := await port_busy(slot.conn, port):
            raise PortBusy(host, why)

    async def _stage_checking_port(self, host: Host) -> None:
        """Claim and stage; on host 0, check the coordinator port meanwhile on a second
        channel (no round trip of its own before the run)."""
        if host.process_id != 0 or not self._checks_port:
            await self._stage_one(host, claim=True)
            return
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._stage_one(host, claim=True))
                tg.create_task(self._port_free(host))
        except* HostError as group:
            busy = [e for e in group.exceptions if isinstance(e, PortBusy)]
            raise (busy or group.exceptions)[0] from None

    async def _connect_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        if slot.conn is not None:  # shared by the caller's session
            return
        self._set(slot, State.CONNECTING)
        slot.conn = await connect(host, self.options.ssh)

    async def _stage_one(self, host: Host, *, claim: bool = False) -> None:
        slot = self._slots[host.process_id]
        assert slot.conn is not None
        assert self._archive is not None
        self._set(slot, State.STAGING)
        paths = Paths.for_host(host, self.job, self._archive.short)
        size = len(self._archive.data)

        def progress(done: int) -> None:
            self._emit(Transfer(host, "stage", done, size))

        try:
            slot.bytes_sent = await stage(slot.conn, self._archive, paths, progress, claim=claim)
        finally:  # sent, had it already (0 of 0), or failed: this host's transfer is over
            self._emit(Transfer(host, "stage", slot.bytes_sent, slot.bytes_sent, finished=True))

    async def _stale_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        assert slot.conn is not None
        kill = self.options.stale == "kill"
        found = await stale_on(slot.conn, kill=kill, device_glob=self.options.device_glob)
        if found.holders or found.lockfile:
            hint = "" if kill else " (--kill-stale stops them)"
            self._note(f"{host.name}: {found.summary()}{hint}", "warning")

    async def _launch_all(self) -> None:
        internal = {
            pid: s.host.internal_address or (s.conn.peer_address if s.conn else s.host.address)
            for pid, s in self._slots.items()
        }
        scripts: dict[int, str] = {}
        watch = not self.options.detach  # launch and watch on one channel
        for plan in plan_hosts(self.fleet, self.job, self._code_hash, internal, watch=watch):
            slot = self._slots[plan.host.process_id]
            slot.paths, slot.env = plan.paths, plan.env
            scripts[plan.host.process_id] = plan.launch
            slot.sink = LogSink(plan.host, self.log_dir / f"{plan.host.file_stem}.log", self._emit)
        self._write_record(force=True)

        if not watch:  # --detach: each host's job starts as soon as its launch arrives
            await self._launch_detached(scripts)
        else:
            await self._launch_gated(scripts)
        self._write_record(force=True)

    async def _launch_detached(self, scripts: Mapping[int, str]) -> None:
        async def launch_one(host: Host) -> None:
            slot = self._slots[host.process_id]
            assert slot.conn is not None
            self._set(slot, State.STARTING)
            pgid = await launch(slot.conn, scripts[host.process_id])
            self._set(slot, State.RUNNING, f"pgid {pgid}")

        outcomes = await map_hosts(
            launch_one, list(self.fleet), timeout=self.options.launch_timeout, what="launch"
        )
        for o in outcomes:
            if o.error:
                self._fail(o.host, State.ERROR, o.error.message)

    async def _launch_gated(self, scripts: Mapping[int, str]) -> None:
        """Every host writes its run's files and waits at the gate; then all get the word at
        once, so the jobs start together. A host that cannot be launched (or Ctrl-C before
        the word) holds every gate: nothing starts anywhere, no run directory is left."""
        ready: dict[int, Ready] = {}
        timeout = self.options.launch_timeout

        async def ready_one(host: Host) -> None:
            slot = self._slots[host.process_id]
            assert slot.conn is not None
            self._set(slot, State.STARTING)
            shell, slot.shell = slot.shell, None
            ready[host.process_id] = await launch_ready(slot.conn, scripts[host.process_id], shell)

        outcomes = await map_hosts(ready_one, list(self.fleet), timeout=timeout, what="launch")
        failed = [o for o in outcomes if not o.ok]
        if failed or self._interrupted:
            for gate in ready.values():
                gate.hold()
            await map_hosts(
                lambda h: ready[h.process_id].drain(), [g.host for g in ready.values()],
                timeout=timeout, what="launch",
            )  # fmt: skip
            for o in failed:
                self._fail(o.host, State.ERROR, o.error.message if o.error else "failed")
            why = f"{failed[0].host.name} could not be launched" if failed else "interrupted"
            for slot in self._slots.values():
                if not slot.state.final:
                    slot.error = f"not started: {why}"
                    self._set(slot, State.ERROR, slot.error)
            return
        # the word to every host before any reply is read, all of it out at once
        with burst(s.conn for s in self._slots.values() if s.conn is not None):
            for gate in ready.values():
                gate.go()

        async def started_one(host: Host) -> None:
            slot = self._slots[host.process_id]
            assert slot.sink is not None
            slot.started = await ready[host.process_id].started(slot.sink.feed)
            self._set(slot, State.RUNNING, f"pgid {slot.started.pgid}")

        outcomes = await map_hosts(started_one, list(self.fleet), timeout=timeout, what="launch")
        for o in outcomes:
            if o.error:
                self._fail(o.host, State.ERROR, o.error.message)


class Attach(_Watcher):
    """Follow an existing run from its record, from where the local logs end.

    ``observe=True`` (``logs --follow``) only watches: an interrupt leaves every job alone.
    """

    def __init__(
        self,
        record: RunRecord,
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
        *,
        observe: bool = False,
        stop_signal: str = "TERM",
    ) -> None:
        super().__init__(
            record.fleet, record.job, options, on_event, code_hash=record.code_hash,
            observe_only=observe, stop_signal=stop_signal,
        )  # fmt: skip
        self._first_failure = record.first_failure
        self._env_names = record.env_names
        for data, slot in zip(record.hosts, self._slots.values(), strict=True):
            slot.paths = Paths.for_host(slot.host, self.job, self._code_hash)
            slot.env = dict(data.env) if data.env is not None else None
            slot.bytes_sent = data.bytes_sent
            if data.state is State.ERROR:  # never launched: nothing to attach to
                slot.state, slot.error = data.state, data.error
            else:
                slot.sink = LogSink(slot.host, self.log_dir / data.log, self._emit)

    async def execute(self) -> RunResult:
        """Reconnect to every launched host and watch (or stop) until each reports."""
        started = time.monotonic()
        with watch_lock(self.log_dir):
            try:
                await map_hosts(
                    self._reattach_one, list(self.fleet), limit=self.options.connect_limit,
                    timeout=self.options.ssh.connect_timeout + DEFAULTS.connect_slack,
                    what="connect",
                )  # fmt: skip
                await self._watch_all(started)
            finally:
                await self._close_all()
            return self._finish()

    async def _reattach_one(self, host: Host) -> None:
        slot = self._slots[host.process_id]
        if slot.sink is not None:
            try:
                slot.conn = await connect(host, self.options.ssh)
            except HostError as exc:  # the watcher keeps trying until the reconnect timeout
                self._set(slot, State.RECONNECTING, exc.message)


class Stop(Attach):
    """Stop an existing run: ``signal`` to every host's process group, KILL after the grace
    period, and wait for each host to report its exit."""

    def __init__(
        self,
        record: RunRecord,
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
        *,
        signal: str = "TERM",
    ) -> None:
        super().__init__(record, options, on_event, stop_signal=signal)
        self.interrupt()
