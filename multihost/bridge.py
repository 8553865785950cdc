"""The one bridge from sync code to the event loop, with one interrupt policy.

:func:`blocking` runs ``make()`` to completion: ``asyncio.run`` in a plain script or command,
and inside a running event loop (Jupyter) the same on a private loop in a worker thread.

With an :class:`Interrupt`, the first of its signals (Ctrl-C; the command line adds SIGTERM
and SIGHUP) calls ``stop`` once — every host is stopped and the work returns what it returns —
or, with no ``stop``, detaches: the work is cancelled, nothing on the hosts is touched, and
:class:`Detached` is raised. The second signal leaves at once: a command exits (130) without
waiting, a library call gets its KeyboardInterrupt.

A :class:`Portal` is the same for work that must outlive one call (a session's connections and
warm processes): one private loop in a thread of its own, each ``call`` run there to its end
under the same policy, until ``close``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


_TERMINATING = (signal.SIGTERM, signal.SIGHUP)  # what `terminating` makes a Ctrl-C


class Detached(Exception):
    """The user detached from a run (a signal with nothing to stop): the run goes on."""


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Interrupt:
    """What a signal does to the work :func:`blocking` runs."""

    stop: Callable[[], None] | None  # the first signal calls it; None: detach instead
    what: str = "stopping every host"  # what the first signal does, as said
    say: Callable[[str], None] = _stderr
    signals: tuple[signal.Signals, ...] = (signal.SIGINT,)
    exit_at_second: bool = False  # a command: the second signal exits the process at once
    label: str | None = None  # the signal's name in what is said (default: SIGINT, ...)
    stacks: Callable[[], None] | None = None  # SIGQUIT (Ctrl-\): every host's stacks, now
    left: str = "jobs may still be running on the hosts"  # what the second signal leaves

    def first(self, signum: int) -> str:
        return f"multihost: {self.label or signal.Signals(signum).name}: {self.what}"


def blocking(make: Callable[[], Coroutine[Any, Any, T]], interrupt: Interrupt | None = None) -> T:
    """``make()`` run to its end from sync code (see the module's docstring). ``make`` is only
    called where the coroutine runs, so none is ever left un-awaited."""
    box: dict[str, Any] = {}

    async def main() -> T:
        loop = box["loop"] = asyncio.get_running_loop()
        task: asyncio.Task[T] = asyncio.ensure_future(make())
        box["task"] = task
        hooked = interrupt is not None and threading.current_thread() is threading.main_thread()
        before = {}
        if interrupt is not None and hooked:
            before = {s: signal.getsignal(s) for s in (*interrupt.signals, signal.SIGQUIT)}
            _hook(loop, task, interrupt, box)
        ending = _terminating(loop, task, box) if interrupt is None else ()
        try:
            return await task
        except asyncio.CancelledError:
            if box.get("terminated"):  # SIGTERM in a `terminating` block: as Ctrl-C, in order
                raise KeyboardInterrupt from None
            if interrupt is not None and interrupt.stop is None and box.get("presses"):
                raise Detached from None
            raise
        finally:
            for sig in ending:
                loop.remove_signal_handler(sig)
                signal.signal(sig, _as_ctrl_c)
            if interrupt is not None and hooked:
                for sig in (*interrupt.signals, signal.SIGQUIT):
                    loop.remove_signal_handler(sig)
                for sig, handler in before.items():  # what the caller had (``terminating``)
                    if handler is not None:
                        signal.signal(sig, handler)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    return _in_thread(main, interrupt, box)


def _terminating(
    loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any], box: dict[str, Any]
) -> tuple[signal.Signals, ...]:
    """Inside a :func:`terminating` block, its signals cancel the work (its connections and
    processes closed in order, as asyncio does for Ctrl-C) and then end it as a
    KeyboardInterrupt, never raised in the middle of the loop's own callbacks."""
    if threading.current_thread() is not threading.main_thread():
        return ()
    signals = tuple(s for s in _TERMINATING if signal.getsignal(s) is _as_ctrl_c)

    def end() -> None:
        box["terminated"] = True
        task.cancel()

    for sig in signals:
        loop.add_signal_handler(sig, end)
    return signals


def _hook(
    loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any], i: Interrupt, box: dict[str, Any]
) -> None:
    if i.stacks is not None:
        loop.add_signal_handler(signal.SIGQUIT, i.stacks)

    def on_signal(signum: int) -> None:
        box["presses"] = box.get("presses", 0) + 1
        if box["presses"] > 1:  # only when the handler stays: exit_at_second
            _say(i, f"multihost: second {signal.Signals(signum).name}: exiting now; {i.left}")
            os._exit(130)
        _say(i, i.first(signum))
        if not i.exit_at_second:  # the next one is a KeyboardInterrupt again
            for sig in i.signals:
                loop.remove_signal_handler(sig)
        if i.stop is None:
            task.cancel()
        else:
            i.stop()

    for sig in i.signals:
        loop.add_signal_handler(sig, on_signal, sig)


