"""Pure planning of a pod's requests: checked input, the zones in order, the labels, each
gcloud command line (``queued-resources create/describe/delete/list``), and what a failure
means for the next zone. Nothing here runs anything."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from multihost.errors import UsageError
from multihost.job.record import check_name, workers_per_slice

__all__ = ["check_name", "check_tpu_type", "create_argv", "delete_argv", "describe_argv"]
from multihost.pods.prices import region_of
from multihost.pods.records import PodRecord

QR = ("compute", "tpus", "queued-resources")
LABEL = "multihost"  # every request multihost makes carries multihost=<pod name>
CAPACITIES = ("on-demand", "spot", "reserved", "best-effort")
_TPU_TYPE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-([1-9][0-9]*)$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
# A request in these states can never run again (it still holds quota until deleted).
DEAD = ("FAILED", "SUSPENDED")
WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")


def check_tpu_type(tpu_type: str) -> str:
    """A Cloud TPU accelerator type multihost knows the workers of (v4-16, v5litepod-16...)."""
    if not _TPU_TYPE.match(tpu_type) or workers_per_slice(tpu_type) is None:
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
            name=self.name, tpu_type=self.tpu_type, num_slices=self.num_slices,
            runtime_version=self.runtime_version, capacity=self.capacity, zone=zone,
            project=self.project, zones=self.zones, created_at=now,
            queue_timeout=self.queue_timeout,
        )  # fmt: skip


def _where(project: str | None, zone: str) -> list[str]:
    return [*(["--project", project] if project else []), "--zone", zone]


def create_argv(spec: PodSpec, zone: str) -> list[str]:
    """``queued-resources create`` for one zone: labelled, valid for the queue timeout.
    Best-effort capacity exists only in gcloud's alpha track (``--best-effort``)."""
    track = ["alpha"] if spec.capacity == "best-effort" else []
    argv = [*track, *QR, "create", spec.name, "--accelerator-type", spec.tpu_type,
            "--runtime-version", spec.runtime_version]  # fmt: skip
    if spec.num_slices > 1:  # gcloud refuses --node-count 1
        argv += ["--node-count", str(spec.num_slices), "--node-prefix", spec.name]
    else:
        argv += ["--node-id", spec.name]
    if spec.capacity != "on-demand":
        argv.append(f"--{spec.capacity}")
    argv += ["--labels", f"{LABEL}={spec.name}",
             "--valid-until-duration", gcloud_duration(spec.queue_timeout), "--async"]  # fmt: skip
    return argv + _where(spec.project, zone)


def describe_argv(name: str, zone: str, project: str | None = None) -> list[str]:
    return [*QR, "describe", name, "--format=json", *_where(project, zone)]


def delete_argv(name: str, zone: str, project: str | None = None) -> list[str]:
    """Deletes the request and its nodes (``--force``), without waiting (``--async``)."""
    return [*QR, "delete", name, "--force", "--async", "--quiet", *_where(project, zone)]


def skip_after_quota(zones: Sequence[str], refused: set[str]) -> list[str]:
    """The zones still worth trying once the regions in ``refused`` refused for quota."""
    return [z for z in zones if region_of(z) not in refused]


def classify(stderr: str) -> str:
    """What a failed create means: ``quota`` (skip the region for this capacity type),
    ``capacity`` (this zone has none now), ``exists`` or ``error``."""
    if "RESOURCE_EXHAUSTED" in stderr or "Quota limit" in stderr or "quota" in stderr.lower():
        return "quota"
    if "no more capacity" in stderr or "Insufficient reserved capacity" in stderr:
        return "capacity"
    if "ALREADY_EXISTS" in stderr or "already exists" in stderr:
        return "exists"
    return "error"


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
