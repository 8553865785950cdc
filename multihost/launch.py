"""Detached start on a host, and stopping it: the run's state lives in plain files there."""

from __future__ import annotations

from multihost.defaults import DEFAULTS
from multihost.errors import RemoteError
from multihost.plan import Paths, kill_command
from multihost.transport import Connection


async def launch(conn: Connection, script: str) -> int:
    """Start the job detached (own session, stdin from /dev/null) with the host's launch script
    (``HostPlan.launch``); returns its process group."""
    res = await conn.run("sh -s", stdin=script.encode())
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
