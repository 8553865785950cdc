"""``run.json``: the persisted record of a run — typed, versioned, written atomically.

One pair of functions converts a :class:`RunRecord` to and from JSON (its ``to_json`` and
``from_json`` are them, as text); nothing else reads or writes the file's dicts, and the file
is written through the one writer of records (``multihost.runs.files``). Each host's entry is
its ``HostResult`` (the one shape of a host's outcome) with the record's own two facts: the
environment it was launched with and its log's file name in the run's directory. A record
from a newer multihost (a higher ``schema``) is refused with a message saying so, never
half-read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multihost.defaults import DEFAULTS
from multihost.errors import UsageError
from multihost.model import Fleet, Host, Job, State
from multihost.results.phases import PHASES
from multihost.results.records import HostResult, Staging
from multihost.runs import files
from multihost.runs.files import private_dir

MANIFEST = "run.json"
SCHEMA = 2  # 1: the untyped record of multihost 0.1 (read as well)


class RecordError(UsageError):
    """A run.json that cannot be read: torn, foreign, or from a newer multihost."""


@dataclass(frozen=True)
class SSHRecord:
    """How the run reached its hosts, so that attach/status/kill reach them the same way."""

    config: tuple[str, ...] = ()
    host_keys: str = "strict"
    connect_timeout: float = DEFAULTS.connect_timeout


@dataclass(frozen=True)
class RunRecord:
    """Everything ``attach``, ``status``, ``logs``, ``kill`` and ``clean`` need about a run.
    ``hosts``: each host's outcome so far, as the run last wrote it; read back, each one's
    ``log`` is its local log (under the run's directory) and ``env`` what it was launched with."""

    run_name: str
    job: Job
    hosts: tuple[HostResult, ...]
    code_hash: str = ""
    script_dir: str = ""
    fail_fast: bool = True
    grace: float = DEFAULTS.grace
    ssh: SSHRecord = field(default_factory=SSHRecord)
    first_failure: str | None = None
    interrupted: bool = False
    timed_out: bool = False
    updated: float = 0.0
    env_names: tuple[str, ...] = ()  # --env names whose values were not recorded
    staging: Staging | None = None  # how the code got there (--stage-via) and what it cost
    schema: int = SCHEMA

    @property
    def fleet(self) -> Fleet:
        return Fleet(tuple(h.host for h in self.hosts))

    @property
    def state(self) -> str:
        """One word for the whole run: running, done, failed, killed, interrupted."""
        states = [h.state for h in self.hosts]
        if not all(s.final for s in states):
            return "running"
        if self.interrupted:
            return "interrupted"
        if all(s is State.DONE for s in states):
            return "done"
        return "killed" if all(s is State.KILLED for s in states) else "failed"

    def host(self, process_id: int) -> HostResult:
        return next(h for h in self.hosts if h.host.process_id == process_id)

    def to_json(self) -> str:
        """run.json's text (:func:`to_json`'s data, one top-level key a line)."""
        return dumps(to_json(self))

    @classmethod
    def from_json(cls, text: str | bytes, run_dir: Path = Path()) -> RunRecord:
        """A record from run.json's text (see :func:`from_json`)."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordError(f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise RecordError("not a multihost run record")
        return from_json(data, run_dir)

    def logs(self, run_dir: Path) -> dict[int, Path]:
        """Each host's local log by process id: where the record says, in ``run_dir``."""
        return {h.host.process_id: run_dir / log_name(h) for h in self.hosts}


def log_name(h: HostResult) -> str:
    """The file name of a host's local log in its run's directory."""
    return h.log.name if h.log is not None else f"{h.host.file_stem}.log"


# -- JSON ------------------------------------------------------------------------------------
def to_json(record: RunRecord) -> dict[str, Any]:
    """The record as JSON-ready data (``schema`` first)."""
    return {
        "schema": record.schema,
        "run_name": record.run_name,
        "job": _job_json(record.job),
        "code_hash": record.code_hash,
        "script_dir": record.script_dir,
        "fail_fast": record.fail_fast,
        "grace": record.grace,
        "ssh": {**dataclasses.asdict(record.ssh), "config": list(record.ssh.config)},
        "hosts": [_host_entry(h) for h in record.hosts],
        "first_failure": record.first_failure,
        "interrupted": record.interrupted,
        "timed_out": record.timed_out,
        "updated": record.updated,
        "env_names": list(record.env_names),
        "staging": _staging_entry(record.staging) if record.staging else None,
    }


def _job_json(job: Job) -> dict[str, Any]:
    """The job's fields; its compile cache's cap only when not the default (then a record reads
    and writes as the ones written before the cache was a field)."""
    data = {**dataclasses.asdict(job), "env": dict(job.env)}
    if job.compile_cache == DEFAULTS.compile_cache_max:
        del data["compile_cache"]
    return data


def _staging_entry(staging: Staging) -> dict[str, Any]:
    """The staging summary; the kit's fields only when a host was sent it (a record that
    never had them is written back as it was)."""
    entry = dataclasses.asdict(staging)
    if not staging.kits:
        del entry["kits"], entry["kit_bytes"]
    return entry


# A host's entry: who, how it stands, its log's file name and its env, then these fields of
# its HostResult (the layout and key order every multihost so far writes and reads)
_OUTCOME = ("exit_code", "signal", "error", "started_at", "ended_at", "bytes_sent", "last_line")
# and, only when there is one (a record without one is laid out as before), its cause
_CAUSE = "cause"


def _host_entry(h: HostResult) -> dict[str, Any]:
    entry = {
        "host": _host_json(h.host),
        "state": str(h.state),
        "log": log_name(h),
        "env": dict(h.env) if h.env is not None else None,
        **{name: getattr(h, name) for name in _OUTCOME},
        **({_CAUSE: h.cause} if h.cause else {}),
    }
    if h.startup:  # a key of its own, after the others: a record without it reads as before
        entry["startup"] = dict(h.startup)
    return entry


def _host_of(entry: Mapping[str, Any], run_dir: Path) -> HostResult:
    host = Host(**_known(Host, entry["host"]))
    startup = entry.get("startup") or {}
    return HostResult(
        host=host,
        state=State(entry["state"]),
        log=run_dir / (entry.get("log") or f"{host.file_stem}.log"),
        env=entry.get("env"),
        startup={p: float(startup[p]) for p in PHASES if p in startup},
        **{k: v for k, v in entry.items() if k in _OUTCOME},
        cause=entry.get(_CAUSE),
    )


@functools.lru_cache(maxsize=65536)
def _host_fields(host: Host) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (f.name, _host_json(v) if isinstance(v := getattr(host, f.name), Host) else v)
        for f in dataclasses.fields(Host)
    )


