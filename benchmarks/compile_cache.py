"""Compile cache benchmark: the bundled shardings payload over ``--local N``, twice in a row
with a fresh cache (a new HOME each repeat), its start-up phases read from run.json.

For each N and repeat: run 1 (an empty cache), run 2 (the cache run 1 filled), and a run with
``--no-compile-cache`` (what writing the entries costs run 1). The ``compile`` phase is the
seconds from the phase before it (``devices``) to the end of the last compile before the first
step, per host; the table keeps the median over hosts, then the median over repeats, and the
ratio run 2 / run 1 per repeat. The disk table: entries and bytes per process after run 1.
Writes its section of benchmarks/RESULTS.md. Usage:
``python benchmarks/compile_cache.py [--hosts 2 4] [--repeat 5] [-- PAYLOAD ARGS]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from multihost.results.phases import phase_times  # noqa: E402

SECTION = "compile-cache"
PAYLOAD = ["-d", "256", "-b", "32", "-if", "-1"]  # the REFERENCE's measurement, every device fsdp


def run(home: Path, logs: Path, n: int, name: str, payload: Sequence[str], *extra: str) -> dict:  # type: ignore[type-arg]
    """One ``--local n`` payload run; its phases per host (run.json) and each host's compile
    and first-step seconds."""
    cmd = [
        *(sys.executable, "-m", "multihost", "run", "--local", str(n), "--log-dir", str(logs)),
        *("--run-name", name, "--stream", "none", *extra, "--payload", "shardings", "--"),
        *payload,
    ]
    env = {**os.environ, "HOME": str(home)}
    env.pop("XDG_CACHE_HOME", None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
    hosts = json.loads((logs / name / "run.json").read_text())["hosts"]
    phases = [h.get("startup") or {} for h in hosts]
    if not all("compile" in p and "first_step" in p for p in phases):
        raise SystemExit(f"{name}: a host without compile/first_step phases: {phases}")
    return {
        "compile": statistics.median(phase_times(p)["compile"] for p in phases),
        "first_step": statistics.median(p["first_step"] for p in phases),
    }


def disk(home: Path, n: int) -> tuple[list[int], list[int]]:
    """Per worker: entries and bytes in its compile cache; and every entry's size."""
    per, sizes = [], []
    for w in range(n):
        files = [
            p
            for p in (home / ".cache/multihost/local" / f"w{w}" / "compile-cache").rglob("*")
            if p.is_file()
        ]
        per.append(sum(p.stat().st_size for p in files))
        sizes += [p.stat().st_size for p in files]
    return per, sizes


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("payload", nargs="*", default=PAYLOAD, help="the payload's arguments")
    args = p.parse_args(argv)
    rows = [
        "| hosts | repeats | compile, run 1 (s) | compile, run 2 (s) | run 2 / run 1 (median; "
        "range) | no cache (s) | first step at, run 1 → run 2 (s) |",
        "|---:|---:|---:|---:|---|---:|---|",
    ]
    disk_rows = [
        "| hosts | entries per process | bytes per process (median) | bytes per entry: median "
        "| largest |",
        "|---:|---:|---:|---:|---:|",
    ]
    loads = [os.getloadavg()[0]]
    started = time.strftime("%Y-%m-%d %H:%M")
    for n in args.hosts:
        one, two, none, ratios, steps1, steps2 = [], [], [], [], [], []
        entries: list[int] = []
        per_process: list[int] = []
        sizes: list[int] = []
        for r in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="multihost-cc-") as tmp:
                home, logs = Path(tmp) / "home", Path(tmp) / "logs"
                home.mkdir()
                first = run(home, logs, n, f"r{r}-one", args.payload)
                per, each = disk(home, n)
                entries.append(len(each) // n)
                per_process += per
                sizes += each
                second = run(home, logs, n, f"r{r}-two", args.payload)
                off = run(home, logs, n, f"r{r}-off", args.payload, "--no-compile-cache")
            one.append(first["compile"])
            two.append(second["compile"])
            none.append(off["compile"])
            ratios.append(second["compile"] / first["compile"])
            steps1.append(first["first_step"])
            steps2.append(second["first_step"])
            loads.append(os.getloadavg()[0])
            print(
                f"--local {n} repeat {r}: compile {first['compile']:.2f} → "
                f"{second['compile']:.2f} s (no cache {off['compile']:.2f} s)",
                file=sys.stderr,
            )
        med = statistics.median
        rows.append(
            f"| {n} | {args.repeat} | {med(one):.2f} | {med(two):.2f} | {med(ratios):.2f} "
            f"({min(ratios):.2f}–{max(ratios):.2f}) | {med(none):.2f} | "
            f"{med(steps1):.2f} → {med(steps2):.2f} |"
        )
        disk_rows.append(
            f"| {n} | {med(entries):.0f} | {med(per_process) / 1024:.0f} KiB | "
            f"{med(sizes) / 1024:.1f} KiB | {max(sizes) / 1024:.1f} KiB |"
        )
    begin, end = markers(SECTION)
    text = "\n".join(
        [
            begin,
            "## Compile cache: the same run twice (benchmarks/compile_cache.py)",
            "",
            f"Machine: {platform.processor() or platform.machine()}, "
            f"{len(os.sched_getaffinity(0))} cores (shared), Python {platform.python_version()}, "
            f"{started}; load average {min(loads):.1f}–{max(loads):.1f}. The shardings payload "
            f"(`{' '.join(args.payload)}`) over `--local N` on CPU: run 1 with an empty cache, "
            "run 2 with what run 1 left, and one with `--no-compile-cache`. `compile`: the phase's "
            "own seconds (from `devices` to the end of the last compile before the first step), "
            "median over hosts, then over repeats.",
            "",
            f"Command: `python benchmarks/compile_cache.py --hosts "
            f"{' '.join(map(str, args.hosts))} --repeat {args.repeat}`",
            "",
            *rows,
            "",
            "What run 1 left in each process's cache:",
            "",
            *disk_rows,
            end,
        ]
    )
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
