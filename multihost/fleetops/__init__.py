"""Operations on a whole fleet outside a run: preflight checks and stale accelerator holders."""

from __future__ import annotations

from multihost.defaults import DEFAULTS
from multihost.errors import RemoteError
from multihost.fanout import Outcome, on_every_host
from multihost.fleetops.preflight import check_command, parse_check, port_command
from multihost.fleetops.stale import StaleReport, parse_stale, stale_command
from multihost.model import Fleet
from multihost.transport import Connection, SSHOptions


async def check(
    fleet: Fleet, ssh: SSHOptions, base: str, port: int, *, limit: int = DEFAULTS.connect_limit
) -> list[Outcome[dict[str, str]]]:
    """Preflight facts per host; the coordinator port is checked on host 0 only."""

    async def one(conn: Connection) -> dict[str, str]:
        first = conn.host.process_id == 0
        res = await conn.run(check_command(conn.host.remote_dir or base, port if first else None))
        return parse_check(res.stdout.decode(errors="replace"))

    return await on_every_host(fleet, ssh, one, limit=limit)


async def coordinator_port_busy(fleet: Fleet, ssh: SSHOptions, port: int) -> str | None:
    """Why host 0 cannot bind the coordinator port, or None (also when it cannot be asked:
    the run then reports that host itself)."""

    async def one(conn: Connection) -> str | None:
        res = await conn.run(port_command(port))
        state = parse_check(res.stdout.decode(errors="replace")).get("coordinator_port", "")
        if not state.startswith("in use"):  # free, or no python3 there to ask
            return None
        return state.removeprefix("in use").strip(" ()") or "in use"

    [outcome] = await on_every_host(Fleet(fleet.hosts[:1]), ssh, one)
    return outcome.value


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
