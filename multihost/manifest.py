"""The run's local manifest, ``run.json``: written atomically so a crash never leaves it torn."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.errors import UsageError
from multihost.model import Host, HostResult, Job

if TYPE_CHECKING:  # the runner's types, named here without importing the runner
    from multihost.plan import HostPlan
    from multihost.runstate import RunOptions

MANIFEST = "run.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary file in the same directory, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def host_to_json(host: Host) -> dict[str, Any]:
    return dataclasses.asdict(host)


def host_from_json(data: dict[str, Any]) -> Host:
    names = {f.name for f in dataclasses.fields(Host)}
    return Host(**{k: v for k, v in data.items() if k in names})


def result_to_json(result: HostResult) -> dict[str, Any]:
    return {
        "host": host_to_json(result.host),
        "state": str(result.state),
        "exit_code": result.exit_code,
        "signal": result.signal,
        "error": result.error,
        "started_at": result.started_at,
        "ended_at": result.ended_at,
        "bytes_sent": result.bytes_sent,
        "last_line": result.last_line,
    }


def job_to_json(job: Job) -> dict[str, Any]:
    return {**dataclasses.asdict(job), "env": dict(job.env)}


def run_record(
    job: Job,
    code_hash: str | None,
    options: RunOptions,
    results: Sequence[HostResult],
    plans: Sequence[HostPlan | None],
    *,
    first_failure: str | None,
    interrupted: bool,
    timed_out: bool,
) -> dict[str, Any]:
    """Everything ``attach``, ``status``, ``logs`` and ``kill`` need to find the run again."""
    return {
        "version": 1,
        "run_name": job.run_name,
        "job": job_to_json(job),
        "code_hash": code_hash,
        "script_dir": str(options.script_dir.resolve()),
        "fail_fast": options.fail_fast,
        "grace": options.grace,
        "ssh": {
            "config": [str(p) for p in options.ssh.config],
            "host_keys": options.ssh.host_keys,
            "connect_timeout": options.ssh.connect_timeout,
        },
        "hosts": [
            {
                **result_to_json(result),
                "host": host_to_json(result.host),
                "log": f"{result.host.file_stem}.log",
                "remote_run_dir": plan.paths.run if plan else None,
                "env": plan.env if plan else None,
            }
            for result, plan in zip(results, plans, strict=True)
        ],
        "first_failure": first_failure,
        "interrupted": interrupted,
        "timed_out": timed_out,
        "updated": time.time(),
    }


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Load a run's manifest."""
    data: dict[str, Any] = json.loads((run_dir / MANIFEST).read_text())
    return data


@contextlib.contextmanager
def watch_lock(run_dir: Path) -> Iterator[None]:
    """Only one process appends to a run's local logs at a time (else lines would repeat)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / ".lock").open("a+") as f:
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
