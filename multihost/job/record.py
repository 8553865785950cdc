"""The job record, persisted as ``gs://B/multihost/jobs/NAME/job.json`` and mirrored locally
(the bucket layout: ``multihost.cloud.bucket``)."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from multihost.cloud import bucket as layout
from multihost.cloud import checks
from multihost.defaults import DEFAULTS
from multihost.errors import UsageError
from multihost.runs import files
from multihost.runs.files import private_dir

SCHEMA = 1


class JobRecordError(UsageError):
    """A job record that cannot be read (torn, foreign, edited by hand, not a file): exit 2,
    as for a run.json (``multihost.runs.record.RecordError``)."""


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
    """Job names become queued-resource and node names: the TPU API's rule
    (``multihost.cloud.checks``, as for a pod's)."""
    return checks.check_name(name, "job")


def workers_per_slice(tpu_type: str) -> int | None:
    """TPU VM workers (hosts) in one slice of this type; None for a type that does not exist
    (a record written before types were checked)."""
    try:
        return checks.workers_per_slice(tpu_type)
    except UsageError:
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
    capacity: str = DEFAULTS.capacity
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()  # (KEY, Secret Manager secret NAME): names only
    max_restarts: int = DEFAULTS.max_restarts
    log_interval: int = DEFAULTS.log_interval
    start_timeout: float = DEFAULTS.start_timeout
    coordinator_port: int = DEFAULTS.coordinator_port
    megascale_port: int = DEFAULTS.megascale_port
    # the locked environment: env_lock "" = none; see multihost.job.startup
    env_lock: str = ""  # the hash of the lock and the selection (or of the requirements)
    env_select: str = ""  # uv's selection flags, words (checked names only)
    env_requirements: str = ""  # --requirements FILE's content (no uv.lock)
    env_wait: float = DEFAULTS.env_wait
    uv_url: str = ""  # the runner's uv in the bucket, for a host without one ("": none)
    uv_sha256: str = ""
    uv_version: str = ""
    # each worker's compile cache, kept in the bucket across attempts: its cap in bytes; 0: none
    compile_cache: int = DEFAULTS.compile_cache_max
    attempt: int = 0
    resubmits: int = 0  # attempts made because the resource was deleted (at most one)
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
        return layout.job_prefix(self.bucket, self.name)

    @property
    def record_url(self) -> str:
        return layout.record_url(self.bucket, self.name)

    @property
    def code_url(self) -> str:
        return layout.code_url(self.bucket, self.code_hash)

    def attempt_prefix(self, attempt: int | None = None) -> str:
        return layout.attempt_prefix(
            self.bucket, self.name, self.attempt if attempt is None else attempt
        )

    @property
    def compile_cache_url(self) -> str:
        """Where the workers keep their compile caches, ``…/compile-cache`` ("": none)."""
        return layout.compile_cache_prefix(self.bucket, self.name) if self.compile_cache else ""

    def host_url(self, slice_id: int, worker: int, kind: str, attempt: int | None = None) -> str:
        at = self.attempt if attempt is None else attempt
        return layout.host_url(self.bucket, self.name, at, slice_id, worker, kind)

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
    def from_json(cls, text: str | bytes) -> JobRecord:
        """The one reader of a job record: anything it cannot vouch for is a ``JobRecordError``
        (one line, no traceback), never a KeyError or a half-typed record."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise JobRecordError(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise JobRecordError(f"not a job record (a JSON {type(data).__name__})")
        if data.get("schema") != SCHEMA:
            raise JobRecordError(f"job record schema {data.get('schema')!r} is not {SCHEMA}")
        try:
            known = {f.name: f for f in fields(cls)}
            data = {k: v for k, v in data.items() if k in known}
            data["state"] = JobState(data["state"])
            data["env"] = tuple(_pair(p) for p in data.get("env", ()))
            data["secrets"] = tuple(_pair(p) for p in data.get("secrets", ()))
            data["attempt_times"] = tuple(float(t) for t in data.get("attempt_times", ()))
            record = cls(**data)
            _check_types(record)
            check_name(record.name)
        except (KeyError, TypeError, ValueError, UsageError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise JobRecordError(f"malformed job record ({what})") from None
        return record


def _pair(item: Any) -> tuple[str, str]:
    if not (isinstance(item, list | tuple) and len(item) == 2):
        raise TypeError(f"expected a [KEY, VALUE] pair, got {item!r}")
    return str(item[0]), str(item[1])


_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "bucket": str,
    "tpu_type": str,
    "num_slices": int,
    "runtime_version": str,
    "command": str,
    "code_hash": str,
    "project": (str, type(None)),
    "zone": (str, type(None)),
    "capacity": str,
    "max_restarts": int,
    "log_interval": int,
    "start_timeout": (int, float),
    "coordinator_port": int,
    "megascale_port": int,
    "attempt": int,
    "resubmits": int,
    "exit_code": (int, type(None)),
    "message": str,
    "created_at": (int, float),
    "env_lock": str,
    "env_select": str,
    "env_requirements": str,
    "env_wait": (int, float),
    "uv_url": str,
    "uv_sha256": str,
    "uv_version": str,
    "compile_cache": int,
}


def _check_types(record: JobRecord) -> None:
    for name, kind in _TYPES.items():
        value = getattr(record, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"{name}: {value!r}")


def resource_name(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}"


def local_dir() -> Path:
    """Where job records are mirrored: ``$MULTIHOST_LOG_DIR/jobs`` (default ~/multihost-logs)."""
    base = os.environ.get("MULTIHOST_LOG_DIR") or Path.home() / "multihost-logs"
    return Path(base) / "jobs"


def job_dir(name: str) -> Path:
    """The job's private local directory (0700, created with its parents; never a symlink)."""
    return private_dir(local_dir() / name)


def save_local(record: JobRecord) -> Path:
    """The local mirror of the record, 0600, replaced atomically (``multihost.runs.files``)."""
    return files.save(job_dir(record.name) / "job.json", record)


def read_local(path: Path) -> JobRecord:
    """A local record file through the one reader; every way it can be unusable is a
    ``JobRecordError`` naming the file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise JobRecordError(f"{path} is a directory, not a job record") from None
    except OSError as exc:
        raise JobRecordError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return JobRecord.from_json(data)
    except JobRecordError as exc:
        raise JobRecordError(
            f"{path}: {exc} — remove it, or fix it from the bucket's copy (job.json)"
        ) from None


def load_local(name: str) -> JobRecord:
    check_name(name)
    path = local_dir() / name / "job.json"
    try:
        return read_local(path)
    except FileNotFoundError:
        raise UsageError(f"no job {name!r} here (see multihost job ls)") from None


@dataclass(frozen=True)
class Unreadable:
    """A job directory whose record could not be read (``job ls`` lists it as such)."""

    name: str
    why: str


def list_local() -> list[JobRecord | Unreadable]:
    """Every job mirrored here, oldest first; unreadable records last, never hidden."""
    good: list[JobRecord] = []
    bad: list[JobRecord | Unreadable] = []
    base = local_dir()
    try:
        dirs = sorted(p for p in base.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        dirs = []
    except OSError as exc:
        raise JobRecordError(f"cannot list {base}: {exc.strerror or exc}") from None
    for d in dirs:
        try:
            good.append(read_local(d / "job.json"))
        except FileNotFoundError:
            bad.append(Unreadable(d.name, f"{d / 'job.json'} is missing"))
        except JobRecordError as exc:
            bad.append(Unreadable(d.name, str(exc)))
    return [*sorted(good, key=lambda r: r.created_at), *bad]
