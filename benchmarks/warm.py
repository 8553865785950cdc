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
# the payload's sizes: as the tests run it (start-up dominates), and heavier (compile and steps
# take a larger share, which a warm process does not save)
SIZES = {"small": "-d 128 -b 8 -n 1 --tries 1", "medium": "-d 256 -b 32 -n 2 --tries 5"}
TEMPLATE = (
    f"{sys.executable} payloads/shardings.py --ici_fsdp_parallelism {{fsdp}} "
    "--ici_tensor_parallelism {tp} --impl {impl} "
)
GRID = ["--grid", "fsdp=1,2,4,8", "--grid", "tp=1,2,4,8", "--grid", "impl=jit,shard_map"]


def sweep(
    logs: Path, name: str, warm: bool, home: Path, sizes: str
) -> tuple[float, list[dict[str, Any]]]:
    """One ``multihost sweep`` from outside: (wall seconds, its records)."""
    args = [sys.executable, "-m", "multihost", "sweep", "--local", str(HOSTS)]
    args += ["--script-dir", str(ROOT), "--log-dir", str(logs), "--run-name", name]
    for k, v in CPU.items():
        args += ["--env", f"{k}={v}"]
    args += ["--cmd", TEMPLATE + sizes, *GRID, "--where", "fsdp*tp == 8"]
    args += ["--point-timeout", "600"]
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

    args = ["--ici_fsdp_parallelism", "4", "--ici_tensor_parallelism", "2"]
    args += SIZES["medium"].split()
    seen = []
    with multihost.session(local=HOSTS, stream="none", env=CPU, script_dir=ROOT) as s:
        for _ in range(points):
            assert s.run_script("payloads/shardings.py", *args).ok
            seen.append(s.call(_stats))
    return seen


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


Kind = tuple[str, bool]  # (sizes, warm)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="sweeps of each kind; calls ×5")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--save", type=Path, help="keep the measurements in this JSON file")
    p.add_argument("--load", type=Path, help="only make the table from a --save file")
    args = p.parse_args(argv)
    if args.load:
        raw = json.loads(args.load.read_text())
        kinds = [(size, warm) for size in SIZES for warm in (False, True)]
        walls = {k: raw["walls"][f"{k[0]}/{k[1]}"] for k in kinds}
        records = {k: raw["records"][f"{k[0]}/{k[1]}"] for k in kinds}
        seen = [[tuple(h) for h in point] for point in raw["seen"]]
        args.repeat = raw["repeat"]
        text = report(
            args, walls, records, raw["fresh"], raw["warm"], raw["start"], seen, raw["loads"]
        )  # type: ignore[arg-type]
        print(text)
        if not args.no_write:
            write_section(SECTION, text)
        return 0
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    loads = [os.getloadavg()[0]]
    kinds = [(size, warm) for size in SIZES for warm in (False, True)]
    walls: dict[Kind, list[float]] = {k: [] for k in kinds}
    records: dict[Kind, list[dict[str, Any]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="multihost-warm-bench-") as tmp:
        scratch = Path(tmp)
        home, logs = scratch / "home", scratch / "logs"
        home.mkdir()
        os.environ["HOME"] = str(home)
        os.environ["MULTIHOST_LOG_DIR"] = str(logs)
        for i in range(args.repeat):
            for size, warm in kinds:  # interleaved: the load falls on every kind alike
                name = f"{size}-{'warm' if warm else 'cold'}-{i}"
                wall, rows = sweep(logs, name, warm, home, SIZES[size])
                walls[(size, warm)].append(wall)
                records[(size, warm)] += rows
                loads.append(os.getloadavg()[0])
                print(f"sweep {name}: {wall:.1f} s", file=sys.stderr)
        fresh, warm_calls, session_start = calls(args.repeat * 5)
        loads.append(os.getloadavg()[0])
        seen = memory(10)
        loads.append(os.getloadavg()[0])
    if args.save:
        raw = {
            "repeat": args.repeat,
            "walls": {f"{k[0]}/{k[1]}": v for k, v in walls.items()},
            "records": {f"{k[0]}/{k[1]}": v for k, v in records.items()},
            "fresh": fresh,
            "warm": warm_calls,
            "start": session_start,
            "seen": seen,
            "loads": loads,
        }
        args.save.write_text(json.dumps(raw))
    text = report(args, walls, records, fresh, warm_calls, session_start, seen, loads)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


def _per_point(rows: list[dict[str, Any]], field: str) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] == "ok":
            out.setdefault(r["point"], []).append(float(r[field]))
    return {k: _median(v) for k, v in out.items()}


