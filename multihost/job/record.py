"""The job record, persisted as ``gs://B/multihost/jobs/NAME/job.json`` and mirrored locally,
and the bucket layout every side agrees on."""

from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from multihost.errors import UsageError

SCHEMA = 1
CAPACITIES = ("on-demand", "spot", "reserved", "best-effort")
_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
_BUCKET = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_TPU_TYPE = re.compile(r"^v[0-9][a-z0-9]*-[0-9]+$")
_HOST_OBJECT = re.compile(r"slice-([0-9]+)-worker-([0-9]+)\.(log|started|exit)$")


class JobState(enum.Enum):
    """Where a job is. Only RUNNING is not final."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def final(self) -> bool:
        return self is not JobState.RUNNING


def check_name(name: str) -> str:
    """Job names become queued-resource and node names: lowercase, digits, ``-``."""
    if not _NAME.match(name):
        raise UsageError(
            f"bad job name {name!r}: a lowercase letter, then lowercase letters, digits or '-' "
            "(at most 40, not ending in '-')"
        )
    return name


def check_bucket(bucket: str) -> str:
    """``gs://NAME`` with no path; the trailing ``/`` is dropped."""
    bucket = bucket.rstrip("/")
    if not _BUCKET.match(bucket):
        raise UsageError(f"bad bucket {bucket!r}: expected gs://BUCKET")
    return bucket


def check_tpu_type(tpu_type: str) -> str:
    if not _TPU_TYPE.match(tpu_type):
        raise UsageError(f"bad --tpu-type {tpu_type!r}: expected e.g. v4-16, v5litepod-16")
    return tpu_type


def workers_per_slice(tpu_type: str) -> int | None:
    """TPU VM workers (hosts) in one slice of this type, where the type says so."""
    family, _, size = tpu_type.rpartition("-")
    n = int(size)
    if family in ("v4", "v5p"):  # the suffix counts TensorCores, two per chip, four chips a host
        return max(1, n // 8)
    if family in ("v5litepod", "v5e", "v6e"):  # the suffix counts chips; 8-chip hosts up to 8
        return 1 if n <= 8 else n // 4
    if family in ("v2", "v3"):
        return max(1, n // 8)
    return None


@dataclass(frozen=True)
class JobRecord:
    """Everything about a job: what was asked, and where it stands. The bucket copy is truth."""

    name: str
    bucket: str
    tpu_type: str
    num_slices: int
    runtime_version: str
    command: str
    code_hash: str
    project: str | None = None
    zone: str | None = None
    capacity: str = "on-demand"
    env: tuple[tuple[str, str], ...] = ()
    max_restarts: int = 0
    log_interval: int = 10
    start_timeout: float = 600.0
    coordinator_port: int = 8476
    megascale_port: int = 8081
    attempt: int = 0
    state: JobState = JobState.RUNNING
    exit_code: int | None = None
    message: str = ""
    created_at: float = 0.0
    attempt_times: tuple[float, ...] = field(default=())
    schema: int = SCHEMA

    @property
    def resource(self) -> str:
        """The queued resource of the current attempt (each attempt has its own)."""
        return resource_name(self.name, self.attempt)

    @property
    def prefix(self) -> str:
        return f"{self.bucket}/multihost/jobs/{self.name}"

    @property
    def record_url(self) -> str:
        return f"{self.prefix}/job.json"

    @property
    def code_url(self) -> str:
        return code_url(self.bucket, self.code_hash)

    def attempt_prefix(self, attempt: int | None = None) -> str:
        return f"{self.prefix}/attempt-{self.attempt if attempt is None else attempt}"

    def host_url(self, slice_id: int, worker: int, kind: str, attempt: int | None = None) -> str:
        return f"{self.attempt_prefix(attempt)}/slice-{slice_id}-worker-{worker}.{kind}"

    @property
    def expected_workers(self) -> int | None:
        return workers_per_slice(self.tpu_type)

    def evolve(self, **changes: Any) -> JobRecord:
        return replace(self, **changes)

    def to_json(self) -> str:
        data = asdict(self)
        data["state"] = self.state.value
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        data = json.loads(text)
        if data.get("schema") != SCHEMA:
            raise UsageError(f"job record schema {data.get('schema')!r} is not {SCHEMA}")
        data["state"] = JobState(data["state"])
        data["env"] = tuple(tuple(p) for p in data.get("env", ()))
        data["attempt_times"] = tuple(data.get("attempt_times", ()))
        return cls(**data)


def resource_name(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}"


def code_url(bucket: str, code_hash: str) -> str:
    return f"{bucket}/multihost/code/{code_hash}.tar.gz"


def parse_host_object(name: str) -> tuple[int, int, str] | None:
    """``…/slice-S-worker-W.KIND`` → (S, W, KIND)."""
    m = _HOST_OBJECT.search(name)
    return (int(m[1]), int(m[2]), m[3]) if m else None


def local_dir() -> Path:
    """Where job records are mirrored: ``$MULTIHOST_LOG_DIR/jobs`` (default ~/multihost-logs)."""
    base = os.environ.get("MULTIHOST_LOG_DIR") or Path.home() / "multihost-logs"
    return Path(base) / "jobs"


def save_local(record: JobRecord) -> Path:
    path = local_dir() / record.name / "job.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.to_json())
    tmp.replace(path)
    return path


def load_local(name: str) -> JobRecord:
    path = local_dir() / name / "job.json"
    try:
        return JobRecord.from_json(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no job {name!r} here (see multihost job ls)") from None


def list_local() -> list[JobRecord]:
    out = []
    base = local_dir()
    for path in sorted(base.glob("*/job.json")) if base.is_dir() else []:
        try:
            out.append(JobRecord.from_json(path.read_text()))
        except (ValueError, TypeError, UsageError):
            continue
    return sorted(out, key=lambda r: r.created_at)
