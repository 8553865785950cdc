"""What ``multihost top`` costs a host: its script's CPU, and the hook's in the job's processes.

A host pays twice for being watched:

1. ``top.sh`` (one per host, over the connection ``top`` keeps): every INTERVAL s it reads
   /proc/uptime, /proc/meminfo, each Python process's /proc/PID/stat and the hook's
   ``<pid>.watch``, the log's last 400 bytes (one ``tail``), and sleeps (one ``sleep``). Its
   CPU (its own and its children's, from ``wait4``) over a run of looks, per look and as a
   share of one core, with 1 and 4 watched processes (real JAX processes with the hook).
2. The hook in every JAX process, watched or not: each wait for results (``float()``,
   ``block_until_ready``) looks at the caller's frames, and a thread rewrites ``<pid>.watch``
   once a second. Measured in fresh processes with and without the hook: a wait on a ready
   array (the cost alone, with no wait to hide it), a small jitted training-like step, and an
   idle process's CPU (the writer thread alone).

Usage: ``python benchmarks/top_cost.py [--looks 30] [--repeat 3]``. Writes its section of
benchmarks/RESULTS.md. Nothing leaves this machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from multihost.live.watcher import top_command  # noqa: E402
from multihost.remote.commands import hook_text  # noqa: E402

BEGIN, END = markers("top-cost")
GOAL_PCT = 1.0  # top.sh plus the hook's writer: at most 1 % of one core

STEPPER = """\
import sys, time
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (jnp.tanh(x) * 1.0001, jnp.tanh(x).sum()))
x = jnp.ones((64, 64))
print("ready", flush=True)
while True:
    x, loss = f(x)
    float(loss)
    time.sleep(0.05)
"""

# The hook's cost per wait, in one process with the hook: each wrapped wait against the
# function it wraps (``__wrapped__``), in alternating rounds (the machine's noise falls on both
# alike); the step: a small jitted step with ``float(loss)`` wrapped and not.
PER_CALL = """\
import json, statistics, time
import jax, jax.numpy as jnp
from jax._src import array
cls = array.ArrayImpl
x = jnp.ones((8, 8)); x.block_until_ready()
y = x.sum(); float(y)
f = jax.jit(lambda x: (jnp.tanh(x) * 1.0001, jnp.tanh(x).sum()))
a, loss = f(x); float(loss)
bur, raw_bur = cls.block_until_ready, cls.block_until_ready.__wrapped__
value = cls.__dict__["_value"].fget
raw_value = value.__wrapped__
def per(fn, arg, n=5000):
    t = time.perf_counter()
    for _ in range(n):
        fn(arg)
    return (time.perf_counter() - t) / n * 1e6
def steps(get, n=2000):
    global a
    t = time.perf_counter()
    for _ in range(n):
        a, loss = f(a)
        float(get(loss))
    return (time.perf_counter() - t) / n * 1e6
rounds = {k: [] for k in ("bur", "raw_bur", "value", "raw_value", "step", "raw_step")}
for i in range(16):  # ABBA: which goes first alternates
    pairs = [("bur", bur, x, per), ("raw_bur", raw_bur, x, per),
             ("value", value, y, per), ("raw_value", raw_value, y, per)]
    for k, fn, arg, how in pairs if i % 2 else pairs[1::-1] + pairs[3:1:-1]:
        rounds[k].append(how(fn, arg))
    for k, fn in ((("step", value), ("raw_step", raw_value)) if i % 2 else
                  (("raw_step", raw_value), ("step", value))):
        rounds[k].append(steps(fn))
