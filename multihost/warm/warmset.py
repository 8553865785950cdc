"""A warm set: one warm process per host, JAX imported and the job joined once, then pieces of
work run in it one after the other, on every host together (one SPMD job).

The processes are a run of their own (``core.Run``: staged, claimed, launched behind the gate,
watched, in its process group on each host), whose command is the warm server
(``multihost/remote/warm_server.py``, put in the run's directory by a preparation step). So what
stops a run stops them: the run's own stop (an interrupt, a failed host), ``multihost kill``;
and they leave by themselves when their runner's channel is gone (the runner died). Each
host's channel (:class:`~multihost.warm.channel.HostChannel`) carries the pieces and their
outcomes; a piece's output goes to a log folder of its own, one file per host, as a run's.

A piece that raises or exits non-zero fails alone: the processes stay warm. One that ends its
process (``os._exit``, a crash), outlives its timeout, or leaves a host still running ``grace``
seconds after another failed breaks the set: it is stopped (nothing is left on any host) and
``broken`` says why; its owner starts a new one for the next piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from multihost.core import HostStep, Run
from multihost.core.steps import host_steps
from multihost.core.supervisor import Supervisor
from multihost.defaults import DEFAULTS
from multihost.errors import EnvFailed, HostError, RemoteError, WarmError
from multihost.events import Event, HostEvent, Note
from multihost.model import Fleet, Host, Job, State
from multihost.options import RunOptions
from multihost.remote import script
from multihost.remote.warm import PUT, SERVER, server_source
from multihost.results.records import RunResult
from multihost.runs.stream import LogSink
from multihost.staging.archive import Archive
from multihost.transport import Connection, burst
from multihost.warm.channel import HostChannel
from multihost.warm.frames import Frame, work_frame
from multihost.warm.outcome import HostOutcome, PieceResult, as_run, outcome_of
from multihost.warm.pieces import Layout, Piece

WAIT_ENV = "MULTIHOST_WARM_WAIT"  # how long a warm process waits for its runner's channel


def server_command(python: str) -> str:
    """The warm run's command: the server in the run's directory, by the layout's Python."""
    return f'exec {shlex.quote(python)} "$MULTIHOST_RUN_DIR"/{SERVER}'


async def put_server(sup: Supervisor, host: Host) -> None:
    """The preparation step that writes the server into the run's claimed directory."""
    conn = sup.slots[host.process_id].conn
    assert conn is not None
    res = await conn.run(script(PUT, paths={"r": sup.paths(host).run}), stdin=server_source())
    if res.exit_status != 0:
        why = res.stderr.decode(errors="replace").strip() or f"exit {res.exit_status}"
        raise RemoteError(host, f"could not write the warm server: {why}")


