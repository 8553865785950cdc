"""The run's local manifest, ``run.json``: written atomically so a crash never leaves it torn."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from multihost.model import Host, HostResult, Job

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


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Load a run's manifest."""
    data: dict[str, Any] = json.loads((run_dir / MANIFEST).read_text())
    return data
