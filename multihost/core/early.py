"""The early launch: in a pipelined, watched run, each host's launch goes out while the host
is being prepared, on a channel opened beside its staging, so the launch costs no round trip of
its own. It writes the run's files and waits at its gate, as a launch after preparing does
(``core.start`` takes it from there); the job needs the code only after the word.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from multihost.core.supervisor import Supervisor
from multihost.errors import HostError
from multihost.model import Host
from multihost.remote.commands import plan_host
from multihost.runs.launch import Ready, launch_ready
from multihost.transport import Connection, Shell


class EarlyLaunch:
    """Each host's launch channel being opened beside its staging (by process id), and the
    launch sent on it once the host's run directory is claimed and its code on its way.

    ``later``: the run has extra per-host steps after staging, so nothing launches early.
    """

    def __init__(self, sup: Supervisor, *, later: bool = False) -> None:
        self.sup, self.later = sup, later
        self.opening: dict[int, asyncio.Future[Shell]] = {}

    async def beside(self, host: Host, stage: Callable[[Host], Awaitable[None]]) -> None:
        """``stage`` (claim and stage), and meanwhile open the channel the launch will use: both
        channels open in one round trip, so the launch costs none of its own for them."""
        slot = self.sup.slots[host.process_id]
        assert slot.conn is not None
        opening = self.opening[host.process_id] = asyncio.ensure_future(slot.conn.shell())
        try:
            await stage(host)
        except BaseException:
            del self.opening[host.process_id]
            if slot.early is None:  # else the launch on it is held, then read to its end
                opening.cancel()
                with contextlib.suppress(asyncio.CancelledError, HostError):
                    await (await opening).close()  # opened after all: nothing will run on it
            raise
        self.launch(host)  # the code was there already: launch now
        del self.opening[host.process_id]
        if slot.early is None:
            slot.shell = await opening

    @property
    def allowed(self) -> bool:
        """Whether a host's launch may go out while it is being prepared: a watched run whose
        job needs nothing that a later phase makes (an environment, --setup, extra steps)."""
        opts = self.sup.options
        return not (opts.detach or opts.environment or opts.setup or self.later)

    def launch(self, host: Host) -> None:
        """Send ``host`` its launch on the channel opened beside its staging, once its run's
        directory is claimed and its code is on its way (or there): the launch's round trip is
        the staging's. It writes the run's files and waits at its gate, as a launch after
        preparing does (core.start takes it from there); the job needs the code only after the
        word. Not before host 0 is connected (its address is every host's coordinator)."""
        sup = self.sup
        slot = sup.slots[host.process_id]
        opening = self.opening.get(host.process_id)
        if opening is None or slot.early is not None or slot.conn is None or not self.allowed:
            return
        first = sup.fleet.hosts[0]
        conn0 = sup.slots[first.process_id].conn
        coordinator = first.internal_address or (conn0.peer_address if conn0 else None)
        if coordinator is None:
            return
        plan = plan_host(
            host, sup.fleet, sup.job, sup.code_hash, {first.process_id: coordinator}, watch=True
        )
        slot.early = asyncio.ensure_future(_launch_on(slot.conn, plan.launch, opening))


async def _launch_on(conn: Connection, script: str, opening: Awaitable[Shell]) -> Ready:
    """The launch on the shell being opened: sent, then ready at its gate."""
    return await launch_ready(conn, script, await opening)
