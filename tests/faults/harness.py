"""Running the runner under a fault: wall time, peak memory, and what is left on the hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Outcome:
    """How one ``multihost`` process ended."""

    returncode: int
    stdout: str
    stderr: str
    wall: float  # seconds from start to exit
    max_rss_mb: float  # the runner's own peak resident memory (VmHWM), its children not counted


def run_measured(
    args: Sequence[str], *, timeout: float = 120, env: dict[str, str] | None = None
) -> Outcome:
    """``python -m multihost ARGS``, its peak memory read from /proc (the kernel's high-water
    mark of the runner process itself, sampled until it exits)."""
    out_path, err_path = (
        Path(os.environ.get("TMPDIR", "/tmp")) / f"mh-{os.getpid()}-{n}" for n in ("out", "err")
    )
    started = time.monotonic()
    with out_path.open("w+") as out, err_path.open("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multihost", *args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
        )
        deadline = started + timeout
        peak_kb = 0
        while proc.poll() is None:
            peak_kb = max(peak_kb, _high_water_kb(proc.pid))
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.05)
        wall = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        result = Outcome(proc.returncode, out.read(), err.read(), wall, peak_kb / 1024)
    out_path.unlink()
    err_path.unlink()
    return result


def _high_water_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
