"""Pure planning of a pod's requests: checked input, the zones in order, the labels, each
gcloud command line (``queued-resources create/describe/delete/list``), and what a failure
means for the next zone. Nothing here runs anything."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from multihost.cloud import checks, queued
from multihost.cloud.gcloud import error_class, one_line
from multihost.defaults import DEFAULTS, given_fields
from multihost.errors import CloudAlreadyExists, CloudNoCapacity, CloudQuotaExhausted, UsageError
from multihost.pods.prices import region_of
from multihost.pods.records import PodRecord

LABEL = "multihost"  # every request multihost makes carries multihost=<pod name>
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
# A request in these states can never run again (it still holds quota until deleted).
DEAD = ("FAILED", "SUSPENDED")
WAITING = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")


def zones_of(zone: str | None, zones: str | Sequence[str] | None) -> tuple[str, ...]:
    """``--zones A,B,C`` (tried in order) or ``--zone Z``; () when neither is given (then
    gcloud's default zone is asked: :func:`multihost.pods.lifecycle.zones_for`)."""
    if zone and zones:
        raise UsageError("give --zone or --zones, not both")
    if isinstance(zones, str) or zones is None:
        zones = (zones or zone or "").split(",")
    listed = [z.strip() for z in zones if z.strip()]
    if len(set(listed)) != len(listed):
        raise UsageError(f"--zones names a zone twice: {','.join(listed)}")
    return tuple(checks.check_zone(z) for z in listed)


def parse_duration(text: str | float, *, off: bool = False) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h``, ``1d`` (bare numbers are seconds);
    ``off``: the setting also takes ``off`` (see :func:`parse_autodown`), said when refused."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = f"{text:g}"
    m = _DURATION.match(str(text).strip())
    if not m or float(m[1]) <= 0:
        also = ", or off" if off else ""
        raise UsageError(f"bad duration {text!r}: expected e.g. 600, 90s, 15m, 2h{also}")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def parse_autodown(text: str | float) -> float | None:
    """Autodown's setting: idle seconds, or None for ``off``."""
    return None if str(text).strip() == "off" else parse_duration(text, off=True)


@dataclass(frozen=True)
class PodFlags:
    """``up``'s flags (or keywords) as given (None: not given), to ``up`` or to ``run``/``sweep
    --prefix NAME``: what a pod to make is, and whether autodown is to be set."""

    tpu_type: str | None = None
    runtime_version: str | None = None
    num_slices: int | None = None
    capacity: str | None = None
    zone: str | None = None
    zones: Sequence[str] | None = None  # kept as a tuple ("A,B" and lists are split)
    project: str | None = None
    queue_timeout: str | float | None = None
    autodown: str | float | None = None  # a duration, or "off"

    def __post_init__(self) -> None:
        if isinstance(self.zones, str | list):  # "A,B", or a list
            given = self.zones.split(",") if isinstance(self.zones, str) else self.zones
            object.__setattr__(self, "zones", tuple(z.strip() for z in given if z.strip()))

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> PodFlags:
        """The flags in ``given`` (``vars(args)``, keywords), each checked: bad input is a
        UsageError before anything is asked of the cloud."""
        flags = cls(**given_fields(cls, given))
        if flags.tpu_type is not None:
            checks.check_tpu_type(flags.tpu_type)
        if flags.num_slices is not None:
            checks.check_slices(flags.num_slices)
        if flags.capacity is not None:
            checks.check_capacity(flags.capacity)
        zones_of(flags.zone, flags.zones)
        if flags.queue_timeout is not None:  # seconds, however given ("15m", 900, "900")
            flags = replace(flags, queue_timeout=parse_duration(flags.queue_timeout))
        if flags.autodown is not None:  # seconds, or "off"
            idle = parse_autodown(flags.autodown)
            flags = replace(flags, autodown="off" if idle is None else idle)
        return flags

    def over(self, configured: PodFlags) -> PodFlags:
        """These flags over what a profile says of a pod to make (``configured``): each one
        given wins; a place given (``--zones``, or a ``--zone`` the profile does not say)
        replaces the profile's place, and a profile's ``zones`` go before its own ``zone``."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        values = {f.name: getattr(configured, f.name) for f in fields(self)}
        if self.zones is not None or self.zone not in (None, configured.zone):
            values["zone"] = values["zones"] = None
        elif configured.zones:
            mine["zone"] = values["zone"] = None
        values.update({k: v for k, v in mine.items() if v is not None})
        return PodFlags(**values)

    @property
    def autodown_seconds(self) -> float | None:
        """The idle seconds asked for (None: off, or not given)."""
        return None if self.autodown is None else parse_autodown(self.autodown)

    def spec(self, name: str, zones: tuple[str, ...]) -> PodSpec:
        """The pod to make, in ``zones`` (those given, or gcloud's default zone)."""
        if not self.tpu_type:
            raise UsageError("--tpu-type is required to create a pod (e.g. --tpu-type v4-16)")
        if not self.runtime_version:
            raise UsageError("--runtime-version is required to create a pod")
        return PodSpec(
            name=name,
            tpu_type=self.tpu_type,
            runtime_version=self.runtime_version,
            zones=zones,
            num_slices=self.num_slices or 1,
            capacity=self.capacity or "on-demand",
            project=self.project,
            queue_timeout=parse_duration(
                DEFAULTS.queue_timeout if self.queue_timeout is None else self.queue_timeout
            ),
        )

    def for_making(self) -> list[str]:
        """The flags given that only say what a pod to make is (not which pod to use)."""
        given = (
            ("--tpu-type", self.tpu_type),
            ("--runtime-version", self.runtime_version),
            ("--num-slices", self.num_slices),
            (f"--{self.capacity}", self.capacity),
            ("--zones", self.zones),
            ("--queue-timeout", self.queue_timeout),
        )
        return [flag for flag, value in given if value is not None]

    def disagreement(self, record: PodRecord) -> str | None:
        """Why these flags do not describe the existing pod ``record`` (None: they do)."""
        pairs = (
            ("--tpu-type", self.tpu_type, record.tpu_type),
            ("--runtime-version", self.runtime_version, record.runtime_version),
            ("--num-slices", self.num_slices, record.num_slices),
            ("", self.capacity and f"--{self.capacity}", f"--{record.capacity}"),
        )
        for flag, given, has in pairs:
            if given is not None and given != has:
                what = f"{flag} {given}".strip()
                return (
                    f"pod {record.name} exists as {record.num_slices} x {record.tpu_type} "
                    f"({record.capacity}, {record.runtime_version}) in {record.zone}, not "
                    f"{what}: use it without that flag, or multihost down {record.name} first"
                )
        return None


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
    queue_timeout: float = DEFAULTS.queue_timeout

    def __post_init__(self) -> None:
        checks.check_name(self.name)
        checks.check_tpu_type(self.tpu_type)
        checks.check_capacity(self.capacity)
        checks.check_slices(self.num_slices)
        if not self.zones:
            raise UsageError("a pod needs a zone to be asked in")
        for zone in self.zones:
            checks.check_zone(zone)

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
