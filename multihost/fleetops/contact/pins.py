"""TPU workers' host keys pinned from their nodes' guest attributes.

The guest agent publishes each worker's host keys as guest attributes (namespace ``hostkeys``,
key ``ssh-ed25519`` etc., the base64 field only; ``gcloud compute tpus tpu-vm
get-guest-attributes NODE --format=json``: rows of key, namespace, value, worker_id). gcloud
itself trusts TPU VMs on first use; we pin: a worker must present one of its published keys.
A node that publishes none is trusted on first use, and the run says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from multihost.model import Fleet
from multihost.sources.iap import guest_attributes


@dataclass(frozen=True)
class Pins:
    """Address -> its published keys (``<type> <base64>``), and the nodes that publish none."""

    keys: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unpublished: tuple[str, ...] = ()


def published(rows: object) -> dict[int, tuple[str, ...]]:
    """Worker id -> its host keys from ``get-guest-attributes`` rows."""
    out: dict[int, list[str]] = {}
    for r in rows if isinstance(rows, list) else ():
        if not isinstance(r, Mapping) or r.get("namespace") != "hostkeys":
            continue
        kind, value = str(r.get("key") or ""), str(r.get("value") or "").strip()
        if kind and value and " " not in value:
            out.setdefault(int(r.get("worker_id") or 0), []).append(f"{kind} {value}")
    return {w: tuple(k) for w, k in out.items()}


def pin(
    fleet: Fleet,
    nodes: Sequence[str],
    project: str | None,
    zone: str | None,
    gcloud: str | None = None,
) -> Pins:
    """Each worker's published host keys (one gcloud call per node, in parallel)."""
    with ThreadPoolExecutor(max_workers=min(8, len(nodes)) or 1) as pool:
        found = list(
            pool.map(lambda n: published(guest_attributes(n, project, zone, gcloud)), nodes)
        )
    keys: list[tuple[str, tuple[str, ...]]] = []
    for h in fleet.reached():  # a hop too: its key is checked on the way to the hosts behind it
        mine = found[h.slice_id].get(h.worker_id) if h.slice_id < len(found) else None
        if mine:
            keys.append((h.address, mine))
    unpublished = tuple(n for n, f in zip(nodes, found, strict=True) if not f)
    return Pins(tuple(keys), unpublished)
