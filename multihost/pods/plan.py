"""Pure planning of a pod's requests: checked input, the zones in order, the labels, each
gcloud command line (``queued-resources create/describe/delete/list``), and what a failure
means for the next zone. Nothing here runs anything."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multihost.cloud import queued
from multihost.cloud.gcloud import error_class, one_line
from multihost.errors import CloudAlreadyExists, CloudNoCapacity, CloudQuotaExhausted, UsageError
from multihost.pods.prices import region_of
from multihost.pods.records import PodRecord

LABEL = "multihost"  # every request multihost makes carries multihost=<pod name>
CAPACITIES = ("on-demand", "spot", "reserved", "best-effort")
_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
_TPU_TYPE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-([1-9][0-9]*)$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
# A request in these states can never run again (it still holds quota until deleted).
DEAD = ("FAILED", "SUSPENDED")
WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")


def check_name(name: str) -> str:
    """A pod's name is its queued resource's (and its nodes' prefix): the TPU API's rule."""
    if not _NAME.match(name):
        raise UsageError(
            f"bad pod name {name!r}: a lowercase letter, then lowercase letters, digits or '-' "
            "(at most 40, not ending in '-')"
        )
    return name


def check_tpu_type(tpu_type: str) -> str:
    """A Cloud TPU accelerator type: v2, v3, v4, v5p (the suffix counts cores), v5litepod,
    v6e (it counts chips), e.g. v4-16, v5litepod-16, v5p-8, v6e-8."""
    if not _TPU_TYPE.match(tpu_type):
        raise UsageError(
            f"unknown TPU type {tpu_type!r}: expected e.g. v4-16, v5litepod-16, v5p-8, v6e-8"
        )
    return tpu_type


def check_zone(zone: str) -> str:
    if not _ZONE.match(zone):
        raise UsageError(f"bad zone {zone!r}: expected e.g. us-central2-b")
    return zone


def zones_of(zone: str | None, zones: str | None) -> tuple[str, ...]:
    """``--zones A,B,C`` (tried in order) or ``--zone Z``; one of them is required."""
    if zone and zones:
        raise UsageError("give --zone or --zones, not both")
    listed = [z.strip() for z in (zones or zone or "").split(",") if z.strip()]
    if not listed:
        raise UsageError("up needs --zone ZONE or --zones A,B,C")
    if len(set(listed)) != len(listed):
        raise UsageError(f"--zones names a zone twice: {zones}")
    return tuple(check_zone(z) for z in listed)


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h``, ``1d`` (bare numbers are seconds)."""
    m = _DURATION.match(text.strip())
    if not m or float(m[1]) <= 0:
        raise UsageError(f"bad duration {text!r}: expected e.g. 600, 90s, 15m, 2h")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def gcloud_duration(seconds: float) -> str:
    """As gcloud's ``--valid-until-duration`` takes it: whole seconds, ``900s``."""
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class PodSpec:
    """What ``up`` asks for, checked."""

    name: str
    tpu_type: str
    runtime_version: str
    zones: tuple[str, ...]
    num_slices: int = 1
    capacity: str = "on-demand"
    project: str | None = None
    queue_timeout: float = 900.0

    def __post_init__(self) -> None:
        check_name(self.name)
        check_tpu_type(self.tpu_type)
        if self.capacity not in CAPACITIES:
            raise UsageError(f"unknown capacity {self.capacity!r}")
        if self.num_slices < 1:
            raise UsageError("--num-slices must be at least 1")

    def record(self, zone: str, now: float) -> PodRecord:
        return PodRecord(
            name=self.name,
            tpu_type=self.tpu_type,
            num_slices=self.num_slices,
            runtime_version=self.runtime_version,
            capacity=self.capacity,
            zone=zone,
            project=self.project,
            zones=self.zones,
            created_at=now,
            queue_timeout=self.queue_timeout,
        )


def create_argv(spec: PodSpec, zone: str) -> list[str]:
    """``queued-resources create`` for one zone: labelled, valid for the queue timeout (the
    seam's builder; best-effort capacity goes through gcloud's alpha track)."""
    return queued.create_argv(
        spec.name,
        accelerator_type=spec.tpu_type,
        runtime_version=spec.runtime_version,
        project=spec.project,
        zone=zone,
        node_count=spec.num_slices,
        capacity=spec.capacity,
        labels={LABEL: spec.name},
        valid_until=gcloud_duration(spec.queue_timeout),
    )


def describe_argv(name: str, zone: str, project: str | None = None) -> list[str]:
    return queued.describe_argv(name, project, zone)


def delete_argv(name: str, zone: str, project: str | None = None) -> list[str]:
    """Deletes the request and its nodes (``--force``), without waiting (``--async``)."""
    return queued.delete_argv(name, project, zone)


def list_argv(zone: str, project: str | None = None) -> list[str]:
    """Every queued resource of one zone, as JSON (the label is picked out here, by
    :func:`ours`: gcloud puts it on ``tpu.nodeSpec[].node.labels``, which the service's list
    cannot filter on)."""
    return queued.list_argv(project, zone)


def record_of(qr: dict[str, Any], zone: str, project: str | None) -> PodRecord | None:
    """A record for a labelled request this machine has no record of (made from another
    machine), from what the list shows: its type, slices, capacity, creation and valid-until."""
    name = ours(qr)
    tpu = qr.get("tpu")
    specs = (tpu.get("nodeSpec") if isinstance(tpu, dict) else None) or [{}]
    spec = specs[0] if isinstance(specs, list) and isinstance(specs[0], dict) else {}
    node = spec.get("node") or {}
    if name is None or not isinstance(node, dict):
        return None
    slices = int((spec.get("multisliceParams") or {}).get("nodeCount", 0)) or len(specs)
    capacity = (
        "spot"
        if "spot" in qr
        else "best-effort"
        if "bestEffort" in qr
        else "reserved"
        if qr.get("reservationName")
        else "on-demand"
    )
    created: float
    try:
        created = calendar.timegm(
            time.strptime(str(qr.get("createTime", ""))[:19], "%Y-%m-%dT%H:%M:%S")
        )
    except ValueError:
        created = time.time()
    valid = str((qr.get("queueingPolicy") or {}).get("validUntilDuration", ""))
    try:
        timeout = float(valid.removesuffix("s")) if valid else float("inf")
    except ValueError:
        timeout = float("inf")
    return PodRecord(
        name=name,
        tpu_type=str(node.get("acceleratorType", "?")),
        num_slices=slices,
        runtime_version=str(node.get("runtimeVersion", "")),
        capacity=capacity,
        zone=zone,
        project=project,
        state="unrecorded",
        created_at=float(created),
        queue_timeout=timeout,
    )


def skip_after_quota(zones: Sequence[str], refused: set[str]) -> list[str]:
    """The zones still worth trying once the regions in ``refused`` refused for quota."""
    return [z for z in zones if region_of(z) not in refused]


def classify(stderr: str) -> str:
    """What a failed create means, read by the seam (:func:`multihost.cloud.gcloud.error_class`):
    ``quota`` (skip the region for this capacity type), ``capacity`` (this zone has none now),
    ``exists`` or ``error``."""
    kind = error_class(one_line(stderr))
    kinds = {
        CloudQuotaExhausted: "quota",
        CloudNoCapacity: "capacity",
        CloudAlreadyExists: "exists",
    }
    return kinds.get(kind, "error")


def ours(qr: dict[str, object]) -> str | None:
    """The pod name a listed queued resource was labelled with by multihost, if any (gcloud
    puts ``--labels`` on the nodes' spec: ``tpu.nodeSpec[].node.labels``)."""
    tpu = qr.get("tpu")
    specs = tpu.get("nodeSpec", []) if isinstance(tpu, dict) else []
    for spec in specs if isinstance(specs, list) else []:
        labels = (spec.get("node") or {}).get("labels") or {}
        if isinstance(labels, dict) and LABEL in labels:
            return str(labels[LABEL])
    return None


def failure(qr: dict[str, object]) -> str:
    """A FAILED or SUSPENDED request's reason, in the service's words."""
    state = qr.get("state")
    if not isinstance(state, dict):
        return "no reason given"
    error = (state.get("failedData") or {}).get("error") or {}
    if isinstance(error, dict) and error.get("message"):
        return f"{error['message']} (code {error.get('code', '?')})"
    initiator = state.get("stateInitiator")
    return f"{state.get('state')} by {str(initiator).lower()}" if initiator else "no reason given"
