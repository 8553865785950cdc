"""The one bridge from sync code to the loop: a signal stops the work once, or detaches."""

from __future__ import annotations

import asyncio
import os
import signal
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
