"""``--tunnel-through-iap``: TPU workers reached through ``gcloud start-iap-tunnel``.

As ``gcloud alpha compute tpus tpu-vm ssh --tunnel-through-iap`` does it
(``command_lib/compute/tpus/tpu_vm/ssh.py``, ``command_lib/util/ssh/ssh.py``
``_BuildIapTunnelProxyCommandArgs``): the connection goes to the worker's internal address
through the ProxyCommand ``gcloud alpha compute start-iap-tunnel INSTANCE %p --listen-on-stdin
--project=P --zone=Z --verbosity=warning``, where INSTANCE is the worker's instance name, the
guest attribute ``deviceInfo/hostname`` (one ``get-guest-attributes`` call per node).

Each tunnel is a gcloud process (~0.5 s of CPU to start, ~70 MB while open), so by default
only the first worker of each slice gets one; the slice's other workers are reached through
that worker's SSH connection (a ``direct-tcpip`` hop to their internal addresses, as
ProxyJump does), their host keys still checked end to end. ``per_host`` (``--iap-per-host``)
gives every worker its own tunnel, for networks where workers cannot reach each other.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from multihost.cloud import gcloud as runner
from multihost.cloud import tpus
from multihost.errors import CloudError, DiscoveryError
from multihost.model import Fleet, Host
from multihost.sources.tpu import stderr_message


def guest_attributes(
    node: str, project: str | None, zone: str | None, gcloud: str | None, timeout: float = 60
) -> Any:
    """The node's guest attributes (rows of key, namespace, value, worker_id), one gcloud call;
    a failure is a ``DiscoveryError`` naming the node."""
    argv = tpus.guest_attributes_argv(node, project, zone)
    try:
        proc = runner.run(argv, gcloud=gcloud, timeout=timeout)
    except CloudError as exc:
        raise DiscoveryError(f"cannot read {node}'s guest attributes: {exc}") from None
    if proc.returncode != 0:
        raise DiscoveryError(
            f"cannot read {node}'s guest attributes (exit {proc.returncode}): "
            f"{stderr_message(proc.stderr)}"
        )
    try:
        return json.loads(proc.stdout or "[]")
    except json.JSONDecodeError as exc:
        raise DiscoveryError(f"cannot parse {node}'s guest attributes: {exc}") from None


def hostnames(
    node: str,
    project: str | None,
    zone: str | None,
    gcloud: str | None = None,
    timeout: float = 60,
) -> dict[int, str]:
    """Worker id -> its instance name (``deviceInfo/hostname``), from one gcloud call."""
    rows = guest_attributes(node, project, zone, gcloud, timeout)
    return {
        int(r.get("worker_id", 0)): str(r["value"])
        for r in rows
        if isinstance(r, dict)
        and r.get("namespace") == "deviceInfo"
        and r.get("key") == "hostname"
        and r.get("value")
    }


def through_iap(
    fleet: Fleet,
    slice_names: Sequence[str],
    project: str | None,
    zone: str | None,
    gcloud: str | None = None,
    timeout: float = 60,
    per_host: bool = False,
) -> Fleet:
    """The fleet with every worker reached at its internal address: through an IAP tunnel of
    its own (``per_host``), else through the tunnelled first worker of its slice."""
    if not project or not zone:
        raise DiscoveryError("--tunnel-through-iap needs the project and zone (--project, --zone)")
    binary = gcloud or runner.binary()
    with ThreadPoolExecutor(max_workers=min(8, len(slice_names)) or 1) as pool:
        names = list(pool.map(lambda n: hostnames(n, project, zone, binary, timeout), slice_names))
    hosts = []
    hops: dict[int, Host] = {}  # slice -> its tunnelled worker
    for h in fleet:
        inside = replace(h, address=h.internal_address or h.address, reach_hint=None)
        if not per_host and (hop := hops.get(h.slice_id)) is not None:
            hosts.append(replace(inside, jump=hop))
            continue
        instance = names[h.slice_id].get(h.worker_id)
        if instance is None:
            raise DiscoveryError(
                f"{slice_names[h.slice_id]} worker {h.worker_id} publishes no deviceInfo/hostname "
                "guest attribute (its instance name, which the IAP tunnel needs)"
            )
        tunnelled = replace(
            inside, proxy_command=tpus.iap_tunnel_argv(binary, instance, project, zone)
        )
        hops[h.slice_id] = tunnelled
        hosts.append(tunnelled)
    return Fleet(tuple(hosts))
