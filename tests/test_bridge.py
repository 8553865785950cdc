"""The one bridge from sync code to the loop: a signal stops the work once, or detaches."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import replace

import pytest

from multihost.bridge import Detached, Interrupt, blocking


def test_the_bridge_stops_once_or_detaches() -> None:
    said: list[str] = []
    stopped = asyncio.Event()

    async def work() -> str:
        os.kill(os.getpid(), signal.SIGTERM)  # the handlers are in place once the work runs
        await stopped.wait()
        return "stopped"

    policy = Interrupt(
        lambda: stopped.set(), "stopping", say=said.append, signals=(signal.SIGINT, signal.SIGTERM)
    )
    assert blocking(work, policy) == "stopped"
    assert said == ["multihost: SIGTERM: stopping"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers gone afterwards

    async def forever() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.Event().wait()

    with pytest.raises(Detached):
        blocking(forever, replace(policy, stop=None, what="detached", label="interrupted"))
    assert said[-1] == "multihost: interrupted: detached"


def test_a_terminating_block_ends_on_sigterm_as_on_ctrl_c() -> None:
    """In ``terminating()``, SIGTERM cancels the work a ``blocking`` call runs (its ``finally``
    runs, in order) and ends it as a KeyboardInterrupt; a policy of the call's own is kept
    meanwhile, and the handler before the block is back after it."""
    from multihost.bridge import terminating

    cleaned: list[str] = []

    async def forever() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.Event().wait()
        finally:
            cleaned.append("work")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminating():
        blocking(forever)
    assert cleaned == ["work"]
    assert signal.getsignal(signal.SIGTERM) is before
    stopped = asyncio.Event()

    async def stoppable() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        await stopped.wait()
        return "stopped"

    with terminating():  # the call's own policy stops it; the block's handler comes back
        policy = Interrupt(stopped.set, "stopping", say=lambda _: None, signals=(signal.SIGTERM,))
        assert blocking(stoppable, policy) == "stopped"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_terminating_blocks_may_end_in_any_order() -> None:
    """Two blocks held open (two sessions' pods), the first one ended first: SIGTERM is still
    a Ctrl-C until the last one ends, then the handler before them is back. A block ended in
    another thread (where no handler can be set) leaves it to the next block's end here."""
    from multihost.bridge import terminating

    before = signal.getsignal(signal.SIGTERM)
    first, second = terminating(), terminating()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
    second.__exit__(None, None, None)
    assert signal.getsignal(signal.SIGTERM) is before
    held = terminating()
    held.__enter__()
    elsewhere = threading.Thread(target=held.__exit__, args=(None, None, None))
    elsewhere.start()
    elsewhere.join()
    assert signal.getsignal(signal.SIGTERM) is not before
    with terminating():
        pass
    assert signal.getsignal(signal.SIGTERM) is before
