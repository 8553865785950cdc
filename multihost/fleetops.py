"""Operations on a whole fleet outside a run: preflight checks and stale accelerator holders."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from multihost.errors import RemoteError
from multihost.fanout import Outcome, map_hosts
from multihost.model import Fleet, Host
from multihost.preflight import check_command, parse_check
from multihost.stale import StaleReport, parse_stale, stale_command
from multihost.transport import Connection, SSHOptions, connect

T = TypeVar("T")


async def on_every_host(
    fleet: Fleet,
    ssh: SSHOptions,
    fn: Callable[[Connection], Awaitable[T]],
    *,
    limit: int = 64,
    timeout: float = 120.0,
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


async def check(
    fleet: Fleet, ssh: SSHOptions, base: str, port: int
) -> list[Outcome[dict[str, str]]]:
    """Preflight facts per host; the coordinator port is checked on host 0 only."""

    async def one(conn: Connection) -> dict[str, str]:
        first = conn.host.process_id == 0
        res = await conn.run(check_command(conn.host.remote_dir or base, port if first else None))
        return parse_check(res.stdout.decode(errors="replace"))

    return await on_every_host(fleet, ssh, one)


async def stale_on(
    conn: Connection, *, kill: bool, device_glob: str | None, grace: float = 5.0
) -> StaleReport:
    """Find (and with ``kill`` stop) processes holding accelerator devices on one host."""
    res = await conn.run(stale_command(kill=kill, device_glob=device_glob, grace=grace))
    if res.exit_status not in (0, None):
        err = res.stderr.decode(errors="replace").strip()
        raise RemoteError(conn.host, f"stale check failed: {err or res.exit_status}")
    return parse_stale(res.stdout.decode(errors="replace"))


async def kill_stale(
    fleet: Fleet, ssh: SSHOptions, *, device_glob: str | None, kill: bool = True
) -> list[Outcome[StaleReport]]:
    """``multihost kill-stale``: stop accelerator holders on every host."""
    return await on_every_host(
        fleet, ssh, lambda conn: stale_on(conn, kill=kill, device_glob=device_glob)
    )