print(json.dumps({k: statistics.median(v) for k, v in rounds.items()}))
"""

# The writer thread's own CPU over SECONDS of an idle JAX process (its /proc task's stat).
IDLE = """\
import os, threading, time
import jax
time.sleep(SECONDS)
(writer,) = [t for t in threading.enumerate() if t.name == "multihost-steps"]
with open(f"/proc/self/task/{writer.native_id}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
print((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
"""


def _env(hook: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MULTIHOST_", "JAX_"))}
    env.pop("PYTHONPATH", None)
    env["JAX_PLATFORMS"] = "cpu"
    if hook is not None:
        env |= {"PYTHONPATH": str(hook), "MULTIHOST_STACK_DIR": str(hook)}
    return env


def _python(code: str, hook: Path | None, timeout: float = 300) -> str:
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(hook),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return res.stdout


def script_cost(work: Path, processes: int, looks: int, interval: float) -> tuple[float, float]:
    """(CPU ms per look, % of one core) of ``top.sh`` watching ``processes`` JAX processes."""
    run = work / f"run{processes}"
    hook = run / "hook"
    hook.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(hook_text())
    (run / "log").write_text("step 1 loss 2.31\n" * 1000)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STEPPER], env=_env(hook), stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            p.stdout.readline()
        deadline = time.monotonic() + 60
        while len(list(hook.glob("*.watch"))) < processes and time.monotonic() < deadline:
            time.sleep(0.2)
        watcher = subprocess.Popen(
            top_command(str(run), interval, looks),
            shell=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        started = time.monotonic()
        assert watcher.stdout is not None
        out = watcher.stdout.read()
        _, status, usage = os.wait4(watcher.pid, 0)
        wall = time.monotonic() - started
        watcher.returncode = status
        if out.count(b"\nend\n") != looks or out.count(b"\np ") != looks * processes:
            raise SystemExit(f"top.sh did not see every process: {out[-500:]!r}")
        cpu = usage.ru_utime + usage.ru_stime
        return cpu / looks * 1000, 100 * cpu / wall
    finally:
        for p in procs:
            p.kill()
            p.wait()


def hook_cost(work: Path) -> tuple[dict[str, float], float]:
    """The wrapped waits against the raw ones (µs); the writer thread's CPU %."""
    hook = work / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(hook_text())
    calls = json.loads(_python(PER_CALL, hook))
    seconds = 30.0
    writer = float(_python(IDLE.replace("SECONDS", str(seconds)), hook))
    return calls, 100 * writer / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--looks", type=int, default=30)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows: dict[int, list[tuple[float, float]]] = {1: [], 4: []}
    hooks: list[tuple[dict[str, float], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for n in rows:
                work = Path(tmp) / f"s{r}-{n}"
                work.mkdir()
                rows[n].append(script_cost(work, n, args.looks, args.interval))
                print(f"top.sh, {n} process(es), trial {r + 1}: {rows[n][-1]}", flush=True)
            work = Path(tmp) / f"h{r}"
            work.mkdir()
            hooks.append(hook_cost(work))
            print(f"hook, trial {r + 1}: {hooks[-1]}", flush=True)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    med = statistics.median
    lines = [
        BEGIN,
        "## What `multihost top` costs a host (benchmarks/top_cost.py)",
        "",
        f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, load average "
        f"{load} (1/5/15 min) at the end; {args.repeat} trial(s), medians. `top.sh` looking "
        f"every {args.interval:g} s, {args.looks} looks a trial, at a run whose processes are "
        "real JAX processes with the hook (stepping every 50 ms); its CPU is its own and its "
        "children's (`sleep`, `tail`), from `wait4`.",
        "",
        "| watched processes | CPU per look | share of one core | goal |",
        "|---:|---:|---:|---|",
    ]
    writer = med(h[1] for h in hooks)
    for n, got in rows.items():
        per_look, pct = med(g[0] for g in got), med(g[1] for g in got)
        met = "met" if pct + writer <= GOAL_PCT else "NOT met"
        lines.append(
            f"| {n} | {per_look:.2f} ms | {pct:.3f} % | with the writer below, ≤ {GOAL_PCT:g} %: "
            f"{met} |"
        )
    lines += [
        "",
        "The hook in each JAX process: each wrapped wait against the function it wraps, in "
        "one process, 16 rounds, which goes first alternating (medians of rounds, then of trials):",
        "",
        "| | without | with | added |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("bur", "`x.block_until_ready()`, x ready (the wrapper alone)"),
        ("value", "a transfer to host (`float(y)`'s), y ready"),
        ("step", "a small jitted step and `float(loss)` (CPU)"),
    ):
        without, with_ = med(h[0]["raw_" + key] for h in hooks), med(h[0][key] for h in hooks)
        lines.append(f"| {label} | {without:.2f} µs | {with_:.2f} µs | {with_ - without:+.2f} µs |")
    lines += [
        f"| the writer thread (its own CPU, an idle process, 30 s) | | | {writer:.3f} % of a "
        "core |",
        "",
        "The per-look cost is a handful of builtins and two forks (`sleep`, `tail`); the hook "
        "adds a couple of µs to each wait for results, which a step pays once or a few times, "
        "and its thread wakes once a second to rewrite a file of a few hundred bytes.",
        END,
    ]
    write_section("top-cost", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
