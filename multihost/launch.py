"""Detached start on a host, and stopping it: the run's state lives in plain files there."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from multihost.defaults import DEFAULTS
from multihost.errors import RemoteError, UsageError
from multihost.fanout import Outcome, map_hosts
from multihost.model import Host
from multihost.plan import Paths, claim_command, kill_command, release_command
from multihost.transport import Connection


async def claim(
    hosts: Sequence[Host],
    conns: Mapping[int, Connection],
    paths: Mapping[int, Paths],
    timeout: float,
) -> list[Outcome[None]]:
    """Create the run's directory on every host before any job starts. If the name is taken
    on any host, the others' claims are released and nothing starts anywhere (UsageError)."""
    taken: list[Host] = []

    async def one(host: Host) -> None:
        res = await conns[host.process_id].run(claim_command(paths[host.process_id]))
        if res.exit_status == 3:
            taken.append(host)
        if res.exit_status != 0:
            err = res.stderr.decode(errors="replace").strip().splitlines()
            raise RemoteError(host, err[-1] if err else f"claim failed (exit {res.exit_status})")

    outcomes = await map_hosts(one, hosts, timeout=timeout, what="claim")
    if all(o.ok for o in outcomes):
        return outcomes

    async def release(host: Host) -> None:
        await conns[host.process_id].run(release_command(paths[host.process_id]))

    await map_hosts(release, [o.host for o in outcomes if o.ok], timeout=timeout, what="release")
    if taken:
        names = ", ".join(h.name for h in sorted(taken, key=lambda h: h.process_id))
        raise UsageError(
            f"the run name already exists on {names}: nothing was started on any host; "
            "use a new --run-name"
        )
    return outcomes


async def launch(conn: Connection, script: str) -> int:
    """Start the job detached (own session, stdin from /dev/null) with the host's launch script
    (``HostPlan.launch``); returns its process group."""
    res = await conn.run(script)
    text = res.stdout.decode(errors="replace").strip()
    if res.exit_status != 0 or not text.isdigit():
        err = res.stderr.decode(errors="replace").strip().splitlines()
        raise RemoteError(conn.host, f"launch failed: {err[-1] if err else text or 'no output'}")
    return int(text)


async def stop(
    conn: Connection, paths: Paths, signal: str = "TERM", grace: float = DEFAULTS.grace
) -> str:
    """Signal the job's process group, KILL it after ``grace`` s; says what it found or did."""
    res = await conn.run(kill_command(paths, signal, grace))
    if res.exit_status != 0:
        raise RemoteError(conn.host, f"stop failed: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode().strip() or "unknown"
