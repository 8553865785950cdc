"""The records multihost keeps of the pods it made: ``$MULTIHOST_LOG_DIR/pods/NAME/pod.json``
(default ``~/multihost-logs``), private (0700 directory, 0600 file), replaced atomically by the
one writer of records (``multihost.recordfile``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from multihost import recordfile
from multihost.errors import UsageError

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


def _check(record: PodRecord) -> None:
    for name, kind in _TYPES.items():
        value = getattr(record, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"{name}: {value!r}")


def base_dir() -> Path:
    base = os.environ.get("MULTIHOST_LOG_DIR") or Path.home() / "multihost-logs"
    return Path(base) / "pods"


def save(record: PodRecord) -> Path:
    """The pod's record, through the one writer of records (``multihost.recordfile``)."""
    return recordfile.save(base_dir() / record.name / FILE, record)


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
