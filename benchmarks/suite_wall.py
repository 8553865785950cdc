"""Test-suite wall time and how busy the machine was meanwhile: a pytest command's wall, and
the CPU-seconds every core spent busy and idle while it ran (from ``/proc/stat``, so the
sshd fleet's sessions, the stand-in VMs' jobs and everything else on the machine count).

Idle seconds are what more test workers could still use: a suite that mostly waits (on hosts,
timeouts, polls) leaves cores idle with as many workers as cores (benchmarks/RESULTS.md,
*Three workers*). Other sessions' work on a shared machine counts as busy: say the load.

Usage: ``python benchmarks/suite_wall.py [-- PYTEST ARGS]`` (default: the README's
``-n 3 --dist loadfile``); prints one line, the pytest summary line included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("-n", "3", "--dist", "loadfile", "-q", "-p", "no:cacheprovider")


def cpu_seconds() -> tuple[float, float]:
    """Busy and idle CPU-seconds of all cores since boot (iowait counts as idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    busy = sum(fields[:8]) - idle
    return busy / tick, idle / tick


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    load = os.getloadavg()[0]
    busy0, idle0 = cpu_seconds()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *(args or DEFAULT)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    busy1, idle1 = cpu_seconds()
    lines = [
        ln for ln in proc.stdout.splitlines() if " in " in ln and ("passed" in ln or "failed" in ln)
    ]
    print(
        f"wall {wall:.0f} s; machine CPU busy {busy1 - busy0:.0f} s, idle {idle1 - idle0:.0f} s "
        f"({os.cpu_count()} cores); load {load:.2f} -> {os.getloadavg()[0]:.2f}; "
        f"exit {proc.returncode}; {lines[-1] if lines else 'no summary line'}"
    )
    if proc.returncode:
        sys.stdout.write(proc.stdout[-20000:])
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
