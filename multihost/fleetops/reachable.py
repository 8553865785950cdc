"""Wait until every host accepts connections (``--wait``: fresh VMs start sshd late).

A host counts as up once an SSH handshake gets past the socket: a refused or timed-out
connection is retried, anything else (a login or host-key problem) is left to the run, which
says it with the host's name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from multihost.errors import ConnectError, HostKeyError
from multihost.fanout import map_hosts
from multihost.model import Fleet, Host
from multihost.transport import SSHOptions, connect


def _socket_level(exc: ConnectError) -> bool:
    """Nothing answered yet (refused, unreachable, timed out): worth trying again."""
    if isinstance(exc, HostKeyError):
        return False
    return exc.message.startswith(("cannot connect", "connect timed out")) or isinstance(
        exc, TimeoutError
    )


def _auth_failed(exc: ConnectError) -> bool:
    """The key is not (yet) accepted."""
    return not isinstance(exc, HostKeyError) and exc.message.startswith("authentication failed")


async def wait_reachable(
    fleet: Fleet,
    ssh: SSHOptions,
    seconds: float,
    say: Callable[[str], None],
    *,
    limit: int,
    poll: float = 2.0,
    auth: bool = False,
) -> int:
    """Try every host until it answers or ``seconds`` pass; says how many answered. Returns
    how many did (the run then reports those that did not, by name). ``auth``: a key was just
    added, so an authentication failure is retried too (the guest agent installs it late)."""
    start = time.monotonic()
    deadline = start + seconds
    gate = asyncio.Semaphore(limit)
    up = 0

    async def one(host: Host) -> None:
        nonlocal up
        while True:
            try:
                async with gate:
                    conn = await connect(host, ssh)
                await conn.close()
            except ConnectError as exc:
                if _socket_level(exc) or (auth and _auth_failed(exc)):
                    if time.monotonic() + poll > deadline:
                        return
                    await asyncio.sleep(poll)
                    continue
            up += 1
            return

    await map_hosts(one, list(fleet), what="connect")
    say(f"accepted by {up}/{len(fleet)} workers in {time.monotonic() - start:.0f} s")
    return up
