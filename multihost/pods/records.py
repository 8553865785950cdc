"""The records multihost keeps of the pods it made: ``$MULTIHOST_LOG_DIR/pods/NAME/pod.json``
(default ``~/multihost-logs``), private (0700 directory, 0600 file), replaced atomically by the
one writer of records (``multihost.runs.files``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from multihost.errors import UsageError
from multihost.pods import prices
from multihost.runs import files

SCHEMA = 1
FILE = "pod.json"
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")  # a name that can be a record's directory


class PodRecordError(UsageError):
    """A pod record that cannot be read (torn, foreign, edited by hand)."""


@dataclass(frozen=True)
class PodRecord:
    """One pod (a queued resource multihost requested): what was asked and where it stands.

    ``state``: ``requesting`` (a request is in the queue of ``zone``), ``active``,
    ``deleting`` (a delete was sent and not seen through).
    """

    name: str
    tpu_type: str
    num_slices: int
    runtime_version: str
    capacity: str
    zone: str
    project: str | None = None
    zones: tuple[str, ...] = ()
    state: str = "requesting"
    created_at: float = 0.0  # when the current request was made
    active_at: float | None = None  # when it was first seen ACTIVE (cost counts from here)
    queue_timeout: float = 0.0  # the request's valid-until, relative to created_at
    autodown: float | None = None  # idle seconds after which the pod deletes itself
    message: str = ""
    schema: int = SCHEMA

    @property
    def valid_until(self) -> float:
        return self.created_at + self.queue_timeout

    def evolve(self, **changes: Any) -> PodRecord:
        return replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> PodRecord:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PodRecordError(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PodRecordError(f"not a pod record of schema {SCHEMA}")
        known = {f.name for f in fields(cls)}
        try:
            data = {k: v for k, v in data.items() if k in known}
            data["zones"] = tuple(str(z) for z in data.get("zones", ()))
            record = cls(**data)
            _check(record)
        except (TypeError, ValueError) as exc:
            raise PodRecordError(f"malformed pod record ({exc})") from None
        return record


_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "tpu_type": str,
    "num_slices": int,
    "runtime_version": str,
    "capacity": str,
    "zone": str,
    "project": (str, type(None)),
    "state": str,
    "created_at": (int, float),
    "active_at": (int, float, type(None)),
    "queue_timeout": (int, float),
    "autodown": (int, float, type(None)),
    "message": str,
}


@dataclass(frozen=True)
class Pod:
    """A pod as it stands now (what ``multihost.up``, ``pods``, ``autodown`` and ``gc``
    return): what it is, where, the TPU API's word on it, and what it costs.

    ``state``: the queued resource's state as the API says it (``ACTIVE``,
    ``WAITING_FOR_RESOURCES``, ``FAILED``...; ``GONE`` when it does not exist), with the
    service's ``reason`` for a dead one (or, from ``gc``, why it can never run again).
    ``price_per_hour`` and ``cost_so_far`` are None where the price table has no price (see
    ``multihost.pods.prices``); the cost counts from when the pod was first seen ACTIVE.
    ``autodown``: the idle seconds after which it deletes itself (None: off), and what its
    daemon says of itself where it was asked (``autodown_status``).
    """

    name: str
    zone: str
    tpu_type: str
    num_slices: int
    capacity: str
    runtime_version: str
    state: str
    price_per_hour: float | None
    cost_so_far: float | None
    autodown: float | None = None
    autodown_status: str | None = None
    reason: str = ""
    project: str | None = None
    age_s: int = 0
    up_for: str = ""  # how long it has been ACTIVE, HH:MM:SS ("": never)
    recorded: bool = True  # False: found by its label only (made from another machine)

    @classmethod
    def of(
        cls,
        record: PodRecord,
        state: str,
        now: float,
        *,
        reason: str = "",
        recorded: bool = True,
        autodown_status: str | None = None,
    ) -> Pod:
        up_for, cost = ran(record, now)
        return cls(
            name=record.name,
            zone=record.zone,
            tpu_type=record.tpu_type,
            num_slices=record.num_slices,
            capacity=record.capacity,
            runtime_version=record.runtime_version,
            state=state,
            price_per_hour=prices.hourly(
                record.tpu_type, record.zone, record.capacity, record.num_slices
            ),
            cost_so_far=None if cost is None else round(cost, 2),
            autodown=record.autodown,
            autodown_status=autodown_status,
            reason=reason,
            project=record.project,
            age_s=round(now - record.created_at),
            up_for=up_for,
            recorded=recorded,
        )

    def row(self) -> dict[str, object]:
        """As ``multihost pods --json`` shows it (``autodown``: what its daemon says, or its
        idle time where not asked)."""
        data = asdict(self)
        auto = self.autodown_status
        if auto is None and self.autodown is not None:
            auto = f"{self.autodown:g}s idle"
        data["autodown"] = auto
        del data["autodown_status"]
        return data


def ran(record: PodRecord, now: float) -> tuple[str, float | None]:
    """How long the pod has been ACTIVE (``01:12:40``; "" when never) and what that cost
    (None when its price is unknown)."""
    if record.active_at is None:
        return "", None
    seconds = now - record.active_at
    per_hour = prices.hourly(record.tpu_type, record.zone, record.capacity, record.num_slices)
    whole = int(max(0.0, seconds))
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}", prices.cost(
        per_hour, seconds
    )


def _check(record: PodRecord) -> None:
    for name, kind in _TYPES.items():
        value = getattr(record, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"{name}: {value!r}")


def base_dir() -> Path:
    base = os.environ.get("MULTIHOST_LOG_DIR") or Path.home() / "multihost-logs"
    return Path(base) / "pods"


def save(record: PodRecord) -> Path:
    """The pod's record, through the one writer of records (``multihost.runs.files``)."""
    return files.save(base_dir() / record.name / FILE, record)


def find(name: str) -> PodRecord | None:
    path = base_dir() / name / FILE
    try:
        return PodRecord.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except PodRecordError as exc:
        raise PodRecordError(f"{path}: {exc}") from None


def load(name: str) -> PodRecord:
    record = find(name)
    if record is None:
        raise UsageError(f"no pod {name!r} made from here (see multihost pods)")
    return record


def located(
    name: str | None, zone: str | None, project: str | None
) -> tuple[str | None, str | None]:
    """Where ``--prefix NAME`` is, by the one rule of every command on a pod: ``--zone`` (and
    ``--project``) when given; else, for a pod multihost made, its record's (wherever zone
    failover put it); else neither, and gcloud's default zone and project are used."""
    if not name or zone is not None or not _NAME.match(name):
        return zone, project
    record = find(name)
    if record is None:
        return zone, project
    return record.zone, project or record.project


def forget(name: str) -> None:
    shutil.rmtree(base_dir() / name, ignore_errors=True)


def all_records() -> list[PodRecord]:
    """Every pod recorded here, oldest first (an unreadable record is an error, named)."""
    try:
        dirs = sorted(p for p in base_dir().iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        return []
    found = [find(d.name) for d in dirs]
    return sorted((r for r in found if r is not None), key=lambda r: r.created_at)
