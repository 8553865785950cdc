"""Zones, regions and capacity in the TPU API stand-in, shaped as the real service answers.

A resource lives in its zone. A region can refuse a capacity type at once for quota (the
synchronous ``RESOURCE_EXHAUSTED`` of ``queuedResources.create``); a zone with no capacity
accepts the request, keeps it WAITING_FOR_RESOURCES and FAILs it (code 8, the service's
capacity message) at its valid-until (``queueingPolicy.validUntilDuration``, as gcloud's
``--valid-until-duration`` sends it).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

PROJECT_NUMBER = "1234567890"  # project "p" by number, as VMs' metadata names it
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]*)?)s$")

# The zones of the Cloud TPU API's locations (a subset: those of the regions TPUs are in); a
# request for any other location is refused as the service refuses it.
ZONES = frozenset(
    f"{region}-{z}"
    for region, letters in (
        ("us-central1", "abcf"),
        ("us-central2", "b"),
        ("us-east1", "bcd"),
        ("us-east4", "abc"),
        ("us-east5", "abc"),
        ("us-south1", "a"),
        ("us-west1", "abc"),
        ("us-west4", "ab"),
        ("europe-west4", "ab"),
        ("asia-east1", "c"),
        ("asia-northeast1", "b"),
        ("asia-southeast1", "b"),
        ("southamerica-west1", "a"),
    )
    for z in letters
)
# The accelerator types the service offers, by generation (every zone here offers each, so a
# test picks its zone freely); its own list, not multihost's (multihost's is under test).
_SIZES = {
    "v2": (8, 32, 128, 256, 512),
    "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
    "v4": (8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1152, 1536, 2048, 2304, 3072, 3456, 4096),
    "v5p": (8, 16, 32, 64, *range(128, 8449, 128), 12288),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}
ACCELERATOR_TYPES = frozenset(f"{g}-{n}" for g, sizes in _SIZES.items() for n in sizes)


def workers_of(accelerator_type: str) -> int:
    """TPU VM workers of one slice: v2, v3, v4 and v5p count cores, 8 a host; v5litepod and
    v6e count chips, one host up to 8, then 4 a host."""
    generation, _, size = accelerator_type.rpartition("-")
    n = int(size)
    if generation in ("v5litepod", "v6e"):
        return 1 if n <= 8 else n // 4
    return max(1, n // 8)


def unknown_location(zone: str) -> str:
    return f"Location {zone} is not found or access is unauthorized."


def unknown_type(accelerator_type: str, zone: str) -> str:
    return f'Accelerator type "{accelerator_type}" not found in zone "{zone}".'


def region_of(zone: str) -> str:
    """``us-central2-b`` -> ``us-central2``."""
    return zone.rsplit("-", 1)[0]


def capacity_type(body: dict[str, Any]) -> str:
    """The request's capacity type, as quota counts it."""
    if "spot" in body:
        return "spot"
    if "bestEffort" in body:
        return "best-effort"
    if "guaranteed" in body or body.get("reservationName"):
        return "reserved"
    return "on-demand"


def valid_for(body: dict[str, Any]) -> float | None:
    """Seconds after creation at which the service gives up (None: never)."""
    policy = body.get("queueingPolicy") or {}
    m = _DURATION.match(str(policy.get("validUntilDuration", "")))
    return float(m[1]) if m else None


def quota_message(region: str, ctype: str, accelerator_type: str) -> str:
    family = accelerator_type.split("-", 1)[0].upper()
    kind = "Preemptible" if ctype in ("spot", "best-effort") else ""
    return (
        f"Quota limit 'TPU{family}{kind}PodPerProjectPerRegionForTPUAPI' has been exceeded. "
        f"Limit: 0 in region {region}."
    )


def no_capacity(zone: str) -> dict[str, Any]:
    """``state.failedData`` of a request the zone had no capacity for (code 8)."""
    message = (
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
        "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
        "[EID: 0x5eb0c0ffee]"
    )
    return {"failedData": {"error": {"code": 8, "message": message}}}


@dataclass
class Capacity:
    """What the stand-in's zones can give."""

    quota: set[tuple[str, str]] = field(default_factory=set)  # (region, capacity type) refused
    starved: set[str] = field(default_factory=set)  # zones with no capacity at all
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refuse_quota(self, region: str, ctype: str = "on-demand") -> None:
        with self.lock:
            self.quota.add((region, ctype))

    def starve(self, zone: str) -> None:
        with self.lock:
            self.starved.add(zone)

    def clear(self) -> None:
        with self.lock:
            self.quota.clear()
            self.starved.clear()
