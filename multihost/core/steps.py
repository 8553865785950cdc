"""The per-host preparation steps beside connecting and staging: host 0's coordinator port
check (:func:`port_free`), the stale check (:func:`stale_check`), and the extra steps
(:class:`HostStep`): what one is, and which a run takes (:func:`host_steps`).
:mod:`.prepare` runs the extra steps on each host after the code is staged and the run's
directory claimed, before any launch.

**Adding a per-host step** (an environment sync, a first-contact check): write
``async def my_step(sup: Supervisor, host: Host) -> None`` that uses
``sup.slots[host.process_id].conn`` and ``sup.paths(host)`` and raises a ``HostError`` on
failure, and append ``HostStep("my step", my_step, timeout)`` in :func:`host_steps` when its
option is on. It runs on each host once the code is there and the run's directory is claimed;
a failure (or its timeout) names the host and nothing starts anywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from multihost.core.supervisor import Supervisor
from multihost.defaults import DEFAULTS
from multihost.errors import PortBusy
from multihost.fleetops import port_busy, stale_on
from multihost.model import Host
from multihost.options import RunOptions


@dataclass(frozen=True)
class HostStep:
    """An extra per-host preparation step, after the code is staged and before any launch."""

    name: str  # says what timed out: "<name> timed out after <timeout> s"
    run: Callable[[Supervisor, Host], Awaitable[None]]
    timeout: float = DEFAULTS.command_timeout


def host_steps(options: RunOptions) -> tuple[HostStep, ...]:
    """The extra per-host steps a run with ``options`` takes, in order: none yet. Add one
    here, keyed on its option (``if options.X: steps.append(HostStep(...))``)."""
    return ()


async def port_free(sup: Supervisor, host: Host) -> None:
    """Raises PortBusy when ``host`` is host 0 and cannot bind the coordinator port."""
    slot = sup.slots[host.process_id]
    if host.process_id != 0 or slot.conn is None:
        return
    if why := await port_busy(slot.conn, sup.job.coordinator_port):
        raise PortBusy(host, why)


async def stale_check(sup: Supervisor, host: Host) -> None:
    """Processes holding ``host``'s accelerator (and its lock file), said as a warning; with
    ``--kill-stale`` they are stopped."""
    slot = sup.slots[host.process_id]
    assert slot.conn is not None
    kill = sup.options.stale == "kill"
    found = await stale_on(slot.conn, kill=kill, device_glob=sup.options.device_glob)
    if found.holders or found.lockfile:
        hint = "" if kill else " (--kill-stale stops them)"
        sup.note(f"{host.name}: {found.summary()}{hint}", "warning")
