"""Where hosts come from: host lists and inventories, ``--local``, Cloud TPU discovery.

Each source is one function ``FleetSpec -> Found`` registered in ``SOURCES`` under the name of
the :class:`FleetSpec` field that selects it. A new source is a module here, a field of
``FleetSpec`` and one line in ``SOURCES``; the CLI and the API pick it up from there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from multihost.defaults import IP_MODES as IP_MODES  # what --prefix connects to
from multihost.errors import UsageError
from multihost.model import Fleet


@dataclass(frozen=True)
class FleetSpec:
    """Which hosts to run on: exactly one source (``hosts``, ``local`` or ``prefix``) and the
    options that shape it."""

    hosts: str | None = None  # [user@]host[:port],... or a TOML inventory
    local: int | None = None  # N workers on this machine
    prefix: str | None = None  # Cloud TPU node or queued-resource name
    project: str | None = None  # with prefix: gcloud project
    zone: str | None = None  # with prefix: gcloud zone
    ip: str = "auto"  # with prefix: internal | external | auto
    user: str | None = None  # ssh user for every host (overrides the source's)
    tunnel_through_iap: bool = False  # with prefix: workers through IAP tunnels
    iap_per_host: bool = False  # with tunnel_through_iap: a tunnel per worker, not per slice

    @property
    def source(self) -> str:
        given = [name for name in SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise UsageError(f"give exactly one of {', '.join(SOURCES)}")
        return given[0]

    @property
    def cloud(self) -> bool:
        """Cloud VMs: fresh host keys per create (trust on first use), the gcloud ssh key,
        and accelerator devices that stale processes may hold."""
        return SOURCES[self.source].cloud


@dataclass(frozen=True)
class Found:
    """A resolved fleet and what the source had to say about it."""

    fleet: Fleet
    warnings: tuple[str, ...] = ()
    cloud: CloudFound | None = None  # a --prefix fleet: where it is and its nodes


@dataclass(frozen=True)
class CloudFound:
    """Where a --prefix fleet lives and its nodes as discovery listed them."""

    project: str | None
    zone: str | None
    nodes: tuple[Mapping[str, Any], ...]
    gcloud: str | None = None  # the gcloud binary; None: ``$MULTIHOST_GCLOUD`` or ``gcloud``


@dataclass(frozen=True)
class Source:
    resolve: Callable[[FleetSpec], Found]
    cloud: bool = False


def _hosts(spec: FleetSpec) -> Found:
    from multihost.sources.inventory import resolve_hosts

    return Found(resolve_hosts(str(spec.hosts)))


def _local(spec: FleetSpec) -> Found:
    from multihost.sources.inventory import local_fleet

    return Found(local_fleet(int(spec.local or 0)))


def _prefix(spec: FleetSpec) -> Found:
    from multihost.sources.tpu import discover

    found = discover(str(spec.prefix), project=spec.project, zone=spec.zone, ip=spec.ip)
    where = CloudFound(found.project, found.zone, found.nodes)
    if spec.tunnel_through_iap:
        from multihost.sources.iap import through_iap

        fleet = through_iap(
            found.fleet,
            found.slice_names,
            found.project,
            found.zone,
            per_host=spec.iap_per_host,
        )
        return Found(fleet, found.warnings, where)
    return Found(found.fleet, found.warnings, where)


SOURCES: dict[str, Source] = {
    "hosts": Source(_hosts),
    "local": Source(_local),
    "prefix": Source(_prefix, cloud=True),
}


def resolve(spec: FleetSpec) -> Found:
    """The fleet a spec names, numbered slice-major, with ``user`` applied to every host."""
    if spec.tunnel_through_iap and spec.source != "prefix":
        raise UsageError(
            "--tunnel-through-iap goes with --prefix (for other hosts, put a "
            "ProxyCommand or ProxyJump in your ssh config)"
        )
    if spec.iap_per_host and not spec.tunnel_through_iap:
        raise UsageError("--iap-per-host goes with --tunnel-through-iap")
    if spec.source == "prefix" and not (spec.prefix or "").strip():
        raise UsageError("--prefix is empty: name the queued resource (or node) to run on")
    found = SOURCES[spec.source].resolve(spec)
    if spec.user:
        fleet = Fleet(tuple(h.with_user(spec.user) for h in found.fleet))
        found = replace(found, fleet=fleet)
    return found
