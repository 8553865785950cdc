"""The one place that runs something on every host: a task group, a semaphore and timeouts.

Each host's coroutine turns its own failure into an ``Outcome``, so one host's error never
cancels its siblings; stopping early is a policy the caller builds on top.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from multihost.defaults import DEFAULTS
from multihost.errors import HostError, RemoteError
from multihost.model import Fleet, Host
from multihost.transport import Connection, SSHOptions, connect

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One host's value, or the error that stopped it."""

    host: Host
    value: T | None = None
    error: HostError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


async def map_hosts(
    fn: Callable[[Host], Awaitable[T]],
    hosts: Sequence[Host],
    *,
    limit: int | None = None,
    timeout: float | None = None,
    what: str = "step",
) -> list[Outcome[T]]:
    """Run ``fn`` for every host at once (at most ``limit`` at a time), in host order."""
    gate = asyncio.Semaphore(limit) if limit else None

    async def one(host: Host) -> Outcome[T]:
        try:
            if gate is None:
                async with asyncio.timeout(timeout):
                    return Outcome(host, await fn(host))
            async with gate, asyncio.timeout(timeout):
                return Outcome(host, await fn(host))
        except HostError as exc:
            return Outcome(host, error=exc)
        except TimeoutError:
            return Outcome(host, error=RemoteError(host, f"{what} timed out after {timeout:g} s"))
        except Exception as exc:  # a bug or an unexpected library error: keep it per host
            return Outcome(host, error=RemoteError(host, f"{what} failed: {exc!r}"))

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(h)) for h in hosts]
    return [t.result() for t in tasks]


async def on_every_host(
    fleet: Fleet,
    ssh: SSHOptions,
    fn: Callable[[Connection], Awaitable[T]],
    *,
    limit: int = DEFAULTS.connect_limit,
    timeout: float = DEFAULTS.command_timeout,
) -> list[Outcome[T]]:
    """Connect to every host (bounded handshakes), run ``fn`` on each, close."""
    gate = asyncio.Semaphore(limit)

    async def one(host: Host) -> T:
        async with gate:
            conn = await connect(host, ssh)
        try:
            return await fn(conn)
        finally:
            await conn.close()

    return await map_hosts(one, list(fleet), timeout=timeout, what="command")
