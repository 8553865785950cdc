"""Warm processes against cold ones, side by side in one run (``benchmarks/warm.py``).

1. An 8-point sweep of the bundled shardings payload (``--grid fsdp×tp`` with ``fsdp*tp == 8``,
   ``--grid impl=jit,shard_map``) on ``--local 4`` with two CPU devices each: ``multihost sweep``
   cold and ``--warm``, interleaved, ``--repeat`` times each; wall time from outside (the CLI's
   whole life), the points that succeeded, each point's step time and fingerprint.
2. A trivial function: ``multihost.call`` fresh each time against a session's ``call`` from the
   second on, on the same ``--local 4``.
3. Memory over ten points: the shardings payload ten times in one session, each host's JAX live
   arrays (count, bytes) and RSS read after each.
4. The model for a pod: each point's start (interpreter, ``import jax``, joining, the backend)
   is paid once per warm set instead of once per point; from the sweep's own records.

Writes its section of benchmarks/RESULTS.md. Usage: ``python benchmarks/warm.py [--repeat 3]``.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402

SECTION = "warm"
HOSTS = 4
CPU = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}
SIZES = "-d 256 -b 32 -n 2 --tries 5"
TEMPLATE = (
    f"{sys.executable} payloads/shardings.py --ici_fsdp_parallelism {{fsdp}} "
    f"--ici_tensor_parallelism {{tp}} --impl {{impl}} {SIZES}"
)
GRID = ["--grid", "fsdp=1,2,4,8", "--grid", "tp=1,2,4,8", "--grid", "impl=jit,shard_map"]


def sweep(logs: Path, name: str, warm: bool, home: Path) -> tuple[float, list[dict[str, Any]]]:
    """One ``multihost sweep`` from outside: (wall seconds, its records)."""
    args = [sys.executable, "-m", "multihost", "sweep", "--local", str(HOSTS)]
    args += ["--script-dir", str(ROOT), "--log-dir", str(logs), "--run-name", name]
    for k, v in CPU.items():
        args += ["--env", f"{k}={v}"]
    args += ["--cmd", TEMPLATE, *GRID, "--where", "fsdp*tp == 8", "--point-timeout", "600"]
    args += ["--warm"] if warm else []
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"sweep {name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (logs / name / "results.jsonl").read_text().splitlines()]
    return wall, rows


def calls(repeat: int) -> tuple[list[float], list[float], float]:
    """(fresh multihost.call seconds, session call seconds from the second on, the session's
    start seconds)."""
    import multihost

    fresh, warm = [], []
    kw: dict[str, Any] = {"local": HOSTS, "stream": "none", "env": CPU}
    for _ in range(repeat):
        t = time.perf_counter()
        multihost.call(os.getpid, **kw)
        fresh.append(time.perf_counter() - t)
    t = time.perf_counter()
    with multihost.session(**kw) as s:
        started = time.perf_counter() - t
        s.call(os.getpid)  # the first: not counted
        for _ in range(repeat * 4):
            t = time.perf_counter()
            s.call(os.getpid)
            warm.append(time.perf_counter() - t)
    return fresh, warm, started


def _stats() -> tuple[int, int, int]:
    import gc

    import jax

    gc.collect()
    arrays = jax.live_arrays()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return len(arrays), sum(a.nbytes for a in arrays), rss * 1024


def memory(points: int) -> list[list[tuple[int, int, int]]]:
    """Each point's [(live arrays, their bytes, RSS) per host], the same payload each time."""
    import multihost

    args = ["--ici_fsdp_parallelism", "4", "--ici_tensor_parallelism", "2", *SIZES.split()]
    seen = []
    with multihost.session(local=HOSTS, stream="none", env=CPU, script_dir=ROOT) as s:
        for _ in range(points):
            assert s.run_script("payloads/shardings.py", *args).ok
            seen.append(s.call(_stats))
    return seen


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="sweeps of each kind; calls ×5")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    loads = [os.getloadavg()[0]]
    walls: dict[bool, list[float]] = {False: [], True: []}
    records: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="multihost-warm-bench-") as tmp:
        scratch = Path(tmp)
        home, logs = scratch / "home", scratch / "logs"
        home.mkdir()
        os.environ["HOME"] = str(home)
        os.environ["MULTIHOST_LOG_DIR"] = str(logs)
        for i in range(args.repeat):
            for warm in (False, True):  # interleaved: the load falls on both alike
                wall, rows = sweep(logs, f"{'warm' if warm else 'cold'}-{i}", warm, home)
                walls[warm].append(wall)
                records[warm] += rows
                loads.append(os.getloadavg()[0])
                print(f"sweep {'warm' if warm else 'cold'} {i}: {wall:.1f} s", file=sys.stderr)
        fresh, warm_calls, session_start = calls(args.repeat * 5)
        loads.append(os.getloadavg()[0])
        seen = memory(10)
        loads.append(os.getloadavg()[0])
    text = report(args, walls, records, fresh, warm_calls, session_start, seen, loads)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