def _say(i: Interrupt, text: str) -> None:
    """A signal's message; after SIGHUP the terminal may be gone, which must not stop us."""
    with contextlib.suppress(OSError):
        i.say(text)


def _in_thread(
    main: Callable[[], Coroutine[Any, Any, T]], interrupt: Interrupt | None, box: dict[str, Any]
) -> T:
    """``main`` on a private loop in a worker thread, this thread blocked until it is done; a
    Ctrl-C here (a kernel interrupt) is the interrupt's first signal, the next one leaves."""
    finished = threading.Event()  # not Thread.join: an interrupted join can report the end

    def work() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=work, name="multihost", daemon=True).start()
    _wait(finished, interrupt, box)
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _wait(finished: threading.Event, interrupt: Interrupt | None, box: dict[str, Any]) -> None:
    """Block until ``finished``; the first Ctrl-C is the interrupt's first signal (its
    ``stop``, or a detach), the next one a KeyboardInterrupt here."""
    interrupted = False
    while not finished.is_set():
        try:
            finished.wait()
        except KeyboardInterrupt:
            if interrupted or interrupt is None or "task" not in box:
                raise
            interrupted = True
            box["presses"] = 1
            _say(interrupt, interrupt.first(signal.SIGINT))
            act = interrupt.stop if interrupt.stop is not None else box["task"].cancel
            box["loop"].call_soon_threadsafe(act)


class Portal:
    """One private event loop in a daemon thread, for work that outlives a call (a session's
    connections and warm processes). ``call`` runs ``make()`` there and blocks until it is
    done, with :func:`blocking`'s interrupt policy; the same from a script, a command or a
    notebook's running loop. ``close`` stops the loop (its work must have ended)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="multihost-portal", daemon=True
        )
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._loop.is_closed()

    def call(
        self, make: Callable[[], Coroutine[Any, Any, T]], interrupt: Interrupt | None = None
    ) -> T:
        """``make()`` run to its end on the portal's loop; a second Ctrl-C cancels it and is a
        KeyboardInterrupt here."""
        if self._loop.is_closed():
            raise RuntimeError("this portal is closed")
        box: dict[str, Any] = {"loop": self._loop}

        async def main() -> T:
            task: asyncio.Task[T] = asyncio.ensure_future(make())
            box["task"] = task
            try:
                return await task
            except asyncio.CancelledError:
                if interrupt is not None and interrupt.stop is None and box.get("presses"):
                    raise Detached from None
                raise

        future: concurrent.futures.Future[T] | None = None
        try:
            future = asyncio.run_coroutine_threadsafe(main(), self._loop)
            finished = threading.Event()
            future.add_done_callback(lambda _f: finished.set())
            _wait(finished, interrupt, box)
        except KeyboardInterrupt:
            if future is not None:  # the work does not go on behind the caller's back
                future.cancel()
            raise
        return future.result()

    def close(self) -> None:
        """Stop the loop and its thread (idempotent)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


_HELD: dict[signal.Signals, tuple[int, Any]] = {}  # signal → open `terminating` blocks, before


@contextlib.contextmanager
def terminating(signals: tuple[signal.Signals, ...] = _TERMINATING) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP end the work as Ctrl-C does (a
    KeyboardInterrupt), so that what it made is given back on the way out (a pod: deleted, its
    cost said) instead of the process dying with it; the handlers before are put back after.
    Only in the main thread, where Python delivers signals (elsewhere the block runs as is).
    Work that runs through :func:`blocking` inside the block is cancelled in order by them
    (then the KeyboardInterrupt), or keeps its own policy where it has one.

    Blocks may end in any order (a session's pod is held until the session closes, and two
    sessions close as their user likes): the handlers before the first block are put back when
    the last one ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    for sig in signals:
        held, before = _HELD[sig] if sig in _HELD else (0, signal.getsignal(sig))
        signal.signal(sig, _as_ctrl_c)
        _HELD[sig] = (held + 1, before)
    try:
        yield
    finally:
        for sig in signals:
            held, before = _HELD.pop(sig)
            if held > 1:
                _HELD[sig] = (held - 1, before)
            elif threading.current_thread() is threading.main_thread():
                signal.signal(sig, signal.SIG_DFL if before is None else before)
            else:  # only the main thread sets handlers: the next block's end there puts it back
                _HELD[sig] = (0, before)


def ctrl_c(stop: Callable[[], None]) -> Interrupt:
    """A library call's policy (``multihost.run`` in a script or a notebook): Ctrl-C stops
    every host and the call returns its result; a second Ctrl-C is a KeyboardInterrupt."""
    return Interrupt(stop, what="stopping every host (again to leave now)", label="interrupted")
