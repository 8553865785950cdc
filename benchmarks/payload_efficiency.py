"""shardings.py's achieved FLOP/s per device against a bare jitted chain of the same matmuls.

For each device count (a subprocess with JAX_NUM_CPU_DEVICES=n on CPU, or the real devices
with --devices 0), one worker runs the payload's main() (fsdp over all devices) and a plain
jax.jit of the same per-device problem (batch b, unsharded, one device), alternately, --repeat
times; ratio = payload TFLOP/s per device / bare TFLOP/s. Writes its section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- payload_efficiency:begin -->", "<!-- payload_efficiency:end -->"
sys.path.insert(0, str(ROOT / "payloads"))


def bare_tflops(d: int, layers: int, batch: int, tries: int) -> float:
    """Achieved TFLOP/s of the same step, unsharded, on one device, with batch rows."""
    import jax
    import jax.numpy as jnp

    def loss(x: Any, ws: list[tuple[Any, Any]]) -> Any:
        for w1, w2 in ws:
            x = jax.nn.sigmoid(jax.nn.sigmoid(x @ w1.T) @ w2)
        return jnp.sum(x)

    @jax.jit
    def step(x: Any, ws: list[tuple[Any, Any]]) -> Any:
        grads = jax.grad(loss, argnums=1)(x, ws)
        return jax.tree.map(lambda p, g: p - 1e-4 * g, ws, grads)

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
    jax.block_until_ready(step(x, ws))
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        jax.block_until_ready(step(x, ws))
        times.append(time.perf_counter() - start)
    return 48 * d * d * layers * batch / 1e12 / median(times)


def payload_tflops(d: int, layers: int, batch: int, tries: int) -> float:
    """Run shardings.main() in this process (fsdp over all devices); its TFLOP/s per device."""
    import meshing
    import shardings

    argv = ["-d", str(d), "-b", str(batch), "-n", str(layers), "-if", "-1", "--tries", str(tries)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        shardings.main(argv)
    (result,) = meshing.parse_result_lines(buf.getvalue())
    return float(result["tflops_per_device"])


def worker(args: argparse.Namespace) -> None:
    """Alternate payload and bare runs; print one json line of medians."""
    import jax

    payload, bare = [], []
    for _ in range(args.repeat):
        payload.append(payload_tflops(args.d, args.layers, args.batch, args.tries))
        bare.append(bare_tflops(args.d, args.layers, args.batch, args.tries))
    ratios = [p / b for p, b in zip(payload, bare, strict=True)]
    out = {
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "payload_tflops": median(payload),
        "bare_tflops": median(bare),
        "ratio": median(ratios),
        "ratios": ratios,
    }
    print("WORKER " + json.dumps(out), flush=True)


def run_worker(args: argparse.Namespace, devices: int) -> dict[str, Any]:
    """One worker subprocess; devices=0 means the machine's real devices."""
    env = dict(os.environ)
    if devices:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    cmd = [sys.executable, __file__, "--worker", "-d", str(args.d), "-b", str(args.batch)]
    cmd += ["-n", str(args.layers), "--tries", str(args.tries), "--repeat", str(args.repeat)]
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


def render(args: argparse.Namespace, rows: list[dict[str, Any]], seconds: float) -> str:
    """The markdown section, markers included."""
    import jax

    when = datetime.date.today().isoformat()
    lines = [
        BEGIN,
        "## Payload efficiency: shardings.py vs a bare jitted chain of the same matmuls",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"jax {jax.__version__}, {when}.",
        "",
        f"Problem per device: -d {args.d} -b {args.batch} -n {args.layers} (bf16), "
        f"fsdp over all devices; {args.tries} timed steps per run, {args.repeat} alternating "
        "payload/bare runs per row, medians. *bare*: the same step unsharded on one device with "
        "the per-device batch. CPU rows with several devices share the same cores, so their "
        "per-device FLOP/s fall and the ratio measures sharding overhead plus core sharing; "
        "*aggregate* = ratio × devices (all devices' throughput against one bare device, "
        "which already uses every core): ≈ 1 means sharding costs little beyond core sharing.",
        "",
        f"Command: `python benchmarks/payload_efficiency.py --devices {args.devices} "
        f"-d {args.d} -b {args.batch} -n {args.layers} --repeat {args.repeat}` "
        f"({seconds:.0f} s)",
        "",
        "| devices | device kind | payload TFLOP/s/device | bare TFLOP/s (1 device) "
        "| ratio (median) | aggregate | ratios |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratios = ", ".join(f"{x:.3f}" for x in r["ratios"])
        lines.append(
            f"| {r['devices']} | {r['device_kind']} | {r['payload_tflops']:.5f} "
            f"| {r['bare_tflops']:.5f} | {r['ratio']:.3f} | {r['ratio'] * r['devices']:.2f} "
            f"| {ratios} |"
        )
    one = [r for r in rows if r["devices"] == 1]
    if one:
        verdict = "met" if one[0]["ratio"] >= 0.9 else "MISSED"
        lines += ["", f"Target on one device: ratio ≥ 0.9: {verdict} ({one[0]['ratio']:.3f})."]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(section: str) -> None:
    """Replace (or append) only this script's section of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def parse_args() -> argparse.Namespace:
    """Flags: device counts, problem size, repeats."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="1,2,4,8", help="CPU device counts; 0 = real devices")
    p.add_argument("-d", type=int, default=256)
    p.add_argument("-b", "--batch", type=int, default=512, help="per device")
    p.add_argument("-n", "--layers", type=int, default=2)
    p.add_argument("--tries", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5)
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
    section = render(args, rows, time.perf_counter() - start)
    print(section)
    if not args.no_write:
        write_section(section)


if __name__ == "__main__":
    main()