def report(
    args: argparse.Namespace,
    walls: dict[Kind, list[float]],
    records: dict[Kind, list[dict[str, Any]]],
    fresh: list[float],
    warm_calls: list[float],
    session_start: float,
    seen: list[list[tuple[int, int, int]]],
    loads: list[float],
) -> str:
    rows = [
        "| sizes | sweep | runs | points ok | wall (s): median | min | max | warm / cold "
        "| per point (s): median |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts, model = [], []
    for size in SIZES:
        cold, warm = walls[(size, False)], walls[(size, True)]
        ratio = _median(warm) / _median(cold)
        each = {}
        for w in (False, True):
            recs = records[(size, w)]
            ok = sum(r["status"] == "ok" for r in recs)
            each[w] = _median([r["ended"] - r["started"] for r in recs if r["status"] == "ok"])
            ws = walls[(size, w)]
            rows.append(
                f"| `{SIZES[size]}` | {'`--warm`' if w else 'cold'} | {len(ws)} | "
                f"{ok}/{len(recs)} | {_median(ws):.1f} | {min(ws):.1f} | {max(ws):.1f} | "
                f"{f'**{ratio:.2f}**' if w else ''} | {each[w]:.2f} |"
            )
        oks = [sum(r["status"] == "ok" for r in records[(size, w)]) for w in (False, True)]
        prints = [_per_point(records[(size, w)], "fingerprint") for w in (False, True)]
        verdicts.append(
            f"`{SIZES[size]}`: warm / cold {ratio:.2f} (target ≤ 0.5: "
            f"{'met' if ratio <= 0.5 else 'MISSED'}); the same points succeeded: "
            f"{'yes' if oks[0] == oks[1] == len(records[(size, False)]) else 'NO'}; the "
            "fingerprints of the updated weights, point by point: "
            f"{'identical' if prints[0] == prints[1] else 'DIFFERENT'}"
        )
        model.append((size, each[False] - each[True], each[False], each[True]))
    steps = [_per_point(records[("medium", w)], "step_time_s") for w in (False, True)]
    point_rows = [
        "| point | step, cold (ms) | step, warm (ms) | warm / cold |",
        "|---|---:|---:|---:|",
    ]
    ratios = []
    for point in sorted(steps[0]):
        c, w = steps[0][point], steps[1].get(point, float("nan"))
        ratios.append(w / c)
        point_rows.append(f"| {point} | {c * 1e3:.1f} | {w * 1e3:.1f} | {w / c:.2f} |")
    call_ratio = _median(warm_calls) / _median(fresh)
    first, last = seen[0], seen[-1]
    arrays = sorted({h[0] for point in seen for h in point})
    live_bytes = sorted({h[1] for point in seen for h in point})
    growth = max(last[i][2] - first[i][2] for i in range(len(first)))
    growth_late = max(last[i][2] - seen[2][i][2] for i in range(len(first)))
    begin, end = markers(SECTION)
    saved = "; ".join(
        f"`{SIZES[size]}`: {start:.1f} s of a cold point's {cold:.1f} s (warm {warm:.1f} s)"
        for size, start, cold, warm in model
    )
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
        "'python payloads/shardings.py --ici_fsdp_parallelism {fsdp} --ici_tensor_parallelism "
        "{tp} --impl {impl} SIZES' --grid fsdp=1,2,4,8 --grid tp=1,2,4,8 --grid "
        "impl=jit,shard_map --where 'fsdp*tp == 8'` (8 points, each a program of its own), "
        "cold and with `--warm`, at two sizes, every kind in turn in each repeat; wall from "
        "outside, the CLI's whole life; per point: a record's `ended − started` (a cold "
        "point's includes its processes' start and end).",
        "",
        *rows,
        "",
        *(f"- {v}" for v in verdicts),
        "",
        f"Each point's median step time (`{SIZES['medium']}`), warm / cold "
        f"{min(ratios):.2f}–{max(ratios):.2f} (median {_median(ratios):.2f}): the same program "
        "on the same devices, the spread the machine's load:",
        "",
        *point_rows,
        "",
        f"A trivial function (`os.getpid`) on `--local {HOSTS}`: a fresh `multihost.call` "
        f"{_median(fresh) * 1e3:.0f} ms (median of {len(fresh)}), a session's `call` from the "
        f"second on {_median(warm_calls) * 1e3:.1f} ms (median of {len(warm_calls)}): "
        f"**{call_ratio:.3f}×** (target ≤ 0.3: {'met' if call_ratio <= 0.3 else 'MISSED'}); "
        f"the session's start (connect, stage, start the processes, join) {session_start:.1f} s.",
        "",
        "Memory over ten points (the shardings payload, fsdp 4 × tp 2, "
        f"`{SIZES['medium']}`, ten times in one session, each host's state read after each): "
        f"JAX live arrays after every point {arrays} (count), {live_bytes} (bytes); RSS growth "
        f"per host, point 1 → 10 at most {growth / 2**20:.1f} MiB, point 3 → 10 at most "
        f"{growth_late / 2**20:.1f} MiB (RSS after point 1: {first[0][2] / 2**20:.0f} MiB on "
        "host 0).",
        "",
        "The model for a pod: a cold point costs its processes' start (the interpreter, `import "
        "jax`, joining the job, the backend) and end, plus its compile, plus its steps; a warm "
        "point only the last two, and its compile only for a program the processes have not "
        "compiled yet (a repeat of a point runs the step compiled then). Here the start and end "
        f"are {saved}. So an N-point warm sweep costs one start + N × (compile + steps) against "
        "N × (start + compile + steps): the more a point's start weighs against its compile and "
        "steps, the more `--warm` saves. On a TPU pod the backend's start and XLA's compile are "
        "each tens of seconds: `--warm` saves (N − 1) starts (tens of seconds each, more with "
        "many hosts joining) and, for repeated points, their compiles; distinct points still "
        "compile each.",
        end,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