def _host_json(host: Host) -> dict[str, Any]:
    """``dataclasses.asdict(host)`` (its fields are plain values), computed once per host:
    the record is rewritten while a run goes on, with every host in it."""
    return dict(_host_fields(host))


def _known(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` present in ``data`` (fields a record no longer has are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def from_json(data: Mapping[str, Any], run_dir: Path = Path()) -> RunRecord:
    """A record from its JSON data; RecordError when it is not one this version can read.
    ``run_dir``: where the record was found (each host's ``log`` is there)."""
    schema = data.get("schema", data.get("version"))
    if not isinstance(schema, int):
        raise RecordError("not a multihost run record (no schema)")
    if schema > SCHEMA:
        raise RecordError(
            f"written by a newer multihost (record schema {schema}, this one reads up to "
            f"{SCHEMA}): upgrade multihost to use it"
        )
    try:
        hosts = tuple(_host_of(h, run_dir) for h in data["hosts"])
        ssh = data.get("ssh") or {}
        return RunRecord(
            run_name=data["run_name"],
            job=Job(**_known(Job, data["job"])),
            hosts=hosts,
            code_hash=data.get("code_hash") or "",
            script_dir=data.get("script_dir") or "",
            fail_fast=bool(data.get("fail_fast", True)),
            grace=float(data.get("grace", DEFAULTS.grace)),
            ssh=SSHRecord(
                config=tuple(ssh.get("config", ())),
                host_keys=ssh.get("host_keys", "strict"),
                connect_timeout=float(ssh.get("connect_timeout", DEFAULTS.connect_timeout)),
            ),
            first_failure=data.get("first_failure"),
            interrupted=bool(data.get("interrupted")),
            timed_out=bool(data.get("timed_out")),
            updated=float(data.get("updated") or 0.0),
            env_names=tuple(data.get("env_names") or ()),
            staging=_staging(data.get("staging")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"malformed run record ({type(exc).__name__}: {exc})") from None


def _staging(data: Mapping[str, Any] | None) -> Staging | None:
    if not data:
        return None
    known = _known(Staging, data)
    return Staging(**{**known, "fallbacks": tuple(known.get("fallbacks", ()))})


# -- files -----------------------------------------------------------------------------------
def dumps(data: Any) -> str:
    """JSON text with one top-level key a line and each item of a top-level list on its own
    line (not ``indent=1`` everywhere: that takes json's pure-Python encoder, and a record
    with a thousand hosts is rewritten many times a run)."""
    if not isinstance(data, dict) or not data:
        return json.dumps(data) + "\n"
    parts = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            items = ",\n  ".join(json.dumps(v) for v in value)
            parts.append(f" {json.dumps(key)}: [\n  {items}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_record(run_dir: Path, record: RunRecord) -> None:
    """Save the record as ``run_dir/run.json``, stamped with the time (the one writer of
    records: ``multihost.runs.files``)."""
    files.save(run_dir / MANIFEST, dataclasses.replace(record, updated=time.time()))


def read_record(run_dir: Path) -> RunRecord:
    """Load ``run_dir/run.json``; FileNotFoundError when absent, RecordError when unreadable."""
    try:
        text = (run_dir / MANIFEST).read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise
    except IsADirectoryError:
        raise RecordError("a directory, not a file") from None
    except UnicodeDecodeError:
        raise RecordError("not text (UTF-8)") from None
    except OSError as exc:
        raise RecordError(exc.strerror or str(exc)) from None
    return RunRecord.from_json(text, run_dir)


@contextlib.contextmanager
def watch_lock(run_dir: Path) -> Iterator[None]:
    """Only one process appends to a run's local logs at a time (else lines would repeat)."""
    private_dir(run_dir)
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            owner = f.read().strip() or "?"
            raise UsageError(
                f"run {run_dir.name} is being followed by another multihost process (pid {owner})"
            ) from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
