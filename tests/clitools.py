"""Running the real ``multihost`` CLI from tests, as a user would (no shell in between)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# one wait_for for every test (tests/helpers.py); also importable from here, where it lived before
from tests.helpers import wait_for as wait_for

REPO = Path(__file__).resolve().parent.parent


def cli(
    args: Sequence[str], *, timeout: float = 120, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m multihost ARGS``; returns the finished process with text output."""
    return subprocess.run(
        [sys.executable, "-m", "multihost", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **env},
        stdin=subprocess.DEVNULL,
    )


def spawn(args: Sequence[str], *, cwd: Path | None = None) -> subprocess.Popen[str]:
    """Start the CLI in the background (for signals); stdout/stderr are pipes."""
    return subprocess.Popen(
        [sys.executable, "-m", "multihost", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )


def manifest(log_dir: Path, run: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((log_dir / run / "run.json").read_text())
    return data


def host_logs(log_dir: Path, run: str) -> dict[str, str]:
    """Local log text per host file stem."""
    return {p.stem: p.read_text() for p in sorted((log_dir / run).glob("*.log"))}


def fleet_run_args(
    fleet: Any, code: Path, logs: Path, run: str, cmd: str, n: int, *extra: str
) -> list[str]:
    """``multihost run`` over the first ``n`` hosts of the loopback fleet, 2 s grace."""
    return [
        "run",
        "--hosts",
        ",".join(fleet.aliases[:n]),
        "--ssh-config",
        str(fleet.ssh_config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        run,
        "--grace",
        "2",
        *extra,
        "--cmd",
        cmd,
    ]


def no_processes(fleet: Any, n: int) -> bool:
    """No process of the first ``n`` hosts' users is left (read from /proc)."""
    return all(not fleet.user_processes(i) for i in range(n))
