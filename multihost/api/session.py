"""``multihost.session``: warm processes on every host for a ``with`` block, a notebook or a
script; ``call`` and ``run_script`` run in them, one after another, as often as needed.

The hosts are connected and the code staged once (as a sweep does); the warm processes are
started at the block's start and end with it (with Ctrl-C, the kernel's shutdown, or this
Python's end; and by themselves when their runner is gone). A session may take its pod as a run
does (``prefix=NAME, up=True, down=True``): made before its hosts are planned, deleted after its
processes have ended, however the session ends. A piece that ends its processes
(``os._exit``, a crash, its ``timeout=``) is said, and the next call starts new ones. The
session's loop lives in a thread of its own (``bridge.Portal``), so the same code works in a
script and inside Jupyter's running loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.api.keywords import check_options, events_of, on_stderr, plan_run, wants_pod
from multihost.bridge import Portal, ctrl_c
from multihost.core.prepare import Prepare
from multihost.core.supervisor import Supervisor
from multihost.errors import RemoteCallError, UsageError, WarmError
from multihost.events import Event
from multihost.options import default_run_name
from multihost.planner import Plan
from multihost.remote.commands import check_run_name
from multihost.results.records import CallResult, RunResult
from multihost.staging.archive import Archive, pack
from multihost.transport import Connection
from multihost.warm.outcome import PieceResult
from multihost.warm.pieces import Layout, Piece, bundled
from multihost.warm.warmset import WarmSet

if TYPE_CHECKING:
    from multihost.pods.ops import Around


async def open_hosts(session: Supervisor, archive: Archive) -> dict[int, Connection]:
    """Every host of ``session`` connected and the code staged, as a run stages it
    (``--stage-via``); the connections by process id (a UsageError when a host cannot be
    reached or staged; Ctrl-C, ``session.interrupt()``: a KeyboardInterrupt)."""
    try:
        outcomes = await Prepare(session, archive).session()
    except BaseException:
        await session.close_all()
        raise
    conns = {pid: s.conn for pid, s in session.slots.items() if s.conn is not None}
    if session.interrupted:
        await asyncio.gather(*(c.close() for c in conns.values()), return_exceptions=True)
        raise KeyboardInterrupt("multihost: interrupted while connecting")
    failed = [o for o in outcomes if o.error]
    if failed:
        await asyncio.gather(*(c.close() for c in conns.values()), return_exceptions=True)
        raise UsageError(
            "cannot start the warm processes: "
            + "; ".join(o.error.args[0] for o in failed[:5] if o.error)
            + (f" (and {len(failed) - 5} more)" if len(failed) > 5 else "")
        )
    return conns


@dataclass
class _Pod:
    """The pod a session holds (``up=``, ``down=``...): the open block of its life
    (``multihost.api.pods.around``), ended when the session ends, and what it says of it."""

    block: contextlib.ExitStack
    box: Around

    @classmethod
    def around(cls, options: dict[str, Any], say: Callable[[str], None]) -> _Pod | None:
        """The pod's life begun (the pod made when ``up`` and missing, or found and checked
        against the keywords); None when no pod keyword is given."""
        if not wants_pod(options):
            return None
        from multihost.api.pods import around  # the pod's modules only then, as for a run

        block = contextlib.ExitStack()
        box = block.enter_context(around(options, say, what="session"))
        assert box is not None  # a pod keyword is given
        return cls(block, box)

    def end(self, exc: BaseException | None, ending: str) -> None:
        """The pod's life ended as the session's did: ``ending`` when it closed, else the
        exception it ended with (a KeyboardInterrupt: "interrupted"); with ``down``, the pod
        deleted and its cost said."""
        if exc is None:
            self.box.ending = ending
            self.block.close()
        else:
            self.block.__exit__(type(exc), exc, exc.__traceback__)


# Sessions holding a pod: kept until they close, so that their pod goes with close() or this
# Python's end, never with the garbage collector (in whatever thread it runs).
_KEPT: set[Session] = set()


class Session:
    """Warm processes on every host: ``call(fn, *args)`` and ``run_script(path, *args)`` run
    in them; ``close()`` (or the ``with`` block's end) ends them, and the session's pod when it
    took one with ``down=True``. Made by :func:`session`."""

    def __init__(
        self,
        plan: Plan,
        python: str,
        on_event: Callable[[Event], None],
        pod: _Pod | None = None,
    ) -> None:
        self.plan = plan
        self.name = plan.job.run_name
        self.layout = Layout(python)
        self._emit = on_event
        self._portal = Portal()
        self._conns: dict[int, Connection] = {}
        self._archive: Archive | None = None
        self._warm: WarmSet | None = None
        self._opening: Supervisor | None = None  # while connecting and staging
        self._sets = 0
        self._pieces = 0
        self._pod = pod
        self.closed = False
        if pod is not None:
            _KEPT.add(self)
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def log_dir(self) -> Path:
        """Where the session's runs and pieces keep their logs."""
        return self.plan.options.log_dir / self.name

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("warm" if self._warm else "not started")
        return f"<Session {self.name}: {len(self.plan.fleet)} host(s), {state}>"

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self._end(exc, "closed")

    # -- the processes --------------------------------------------------------------------
    def start(self) -> None:
        """Connect, stage, start the warm processes (done by the first call otherwise)."""
        self._call(self._ready)

    async def _ready(self) -> WarmSet:
        if self.closed:
            raise WarmError(f"session {self.name} is closed")
        if self._archive is None:
            plan = self.plan
            archive = await asyncio.to_thread(pack, plan.options.script_dir, plan.options.excludes)
            opening = Supervisor(
                plan.fleet, plan.job, plan.options, self._emit, code_hash=archive.short
            )
            self._opening = opening
            try:
                self._conns = await open_hosts(opening, archive)
            finally:
                self._opening = None
            self._archive = archive
        if self._warm is not None and (self._warm.broken or self._warm.interrupted):
            await self._warm.close()
            self._warm = None
        if self._warm is None:
            self._sets += 1
            warm = WarmSet(
                self.plan.fleet,
                self.plan.job,
                self.plan.options,
                self.layout,
                f"{self.name}/warm-{self._sets}",
                self._emit,
                connections=self._conns,
                staged=self._archive,
            )
            self._warm = warm
            try:
                await warm.start()
            except WarmError:
                if warm.interrupted:
                    raise KeyboardInterrupt("multihost: interrupted while starting") from None
                raise
        return self._warm

    def _interrupt(self) -> None:
        if self._opening is not None:
            self._opening.interrupt()
        if self._warm is not None:
            self._warm.interrupt()

    def _call(self, make: Callable[[], Any]) -> Any:
        if self._portal.closed:
            raise WarmError(f"session {self.name} is closed")
        return self._portal.call(make, ctrl_c(self._interrupt))

    def close(self) -> None:
        """End the warm processes (each leaves its JAX job with the others) and the
        connections, then the session's pod (``down=True``: deleted, its cost said);
        idempotent."""
        self._end(None, "closed")

    def _end(self, exc: BaseException | None, ending: str) -> None:
        """The processes ended, then the pod, with how the session ended (``exc``: the
        exception its block ended with; else ``ending``)."""
        try:
            self._stop()
        except BaseException as failed:  # (a second Ctrl-C while closing) the pod goes too
            self._let_go(exc or failed, ending)
            raise
        self._let_go(exc, ending)

    def _stop(self) -> None:
        if self._portal.closed:
            return
        self.closed = True
        try:
            self._portal.call(self._close)
        finally:
            self._portal.close()

    def _let_go(self, exc: BaseException | None, ending: str) -> None:
        pod, self._pod = self._pod, None
        _KEPT.discard(self)
        if pod is not None:
            pod.end(exc, ending)

    async def _close(self) -> None:
        if self._warm is not None:
            await self._warm.close()
            self._warm = None
        conns, self._conns = self._conns, {}
        await asyncio.gather(*(c.close() for c in conns.values()), return_exceptions=True)

    # -- pieces ---------------------------------------------------------------------------
    def _do(self, piece: Piece, timeout: float | None) -> PieceResult:
        async def go() -> PieceResult:
            warm = await self._ready()
            self._pieces += 1
            try:
                return await warm.do(piece, f"{self.name}/{self._pieces}", timeout)
            except asyncio.CancelledError:  # a second Ctrl-C: stop them, the next call restarts
                warm.interrupt()
                raise

        done: PieceResult = self._call(go)
        if done.result.interrupted:
            raise KeyboardInterrupt(f"multihost: session {self.name}: interrupted")
        return done

    def call(
        self,
        fn: Any,
        *args: Any,
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` in every host's warm process; each host's value in process
        order. Raises :class:`RemoteCallError` as :func:`multihost.call` does."""
        import cloudpickle

        blob = cloudpickle.dumps((fn, args, kwargs or {}))
        done = self._do(Piece("call", blob=blob, python=_python()), timeout)
        outcomes = []
        for o in done.outcomes:
            if not o.ok:
                outcomes.append(CallResult(o.host, error=o.reason, traceback=o.traceback))
                continue
            try:
                outcomes.append(CallResult(o.host, value=_loads(o.value)))
            except Exception as exc:  # e.g. an object of a module only the host has
                why = f"its return value cannot be unpickled here: {type(exc).__name__}: {exc}"
                outcomes.append(CallResult(o.host, error=why))
        failed = [o for o in outcomes if not o.ok]
        if failed:
            first = _first(done, failed)
            raise RemoteCallError(first.host, _message(first), tuple(outcomes), done.result)
        return [o.value for o in outcomes]

    def run_script(self, script: str, *args: str, timeout: float | None = None) -> RunResult:
        """``python SCRIPT ARGS`` (the script relative to the staged code) in every host's warm
        process: its result as a run's (each host's exit, logs, ``result()``)."""
        if not isinstance(script, str) or not all(isinstance(a, str) for a in args):
            raise TypeError("run_script takes the script's path and its arguments as strings")
        kind = "main" if bundled(self.plan.options.script_dir, script) else "script"
        return self._do(Piece(kind, script, tuple(args)), timeout).result


def _python() -> tuple[int, int]:
    return (sys.version_info[0], sys.version_info[1])


def _loads(value: bytes) -> Any:
    import pickle

    return pickle.loads(value)


def _first(done: PieceResult, failed: list[CallResult]) -> CallResult:
    """The host that failed first of its own (raised, or its process ended) over those
    stopped because of it; among them, one that raised, then the first to end."""
    said = {o.host.process_id: o for o in done.outcomes}

    def rank(c: CallResult) -> tuple[bool, bool, float, int]:
        o = said[c.host.process_id]
        return (o.stopped, not c.traceback, o.ended_at or float("inf"), o.host.process_id)

    return min(failed, key=rank)


def _message(o: CallResult) -> str:
    if not o.traceback:
        return str(o.error)
    return f"{o.error}\n\nremote traceback ({o.host.name}):\n{o.traceback.rstrip()}"


def _close_at_exit(ref: weakref.ReferenceType[Session]) -> None:
    """This Python is ending (a script's end, a kernel's shutdown): end the processes."""
    session = ref()
    if session is not None:
        session._end(None, "at exit")


def session(
    *,
    hosts: Any = None,
    prefix: str | None = None,
    local: int | None = None,
    python: str | None = None,
    say: Callable[[str], None] | None = None,
    **options: Any,
) -> Session:
    """Warm processes on every host, for as long as the ``with`` block (or until ``close()``):
    ``s.call(fn, *args)`` and ``s.run_script("train.py", "--steps", "10")`` run in them, JAX
    imported and the job joined once. ``python``: the interpreter (default ``python3``; for
    ``local=`` fleets this Python; in a locked environment, its ``python``). Other keywords:
    as :func:`multihost.run` (``script_dir=``: the code ``run_script`` runs, default the
    current directory; ``run_name=``: the session's name).

    A pod for the session, as ``run(..., up=True, down=True)``: ``up=True`` makes pod
    ``prefix`` here when missing (``tpu_type=``, ``runtime_version=``, ``zones=``... or the
    profile's; an existing pod is used, the keywords given checked against it), ``down=True``
    deletes it when the session ends however it ends (the block's end, an exception, Ctrl-C,
    SIGTERM, ``close()``, this Python's end), its cost said (``say=``, default stderr);
    ``autodown=`` arms it."""
    check_options("session", options)
    name = check_run_name(options.pop("run_name", None) or default_run_name("session"))
    fleet_kw = {
        k: v for k, v in (("hosts", hosts), ("prefix", prefix), ("local", local)) if v is not None
    }
    given = {**options, **fleet_kw, "run_name": name}
    pod = _Pod.around(given, say or on_stderr)
    try:
        plan = plan_run("", given, "session")
        default = sys.executable if plan.fleet.local else "python3"
        interpreter = python or ("python" if plan.options.environment else default)
        plan = replace(plan, job=replace(plan.job, command=""))
        return Session(plan, interpreter, events_of(options), pod)
    except BaseException as exc:  # (the pod's hosts cannot be planned) it goes as it came
        if pod is not None:
            pod.end(exc, "not started")
        raise
