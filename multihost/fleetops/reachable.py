"""Wait until every host accepts connections (``--wait``: fresh VMs start sshd late; a key just
added to a TPU node's metadata: its guest agent installs it late).

A host counts only once it has accepted a login. A refused or timed-out connection is retried;
a refused login is retried only while a key just added may still be on its way; anything else
(a host-key problem) ends that host's wait. Hosts whose only address is internal and that do
not answer are said at once, with how to reach them, while the others are still waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from multihost.errors import ConnectError, HostKeyError
from multihost.model import Fleet, Host, host_ranges
from multihost.transport import SSHOptions, connect
from multihost.transport.fanout import map_hosts


@dataclass(frozen=True)
class Reached:
    """How a wait ended: how many hosts accepted, and each other host with its last error."""

    accepted: int
    failed: tuple[tuple[Host, ConnectError], ...] = ()

    @property
    def refused(self) -> tuple[tuple[Host, ConnectError], ...]:
        """The hosts that answered but refused the login (the key is not accepted there)."""
        return tuple((h, e) for h, e in self.failed if _auth_failed(e))


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


def unanswered(hosts: list[Host], seconds: float) -> list[str]:
    """What is said at once about hosts that do not answer and have a hint on how to reach
    them (only an internal address): one line per hint, naming the hosts and addresses."""
    by_hint: dict[str, list[Host]] = {}
    for h in sorted(hosts, key=lambda h: h.process_id):
        by_hint.setdefault(h.reach_hint or "", []).append(h)
    lines = []
    for hint, group in by_hint.items():
        shown = ", ".join(h.address for h in group[:4]) + (", …" if len(group) > 4 else "")
        lines.append(
            f"{host_ranges(group)} ({shown}) do not answer; {hint} "
            f"(still waiting, up to {seconds:.0f} s)"
        )
    return lines


async def wait_reachable(
    fleet: Fleet,
    ssh: SSHOptions,
    seconds: float,
    say: Callable[[str], None],
    *,
    limit: int,
    poll: float = 2.0,
    auth: bool = False,
) -> Reached:
    """Try every host until it accepts a login or ``seconds`` pass; says how many did. Returns
    that and the others with their last error (the caller decides: a run reports them by name).
    ``auth``: a key was just added, so a refused login is retried too (the guest agent installs
    it late)."""
    start = time.monotonic()
    deadline = start + seconds
    gate = asyncio.Semaphore(limit)
    accepted = 0
    failed: dict[int, tuple[Host, ConnectError]] = {}
    # hosts with a hint on how to reach them: once each has tried, those that did not answer
    # are said at once (not when the wait ends)
    hinted = {h.process_id for h in fleet if h.reach_hint}
    silent: list[Host] = []

    def first_try(host: Host, socket: bool) -> None:
        if host.process_id not in hinted:
            return
        hinted.discard(host.process_id)
        silent.extend([host] if socket else [])
        if not hinted and silent:
            for line in unanswered(silent, seconds):
                say(line)

    async def one(host: Host) -> None:
        nonlocal accepted
        tried = False
        while True:
            try:
                async with gate:
                    conn = await connect(host, ssh)
                await conn.close()
            except ConnectError as exc:
                failed[host.process_id] = (host, exc)
                socket = _socket_level(exc)
                if not tried:
                    tried = True
                    first_try(host, socket)
                if socket or (auth and _auth_failed(exc)):
                    if time.monotonic() + poll > deadline:
                        return
                    await asyncio.sleep(poll)
                    continue
                return
            failed.pop(host.process_id, None)
            accepted += 1
            if not tried:
                first_try(host, False)
            return

    await map_hosts(one, list(fleet), what="connect")
    said = f"accepted by {accepted}/{len(fleet)} workers in {time.monotonic() - start:.0f} s"
    if failed:
        said += f" (not by {host_ranges([h for h, _ in failed.values()])})"
    say(said)
    return Reached(accepted, tuple(failed[k] for k in sorted(failed)))