def report(
    args: argparse.Namespace,
    walls: dict[bool, list[float]],
    records: dict[bool, list[dict[str, Any]]],
    fresh: list[float],
    warm_calls: list[float],
    session_start: float,
    seen: list[list[tuple[int, int, int]]],
    loads: list[float],
) -> str:
    cold_wall, warm_wall = _median(walls[False]), _median(walls[True])
    ok = {w: sum(r["status"] == "ok" for r in records[w]) for w in (False, True)}
    total = {w: len(records[w]) for w in (False, True)}

    def per_point(warm: bool, field: str) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for r in records[warm]:
            if r["status"] == "ok":
                out.setdefault(r["point"], []).append(float(r[field]))
        return {k: _median(v) for k, v in out.items()}

    steps = {w: per_point(w, "step_time_s") for w in (False, True)}
    prints = {w: per_point(w, "fingerprint") for w in (False, True)}
    durations = {
        w: _median([r["ended"] - r["started"] for r in records[w] if r["status"] == "ok"])
        for w in (False, True)
    }
    points = sorted(steps[False])
    ratio = [steps[True][p] / steps[False][p] for p in points if p in steps[True]]
    same_prints = all(prints[True].get(p) == prints[False][p] for p in points)
    rows = [
        "| sweep | runs | points ok | wall (s): median | min | max | per point (s): median |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w in (False, True):
        ws = walls[w]
        rows.append(
            f"| {'`--warm`' if w else 'cold'} | {len(ws)} | {ok[w]}/{total[w]} | "
            f"{_median(ws):.1f} | {min(ws):.1f} | {max(ws):.1f} | {durations[w]:.2f} |"
        )
    point_rows = [
        "| point | step, cold (ms) | step, warm (ms) | warm / cold |",
        "|---|---:|---:|---:|",
    ]
    for p in points:
        c, w = steps[False][p], steps[True].get(p, float("nan"))
        point_rows.append(f"| {p} | {c * 1e3:.2f} | {w * 1e3:.2f} | {w / c:.2f} |")
    call_ratio = _median(warm_calls) / _median(fresh)
    first, last = seen[0], seen[-1]
    arrays = sorted({h[0] for point in seen for h in point})
    live_bytes = sorted({h[1] for point in seen for h in point})
    rss_growth = max(last[i][2] - first[i][2] for i in range(len(first)))
    rss_growth_late = max(last[i][2] - seen[2][i][2] for i in range(len(first)))
    start_cost = durations[False] - durations[True]
    n = total[True] // max(1, len(walls[True]))
    begin, end = markers(SECTION)
    wall_ratio = warm_wall / cold_wall
    lines = [
        begin,
        "## Warm processes: `sweep --warm` and `multihost.session` (benchmarks/warm.py)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}; load average (1 min) {min(loads):.1f}–{max(loads):.1f} "
        "(the machine is shared: other work inflates every figure).",
        "",
        f"Command: `python benchmarks/warm.py --repeat {args.repeat}`. The sweep: `multihost "
        f"sweep --local {HOSTS} --env JAX_PLATFORMS=cpu --env JAX_NUM_CPU_DEVICES=2 --cmd "
        f"'python payloads/shardings.py --ici_fsdp_parallelism {{fsdp}} "
        f"--ici_tensor_parallelism {{tp}} --impl {{impl}} {SIZES}' --grid fsdp=1,2,4,8 --grid "
        "tp=1,2,4,8 --grid impl=jit,shard_map --where 'fsdp*tp == 8'` (8 points), cold and "
        "with `--warm`, interleaved; wall from outside, the CLI's whole life; per point: a "
        "record's `ended − started` (a cold point's includes its processes' start).",
        "",
        *rows,
        "",
        f"`--warm` / cold wall: **{wall_ratio:.2f}** (target ≤ 0.5: "
        f"{'met' if wall_ratio <= 0.5 else 'MISSED'}); the same points succeeded: "
        f"{'yes' if ok[True] == ok[False] == total[False] else 'NO'}; the fingerprints of the "
        f"updated weights, cold and warm: {'identical' if same_prints else 'DIFFERENT'}; each "
        f"point's median step time warm / cold: {min(ratio):.2f}–{max(ratio):.2f} (median "
        f"{_median(ratio):.2f}):",
        "",
        *point_rows,
        "",
        f"A trivial function (`os.getpid`) on `--local {HOSTS}`: a fresh `multihost.call` "
        f"{_median(fresh) * 1e3:.0f} ms (median of {len(fresh)}), a session's `call` from the "
        f"second on {_median(warm_calls) * 1e3:.1f} ms (median of {len(warm_calls)}): "
        f"**{call_ratio:.3f}×** (target ≤ 0.3: {'met' if call_ratio <= 0.3 else 'MISSED'}); the "
        f"session's start (connect, stage, start the processes, join) {session_start:.1f} s.",
        "",
        f"Memory over ten points (the shardings payload ten times in one session, fsdp 4 × tp "
        f"2, then each host's state read): JAX live arrays after every point: {arrays} (count), "
        f"{live_bytes} (bytes); RSS growth per host, point 1 → 10: at most "
        f"{rss_growth / 2**20:.1f} MiB; point 3 → 10: at most {rss_growth_late / 2**20:.1f} MiB "
        f"(RSS after point 1: {first[0][2] / 2**20:.0f} MiB on host 0).",
        "",
        "The model for a pod, from these numbers: a cold point costs its processes' start (the "
        "interpreter, `import jax`, joining the job, the backend) plus its compile plus its "
        f"steps; here the start is {start_cost:.1f} s of a cold point's {durations[False]:.1f} s "
        f"(warm: {durations[True]:.1f} s). With `--warm` the start is paid once per warm set, "
        "and a compile once per program the processes have not compiled yet (jit caches carry "
        "over; a point of another shape still compiles). On a TPU pod the backend's start and "
        "XLA's compile are each tens of seconds: an N-point sweep saves about (N − 1) × start, "
        f"and a repeat of a shape its compile too; here {n} points saved "
        f"{cold_wall - warm_wall:.0f} s of {cold_wall:.0f} s.",
        end,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
