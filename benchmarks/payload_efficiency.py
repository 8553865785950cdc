"""shardings.py's step against a bare jitted chain of the same matmuls, in interleaved pairs.

For each device count (a subprocess with JAX_NUM_CPU_DEVICES=n on CPU, or the real devices with
--devices 0), one worker builds the payload's step exactly as shardings.py does (its inputs,
mesh and `steps.make_step`, fsdp over all devices) and a plain jax.jit of the same per-device
problem (batch b, unsharded, one device). Both are compiled and warmed up once; then --pairs
pairs are timed, each pair --steps payload steps and --steps bare steps interleaved one by one
(ABAB…, the next pair BABA…), so that load from elsewhere falls on both sides alike. Pair
ratio = bare seconds / payload seconds = payload TFLOP/s per device / bare TFLOP/s. The verdict
(one device only) needs the whole interquartile range of the pair ratios on one side of the
threshold; otherwise it is "inconclusive".
Writes its section of RESULTS.md, keeping the summaries of the last runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import RESULTS, markers  # noqa: E402
from benchmarks.results import write_section as _write  # noqa: E402

BEGIN, END = markers("payload_efficiency")
RUNS_TAG = "<!-- payload_efficiency:runs "
KEEP_RUNS = 3
THRESHOLD = 0.9
sys.path.insert(0, str(ROOT / "payloads"))


def make_bare(d: int, layers: int, batch: int) -> Any:
    """A zero-argument callable running the same step unsharded on one device."""
    import jax
    import jax.numpy as jnp

    def loss(x: Any, ws: list[tuple[Any, Any]]) -> Any:
        for w1, w2 in ws:
            x = jax.nn.sigmoid(jax.nn.sigmoid(x @ w1.T) @ w2)
        return jnp.sum(x)

    @jax.jit
    def step(x: Any, ws: list[tuple[Any, Any]]) -> Any:
        value, grads = jax.value_and_grad(loss, argnums=1)(x, ws)
        return value, jax.tree.map(lambda p, g: p - 1e-4 * g, ws, grads)

    dev = jax.devices()[0]
    keys = jax.random.split(jax.random.key(1), 2 * layers + 1)
    x = jax.device_put(jax.random.uniform(keys[0], (batch, d), dtype=jnp.bfloat16), dev)
    shape = (4 * d, d)
    ws = [
        tuple(
            jax.device_put(1e-4 * jax.random.normal(k, shape, dtype=jnp.bfloat16), dev)
            for k in keys[1 + 2 * i : 3 + 2 * i]
        )
        for i in range(layers)
    ]
    return lambda: step(x, ws)


def make_payload(d: int, layers: int, batch: int, impl: str) -> Any:
    """A zero-argument callable running shardings.py's step (fsdp over all devices)."""
    import jax
    import meshing
    import shardings
    import steps

    flags = ["-d", str(d), "-b", str(batch), "-n", str(layers), "-if", "-1", "--impl", impl]
    args = shardings.parse_args(flags)
    mesh, _ = meshing.mesh_from_args(args)
    with jax.set_mesh(mesh):
        x, params = shardings.make_inputs(
            mesh, 0, batch * jax.device_count(), d, layers, args.init_scale
        )
        step = steps.make_step(mesh, impl)
    return lambda: step(x, params)


def one_step(run: Any) -> float:
    """Seconds of one call, waited for."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def timed_pair(payload: Any, bare: Any, steps: int, bare_first: bool) -> tuple[float, float]:
    """(payload seconds, bare seconds), each summed over `steps` steps interleaved one by one."""
    p_total = b_total = 0.0
    for _ in range(steps):
        if bare_first:
            b_total += one_step(bare)
            p_total += one_step(payload)
        else:
            p_total += one_step(payload)
            b_total += one_step(bare)
    return p_total / steps, b_total / steps


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3)."""
    q1, med, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(q1), float(med), float(q3)


