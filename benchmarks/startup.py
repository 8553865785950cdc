"""Startup benchmark: the wall time of ``multihost --help`` against the bare interpreter.

Every trial starts a fresh process: ``python -c pass`` (the floor), ``python -c 'import
multihost'`` (the public API) and ``python -m multihost --help`` and ``run --help`` (the CLI),
with this checkout first on ``PYTHONPATH`` (``--before DIR``: another checkout too, interleaved
with this one). One more ``-X importtime`` run per checkout says which heavy libraries the help
imports (it should import none). Writes its section of benchmarks/RESULTS.md. Usage:
``python benchmarks/startup.py [--repeat 20] [--before ../main]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402

SECTION = "startup"
HEAVY = ("asyncssh", "rich", "jax", "numpy", "cryptography")
COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "import multihost": ["-c", "import multihost"],
    "multihost --help": ["-m", "multihost", "--help"],
    "multihost run --help": ["-m", "multihost", "run", "--help"],
}


def _env(root: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else str(root)}


def once(root: Path, args: Sequence[str]) -> float:
    """Wall seconds of one fresh ``python ARGS`` with ``root`` first on the path."""
    started = time.monotonic()
    subprocess.run([sys.executable, *args], env=_env(root), check=True, capture_output=True)
    return time.monotonic() - started


def heavy_imports(root: Path, args: Sequence[str]) -> list[str]:
    """Which of HEAVY the command imports (``-X importtime``)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        env=_env(root),
        check=True,
        capture_output=True,
        text=True,
    )
    names = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()}
    return [h for h in HEAVY if h in names]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print and record the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--before", type=Path, default=None, help="another checkout to compare")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    versions = {"this checkout": ROOT}
    if args.before:
        versions["before"] = args.before.resolve()
    times: dict[tuple[str, str], list[float]] = {(v, c): [] for v in versions for c in COMMANDS}
    loads = []
    for _ in range(args.repeat):
        for cmd, cargs in COMMANDS.items():  # interleaved: each command, each version in turn
            for v, root in versions.items():
                times[(v, cmd)].append(once(root, cargs))
        loads.append(os.getloadavg()[0])
    rows = [
        "| version | command | wall (s): median | min | max | − bare python (s) | heavy imports |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    med = {k: statistics.median(ts) for k, ts in times.items()}
    for v, root in versions.items():
        for cmd, cargs in COMMANDS.items():
            ts = times[(v, cmd)]
            extra = med[(v, cmd)] - med[(v, "python -c pass")]
            heavy = ", ".join(heavy_imports(root, cargs)) or "none"
            rows.append(
                f"| {v} | {cmd} | {med[(v, cmd)]:.3f} | {min(ts):.3f} | {max(ts):.3f} "
                f"| {extra:.3f} | {heavy} |"
            )
    verdict = ""
    if args.before:
        ratios = [
            f"{cmd}: {med[('this checkout', cmd)] / med[('before', cmd)]:.2f}"
            for cmd in COMMANDS
            if cmd != "python -c pass"
        ]
        verdict = "This checkout / before (medians): " + "; ".join(ratios) + "."
    begin, end = markers(SECTION)
    before = f" --before {args.before}" if args.before else ""
    text = "\n".join(
        [
            begin,
            "## Startup: `multihost --help` against the bare interpreter (benchmarks/startup.py)",
            "",
            f"Machine: {platform.processor() or platform.machine()}, "
            f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, Linux "
            f"{platform.release()}, {time.strftime('%Y-%m-%d')}; load average before/after: "
            f"{load_before:.1f} / {os.getloadavg()[0]:.1f}, during "
            f"{min(loads):.1f}–{max(loads):.1f} "
            "(the machine is shared).",
            "",
            "Each trial starts a fresh `python` for every command, this checkout first on "
            "`PYTHONPATH`; commands and versions interleaved; *heavy imports*: which of "
            f"{', '.join(HEAVY)} the command imports (`-X importtime`, one more run).",
            "",
            f"Command: `python benchmarks/startup.py --repeat {args.repeat}{before}`",
            "",
            *rows,
            *([""] if verdict else []),
            *([verdict] if verdict else []),
            end,
        ]
    )
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
