"""SSH connections shared within one event loop: a hop's connection serves every host reached
through it (and the hop host's own steps), so a slice behind IAP costs one tunnel, and a
bastion one connection, however many hosts are behind it.

A connection is opened once per key by whoever asks first; everyone asking while it opens
waits for the same outcome (a hop that cannot be reached fails all of its hosts with the same
cause); it closes when the last user lets go. A connection that closed on its own (a lost hop)
is never handed out again: the next ask opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from multihost.model import Host


class Closable(Protocol):
    """What the pool needs of a connection (asyncssh's has it)."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...

    def is_closed(self) -> bool: ...


C = TypeVar("C", bound=Closable)
Opener = Callable[[], Awaitable[tuple[C, Callable[[], Awaitable[None]]]]]


@dataclass(eq=False)
class Lease(Generic[C]):
    """One user's hold on a shared connection; ``release`` once (again is a no-op)."""

    _entry: _Entry[C]
    _pool: Pool[C]
    released: bool = False

    @property
    def conn(self) -> C:
        """The connection (open when the lease was given)."""
        return self._entry.opening.result()

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await self._pool.drop(self._entry)


@dataclass(eq=False)
class _Entry(Generic[C]):
    key: Hashable
    opening: asyncio.Future[C] = field(init=False)
    users: int = 0
    # what to do once the connection is closed (let go of the hop it was opened through)
    after: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def usable(self) -> bool:
        if not self.opening.done():
            return True
        if self.opening.cancelled() or self.opening.exception() is not None:
            return False
        return not self.opening.result().is_closed()


class Pool(Generic[C]):
    """Connections by key, counted by user."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry[C]] = {}
        self.opened = 0  # connections opened so far (what a test counts)

    async def lease(self, key: Hashable, opener: Opener[C], retry: bool = True) -> Lease[C]:
        """The open connection for ``key``, opened by ``opener`` when there is none; raises
        what opening it raised."""
        entry = self._entries.get(key)
        if entry is None or not entry.usable():
            entry = _Entry(key)
            entry.opening = asyncio.ensure_future(self._open(opener, entry))
            self._entries[key] = entry
            entry.opening.add_done_callback(lambda f: f.cancelled() or f.exception())
        entry.users += 1
        lease = Lease(entry, self)
        try:
            conn = await asyncio.shield(entry.opening)
        except BaseException:
            await lease.release()
            raise
        if conn.is_closed() and retry:  # lost between its opening and this ask: once more
            await lease.release()
            return await self.lease(key, opener, retry=False)
        return lease

    async def _open(self, opener: Opener[C], entry: _Entry[C]) -> C:
        conn, after = await opener()
        self.opened += 1
        entry.after.append(after)
        return conn

    async def drop(self, entry: _Entry[C]) -> None:
        entry.users -= 1
        if entry.users > 0:
            return
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        if not entry.opening.done():
            entry.opening.cancel()
            return
        if entry.opening.cancelled() or entry.opening.exception() is not None:
            return
        conn = entry.opening.result()
        conn.close()
        with contextlib.suppress(Exception):
            await conn.wait_closed()
        for after in entry.after:
            await after()


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool[Any]] = (
    weakref.WeakKeyDictionary()
)


def pool() -> Pool[Any]:
    """This event loop's pool (connections belong to the loop that opened them)."""
    loop = asyncio.get_running_loop()
    found = _POOLS.get(loop)
    if found is None:
        found = _POOLS[loop] = Pool()
    return found


def jump_host(spec: str) -> Host:
    """The last hop of a ProxyJump value (``[user@]host[:port]``, comma-separated, or
    ``ssh://`` URIs), reached through the ones before it."""
    jump: Host | None = None
    for part in spec.split(","):
        text = part.strip().removeprefix("ssh://")
        user, _, rest = text.rpartition("@")
        address, port = rest, None
        if rest.startswith("["):  # [IPv6]:port
            address, _, tail = rest[1:].partition("]")
            port = tail.removeprefix(":") or None
        elif rest.count(":") == 1:
            address, port = rest.split(":")
        jump = Host(
            address,
            user=user or None,
            port=int(port) if port and port.isdigit() else None,
            jump=jump,
        )
    assert jump is not None  # split always yields at least one part
    return jump