def worker(args: argparse.Namespace) -> None:
    """Interleaved pairs; print one json line."""
    import jax
    import shardings

    load_before = os.getloadavg()[0]
    payload = make_payload(args.d, args.layers, args.batch, args.impl)
    bare = make_bare(args.d, args.layers, args.batch)
    one_step(payload)  # compile and warm up
    one_step(bare)
    p_times, b_times = [], []
    for k in range(args.pairs):
        p_s, b_s = timed_pair(payload, bare, args.steps, bare_first=bool(k % 2))
        p_times.append(p_s)
        b_times.append(b_s)
    tflop = shardings.tflop_per_device(args.d, args.layers, args.batch)
    ratios = [b / p for p, b in zip(p_times, b_times, strict=True)]
    out = {
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "payload_s": float(np.median(p_times)),
        "bare_s": float(np.median(b_times)),
        "payload_tflops": tflop / float(np.median(p_times)),
        "bare_tflops": tflop / float(np.median(b_times)),
        "ratios": ratios,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    print("WORKER " + json.dumps(out), flush=True)


def run_worker(args: argparse.Namespace, devices: int) -> dict[str, Any]:
    """One worker subprocess; devices=0 means the machine's real devices."""
    env = dict(os.environ)
    if devices:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    cmd = [sys.executable, __file__, "--worker", "-d", str(args.d), "-b", str(args.batch)]
    cmd += ["-n", str(args.layers), "--steps", str(args.steps), "--pairs", str(args.pairs)]
    cmd += ["--impl", args.impl]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("WORKER "):
            return dict(json.loads(line[len("WORKER ") :]))
    raise RuntimeError(f"worker with {devices} devices failed:\n{proc.stderr[-3000:]}")


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo, else platform.processor()."""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        if found:
            return found.group(1).strip()
    return platform.processor() or "unknown CPU"


def verdict(ratios: list[float], threshold: float = THRESHOLD) -> str:
    """met / missed when the interquartile range clears the threshold, else inconclusive."""
    q1, _, q3 = quartiles(ratios)
    if q1 >= threshold:
        return "met"
    if q3 < threshold:
        return "missed"
    return "inconclusive"


def summary(args: argparse.Namespace, rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One run's line for the history: the one-device ratio, its spread and verdict."""
    one = next((r for r in rows if r["devices"] == 1 or len(rows) == 1), rows[0])
    q1, med, q3 = quartiles(one["ratios"])
    return {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "median": med,
        "q1": q1,
        "q3": q3,
        "pairs": len(one["ratios"]),
        "load": [min(r["load_before"] for r in rows), max(r["load_after"] for r in rows)],
        "verdict": verdict(one["ratios"]),
        "seconds": seconds,
        "size": f"-d {args.d} -b {args.batch} -n {args.layers}",
        "step_s": one["bare_s"],
    }


def render(
    args: argparse.Namespace, rows: list[dict[str, Any]], seconds: float, runs: list[dict[str, Any]]
) -> str:
    """The markdown section, markers and the run history included."""
    import jax

    lines = [
        BEGIN,
        "## Payload efficiency: shardings.py's step vs a bare jitted chain of the same matmuls",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"jax {jax.__version__}. Load average (1 min) is printed per row: other work on the "
        "machine slows both sides of a pair alike, but widens the spread.",
        "",
        f"Problem per device: -d {args.d} -b {args.batch} -n {args.layers} (bf16, the seed's "
        f"1e-4 init), --impl {args.impl}, fsdp over all devices. After one compile-and-warm-up "
        f"call each, {args.pairs} pairs of {args.steps} payload and {args.steps} bare steps "
        "interleaved one by one (ABAB…, then BABA…). *bare*: the same step "
        "unsharded on one device with the per-device batch. *payload / bare* is the payload "
        "column over the bare column as shown (each the median over the pairs); *pair ratios* "
        "are bare time / payload time within each pair: median and interquartile range "
        "[Q1, Q3], the figure the verdict uses (robust to load that changes during the run, "
        "which can pull the two columns' medians apart). CPU rows with "
        "several devices share the same cores, so their per-device FLOP/s fall (× devices ≈ 1 "
        "means sharding costs little beyond core sharing).",
        "",
        f"Latest run: `python benchmarks/payload_efficiency.py --devices {args.devices} "
        f"-d {args.d} -b {args.batch} -n {args.layers} --pairs {args.pairs} --steps "
        f"{args.steps}` ({seconds:.0f} s)",
        "",
        "| devices | device kind | payload step (s) | payload TFLOP/s/device "
        "| bare TFLOP/s (1 device) | payload / bare | pair ratios median [Q1, Q3] "
        "| × devices | load before/after |",
        "|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        q1, med, q3 = quartiles(r["ratios"])
        shown = round(r["payload_tflops"], 5) / round(r["bare_tflops"], 5)
        lines.append(
            f"| {r['devices']} | {r['device_kind']} | {r['payload_s']:.4f} "
            f"| {r['payload_tflops']:.5f} | {r['bare_tflops']:.5f} | {shown:.3f} "
            f"| {med:.3f} [{q1:.3f}, {q3:.3f}] | {shown * r['devices']:.2f} "
            f"| {r['load_before']:.1f} / {r['load_after']:.1f} |"
        )
    lines += [
        "",
        f"Target on one device: payload / bare ≥ {THRESHOLD}, judged on the pair ratios: *met* "
        f"when Q1 ≥ {THRESHOLD}, *missed* when Q3 < {THRESHOLD}, otherwise *inconclusive*.",
        "",
        f"Last {KEEP_RUNS} runs (one device):",
        "",
        "| run (UTC) | size | bare step (s) | pairs | pair ratio median [Q1, Q3] "
        "| load min/max | verdict |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['when']} | {run['size']} | {run['step_s']:.3f} | {run['pairs']} "
            f"| {run['median']:.3f} [{run['q1']:.3f}, {run['q3']:.3f}] "
            f"| {run['load'][0]:.1f} / {run['load'][1]:.1f} | {run['verdict']} |"
        )
    lines += [RUNS_TAG + json.dumps(runs) + " -->", END]
    return "\n".join(lines) + "\n"


def previous_runs() -> list[dict[str, Any]]:
    """The run summaries stored in RESULTS.md's section, oldest first."""
    if not RESULTS.exists():
        return []
    for line in RESULTS.read_text().splitlines():
        if line.startswith(RUNS_TAG) and line.endswith(" -->"):
            return list(json.loads(line[len(RUNS_TAG) : -len(" -->")]))
    return []


def parse_args() -> argparse.Namespace:
    """Flags: device counts, problem size, pairs."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="1,2", help="CPU device counts; 0 = real devices")
    p.add_argument("-d", type=int, default=512)
    p.add_argument("-b", "--batch", type=int, default=1024, help="per device")
    p.add_argument("-n", "--layers", type=int, default=2)
    p.add_argument("--impl", choices=("jit", "shard_map"), default="jit")
    p.add_argument("--steps", type=int, default=4, help="steps per side in each pair")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    """Run one worker per device count, print and record the table."""
    args = parse_args()
    if args.worker:
        worker(args)
        return
    start = time.perf_counter()
    rows = []
    for n in (int(x) for x in args.devices.split(",")):
        rows.append(run_worker(args, n))
        print(json.dumps(rows[-1]), flush=True)
    seconds = time.perf_counter() - start
    runs = [*previous_runs(), summary(args, rows, seconds)][-KEEP_RUNS:]
    section = render(args, rows, seconds, runs)
    print(section)
    if not args.no_write:
        _write("payload_efficiency", section)


if __name__ == "__main__":
    main()
