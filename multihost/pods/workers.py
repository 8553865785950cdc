"""A pod's workers: reached as ``run --prefix`` reaches them (first contact: the user's key
added to the nodes where missing, host keys pinned from the guest attributes), each asked
whether it accepts SSH, and one command run on worker 0 of slice 0 (autodown's daemon).

``access`` is how the workers are reached, by the settings' names (``ssh_config``,
``no_add_key``, ``ip``, ``user``, ``host_keys``, ``tunnel_through_iap``...: a command's
``vars(args)`` or the API's keywords); where the pod is comes from its record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from multihost.defaults import DEFAULTS as D
from multihost.errors import MultihostError
from multihost.fleetops.reach import Reach, ReachSettings, reach
from multihost.pods.records import PodRecord

Say = Callable[[str], None]

# settings that say which fleet, not how to reach it: the pod's record says which
_WHICH = frozenset(
    {"hosts", "local", "prefix", "zone", "project", "workers", "exclude_workers", "wait"}
    | {"dry_run", "progress", "fleet", "ssh"}
)


class WorkersRefused(MultihostError):
    """The pod is ACTIVE but some of its workers do not accept SSH (each named)."""


def access_of(given: Mapping[str, Any]) -> dict[str, Any]:
    """How to reach a pod's workers, out of a command's settings (others are not ours)."""
    names = ReachSettings.names()
    return {k: v for k, v in given.items() if k in names and k not in _WHICH and v is not None}


def reached(record: PodRecord, access: Mapping[str, Any], say: Say, *, add_key: bool) -> Reach:
    """The pod's workers and how to reach them; what the source and first contact had to say
    is said."""
    where = reach(
        {
            **access_of(access),
            "prefix": record.name,
            "zone": record.zone,
            "project": record.project,
            "progress": say,
        },
        add_key=add_key,
    )
    for text in (*where.warnings, *where.notes):
        say(text)
    return where


def accept_ssh(record: PodRecord, access: Mapping[str, Any], say: Say) -> int:
    """Every worker accepts SSH (first contact made as ``run`` makes it); their number.
    Raises :class:`WorkersRefused` naming each worker that does not."""
    from multihost import fleetops
    from multihost.bridge import blocking

    where = reached(record, access, say, add_key=True)
    outcomes = blocking(lambda: fleetops.check(where.fleet, where.ssh, D.remote_dir, 1))
    bad = [(h, o) for h, o in zip(where.fleet, outcomes, strict=True) if not o.ok]
    if bad:
        lines = "".join(f"\n  {h.name}: {o.error.message if o.error else 'failed'}" for h, o in bad)
        raise WorkersRefused(
            f"pod {record.name} is up but {len(bad)}/{len(outcomes)} workers do not accept "
            f"SSH; it keeps costing: multihost down {record.name}{lines}"
        )
    return len(outcomes)


def on_worker0(where: Reach, command: str, stdin: bytes | None = None) -> str:
    """Run ``command`` on worker 0 of slice 0; its stdout, or a MultihostError naming it."""
    from multihost.bridge import blocking
    from multihost.model import Fleet
    from multihost.transport import Connection
    from multihost.transport.fanout import on_every_host

    host = where.fleet.hosts[0]

    async def one(conn: Connection) -> str:
        res = await conn.run(command, stdin)
        if res.exit_status != 0:
            why = res.stderr.decode(errors="replace").strip()[-300:]
            raise MultihostError(f"{host.name}: exit {res.exit_status}: {why}")
        return res.stdout.decode(errors="replace")

    (out,) = blocking(lambda: on_every_host(Fleet((host,)), where.ssh, one, limit=1))
    if not out.ok or out.value is None:
        raise MultihostError(f"{host.name}: {out.error.message if out.error else 'failed'}")
    return out.value