class WarmSet:
    """One warm process per host of ``fleet``, started by ``start`` as the run ``name``;
    ``do`` runs a piece on every host; ``close`` ends them (``interrupt``: at once)."""

    def __init__(
        self,
        fleet: Fleet,
        job: Job,
        options: RunOptions,
        layout: Layout,
        name: str,
        on_event: Callable[[Event], None] | None = None,
        *,
        connections: Mapping[int, Connection] | None = None,
        staged: Archive | None = None,
        start_timeout: float = DEFAULTS.warm_start_timeout,
    ) -> None:
        self.fleet, self.layout, self.name = fleet, layout, name
        self.options = options
        self._emit = on_event or (lambda _e: None)
        self.start_timeout = start_timeout
        env = {**job.env, **dict(layout.env), WAIT_ENV: f"{start_timeout:g}"}
        self.job = replace(job, command=server_command(layout.python), run_name=name, env=env)
        quiet = replace(
            options, timeout=None, hang_timeout=None, fail_fast=True, trace=None, pull=()
        )
        steps = (*host_steps(options), HostStep("warm server", put_server))
        self.run = Run(
            fleet, self.job, quiet, self._event, connections=connections, staged=staged, steps=steps
        )
        self.channels: dict[int, HostChannel] = {}
        self.ready: dict[int, Any] = {}  # each host's "ready": pid, jax, process index, devices
        self.broken: str | None = None
        self.interrupted = False
        self._running: dict[int, asyncio.Event] = {h.process_id: asyncio.Event() for h in fleet}
        self._ended: dict[int, str] = {}  # process id → how its warm process ended, in words
        self._wake = asyncio.Event()
        self._task: asyncio.Task[RunResult] | None = None
        self._sinks: dict[int, LogSink] = {}
        self._pieces = 0

    @property
    def env_failure(self) -> EnvFailed | None:
        return self.run.env_failure

    # -- the warm run's events ------------------------------------------------------------
    def _event(self, event: Event) -> None:
        if isinstance(event, HostEvent):
            pid = event.host.process_id
            if event.state is State.RUNNING:
                self._running[pid].set()
            elif event.state.final:
                self._ended.setdefault(pid, event.detail or str(event.state))
                self._wake.set()
        elif isinstance(event, Note) and event.level == "warning":
            self._emit(event)  # its errors are said here, in a warm set's words

    def _on_out(self, host: Host, data: bytes) -> None:
        sink = self._sinks.get(host.process_id)
        if sink is not None:
            sink.feed(data)

    # -- start ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Every host's warm process started, in its JAX job, and ready; else a WarmError
        (the run stopped, nothing left) or the run's UsageError (a busy port, a taken name)."""
        self._task = asyncio.create_task(self.run.execute())
        try:
            async with asyncio.timeout(self.start_timeout):
                await self._until_running()
                await self._open_channels()
                await self._until_ready()
        except TimeoutError:
            self.broken = "did not start"
            await self._stop()
            raise WarmError(
                f"the warm processes did not start within {self.start_timeout:g} s "
                f"(their run: {self.name})"
            ) from None
        except BaseException:
            self.broken = "did not start"
            await self._stop()
            raise

    async def _until_running(self) -> None:
        assert self._task is not None
        everyone: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(e.wait() for e in self._running.values()))
        )
        both: set[asyncio.Future[Any]] = {everyone, self._task}
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            everyone.cancel()
            result = self._task.result()  # a UsageError (port busy, name taken) is raised
            raise WarmError(f"the warm processes did not start: {_why(result)}")

    async def _open_channels(self) -> None:
        sup = self.run.sup
        for host in self.fleet:
            slot = sup.slots[host.process_id]
            if slot.conn is None or slot.paths is None:
                raise WarmError(f"{host.name}: its warm process has no connection")
            channel = HostChannel(host, self._on_out)
            self.channels[host.process_id] = channel
            await channel.open(slot.conn, slot.paths.run, self.start_timeout)

    async def _until_ready(self) -> None:
        assert self._task is not None
        waits = {pid: ch.ready for pid, ch in self.channels.items()}
        pending: set[asyncio.Future[Any]] = set(waits.values())
        while pending:
            done, _ = await asyncio.wait(
                pending | {self._task}, return_when=asyncio.FIRST_COMPLETED
            )
            pending -= done
            if self._task in done and not all(w.done() for w in waits.values()):
                result = self._task.result()
                raise WarmError(f"the warm processes did not start: {_why(result)}")
            for pid, wait in waits.items():
                if wait in done and wait.exception() is not None:
                    # its process ended (the channel saw its exit file): the run says how
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(DEFAULTS.last_report):
                            result = await asyncio.shield(self._task)
                            raise WarmError(f"the warm processes did not start: {_why(result)}")
                    host = self.channels[pid].host
                    why = f"{host.name}'s warm process did not start: {wait.exception()}"
                    raise WarmError(why)
        self.ready = {pid: w.result() for pid, w in waits.items()}
        for pid, said in self.ready.items():
            index = said.get("process_index")
            if index is not None and index != pid:
                raise WarmError(f"process {pid}'s warm process joined as JAX process {index}")

    # -- a piece ----------------------------------------------------------------------------
    async def do(self, piece: Piece, name: str, timeout: float | None = None) -> PieceResult:
        """``piece`` on every host, its output in ``<log dir>/<name>/``; never raises for a
        host's failure (see the module's docstring for when the set breaks)."""
        if self.broken is not None:
            raise WarmError(f"these warm processes were stopped: {self.broken}")
        self._pieces += 1
        folder = self.options.log_dir / name
        self._sinks = {
            h.process_id: LogSink(h, folder / f"{h.file_stem}.log", self._emit) for h in self.fleet
        }
        waits = {pid: ch.done() for pid, ch in self.channels.items()}
        data = work_frame(piece.header(self._pieces), piece.blob)
        conns = [s.conn for s in self.run.sup.slots.values() if s.conn is not None]
        with burst(conns):  # every host gets it at once: one SPMD job
            await asyncio.gather(*(ch.write(data) for ch in self.channels.values()))
        outcomes: dict[int, HostOutcome] = {}
        timed_out, why = await self._wait(waits, outcomes, timeout)
        if why is not None or self.interrupted:
            self.broken = why or "interrupted"
            ran = await self._stop()
            for host in self.fleet:
                if host.process_id not in outcomes:
                    outcomes[host.process_id] = self._lost(host, ran, timed_out)
        for sink in self._sinks.values():
            sink.close()
        ordered = tuple(outcomes[h.process_id] for h in self.fleet)
        result = as_run(
            name,
            folder,
            ordered,
            self._sinks,
            timed_out=timed_out,
            interrupted=self.interrupted,
            broken=self.broken,
        )
        if self.broken and not self.interrupted:
            self._emit(Note(f"warm processes {self.name} stopped: {self.broken}", "warning"))
        return PieceResult(ordered, result, self.broken)

    async def _wait(
        self,
        waits: dict[int, asyncio.Future[Frame]],
        outcomes: dict[int, HostOutcome],
        timeout: float | None,
    ) -> tuple[bool, str | None]:
        """Collect every host's outcome; (timed out, why the set must stop or None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at: float | None = None
        pending: dict[asyncio.Future[Any], int] = {w: pid for pid, w in waits.items()}
        while pending:
            self._wake.clear()
            if self.interrupted:
                return False, None
            if self._ended:
                pid = min(self._ended)
                name = self.channels[pid].host.name
                return False, f"{name}'s warm process ended: {self._ended[pid]}"
            now = time.monotonic()
            limits = [deadline - now] if deadline is not None else []
            if failed_at is not None:
                limits.append(failed_at + self.options.grace - now)
            left = max(0.0, min(limits)) if limits else None
            waker: asyncio.Future[Any] = asyncio.ensure_future(self._wake.wait())
            done, _ = await asyncio.wait(
                {*pending, waker}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            waker.cancel()
            for wait in done & pending.keys():
                pid = pending.pop(wait)
                host = self.channels[pid].host
                if wait.exception() is not None:
                    if pid in self._ended:
                        return False, f"{host.name}'s warm process ended: {self._ended[pid]}"
                    why = f"{host.name}'s channel to its warm process ended: {wait.exception()}"
                    return False, why
                outcomes[pid] = outcome_of(host, wait.result())
                if not outcomes[pid].ok and failed_at is None:
                    failed_at = time.monotonic()
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                return True, f"timed out after {timeout:g} s"
            if failed_at is not None and time.monotonic() >= failed_at + self.options.grace:
                first = min(
                    (o for o in outcomes.values() if not o.ok),
                    key=lambda o: o.ended_at or 0.0,
                )
                still = ", ".join(self.channels[p].host.name for p in pending.values())
                return False, (
                    f"{still} still running {self.options.grace:g} s after {first.host.name} "
                    f"failed ({first.reason})"
                )
        return False, None

    def _lost(self, host: Host, ran: RunResult | None, timed_out: bool) -> HostOutcome:
        """The outcome of a host that gave none: its process ended, or the set was stopped."""
        if self.interrupted:
            return HostOutcome(host, error="interrupted", stopped=True)
        if timed_out:  # stopped for the timeout: how its process then ended is not the cause
            return HostOutcome(host, error=self.broken, stopped=True)
        mine = next((r for r in ran.hosts if r.host == host), None) if ran is not None else None
        if mine is not None and mine.state is not State.KILLED and mine.reason:
            return HostOutcome(host, error=f"{mine.reason} (its warm process ended)")
        return HostOutcome(host, error=f"stopped: {self.broken}", stopped=True)

    # -- the end -----------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Stop the processes now (a piece under way ends interrupted)."""
        self.interrupted = True
        self._wake.set()
        self.run.interrupt()

    async def close(self) -> RunResult | None:
        """End the processes: told to leave (each leaves its JAX job with the others), else
        stopped; every channel closed. Returns the warm run's result."""
        if self._task is None:
            return None
        if self.broken is None and not self.interrupted and not self._task.done():
            with contextlib.suppress(HostError, OSError):
                await asyncio.gather(*(ch.send("quit") for ch in self.channels.values()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.options.grace + DEFAULTS.stop_slack):
                    await asyncio.shield(self._task)
        return await self._stop()

    async def _stop(self) -> RunResult | None:
        """The run stopped (if it still runs) and waited for; the channels closed."""
        if self._task is None:
            return None
        if not self._task.done():
            self.run.interrupt()
        bound = self.options.grace + DEFAULTS.stop_slack + DEFAULTS.last_report
        await asyncio.gather(*(ch.close(bound) for ch in self.channels.values()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                await asyncio.shield(self._task)
        if not self._task.done():
            self._task.cancel()
        try:
            return await self._task
        except Exception:
            return None


def _why(result: RunResult) -> str:
    """Why a warm run ended, in words: its first failure (with that host's last line: what
    the server said), or the first host's reason."""
    for r in result.hosts:
        first = result.first_failure
        if first and first.startswith(f"{r.host.name} ") and r.last_line:
            return f"{first}: {r.last_line}"
    if result.first_failure:
        return result.first_failure
    for r in result.hosts:
        if r.reason:
            return f"{r.host.name} {r.reason}"
    return "their run ended" + (" (interrupted)" if result.interrupted else "")
