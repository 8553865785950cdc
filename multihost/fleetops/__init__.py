"""Operations on a whole fleet outside a run: reaching it (``reach``; first contact with a
--prefix fleet: ``contact``), preflight checks and stale accelerator holders."""

from __future__ import annotations

from multihost.defaults import DEFAULTS
from multihost.errors import RemoteError
from multihost.fleetops.preflight import check_command, parse_check, port_command
from multihost.fleetops.stale import StaleReport, parse_stale, stale_command
from multihost.model import Fleet
from multihost.transport import Connection, SSHOptions
from multihost.transport.fanout import Outcome, on_every_host


async def check(
    fleet: Fleet, ssh: SSHOptions, base: str, port: int, *, limit: int = DEFAULTS.connect_limit
) -> list[Outcome[dict[str, str]]]:
    """Preflight facts per host; the coordinator port is checked on host 0 only."""

    async def one(conn: Connection) -> dict[str, str]:
        first = conn.host.process_id == 0
        res = await conn.run(check_command(conn.host.remote_dir or base, port if first else None))
        return parse_check(res.stdout.decode(errors="replace"))

    return await on_every_host(fleet, ssh, one, limit=limit)


async def port_busy(conn: Connection, port: int) -> str | None:
    """Why this host cannot bind ``port`` (a run checks its coordinator port on host 0), or
    None: free, or no python3 there to ask (the job itself then says what is wrong)."""
    res = await conn.run(port_command(port))
    state = parse_check(res.stdout.decode(errors="replace")).get("coordinator_port", "")
    if not state.startswith("in use"):
        return None
    return state.removeprefix("in use").strip(" ()") or "in use"


async def stale_on(
    conn: Connection, *, kill: bool, device_glob: str | None, grace: float = DEFAULTS.stale_grace
) -> StaleReport:
    """Find (and with ``kill`` stop) processes holding accelerator devices on one host."""
    res = await conn.run(stale_command(kill=kill, device_glob=device_glob, grace=grace))
    if res.exit_status not in (0, None):
        err = res.stderr.decode(errors="replace").strip()
        raise RemoteError(conn.host, f"stale check failed: {err or res.exit_status}")
    return parse_stale(res.stdout.decode(errors="replace"))


async def kill_stale(
    fleet: Fleet,
    ssh: SSHOptions,
    *,
    device_glob: str | None,
    kill: bool = True,
    limit: int = DEFAULTS.connect_limit,
) -> list[Outcome[StaleReport]]:
    """``multihost kill-stale``: stop accelerator holders on every host."""
    return await on_every_host(
        fleet, ssh, lambda conn: stale_on(conn, kill=kill, device_glob=device_glob), limit=limit
    )
