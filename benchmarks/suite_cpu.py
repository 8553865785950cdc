"""Test-suite CPU: the user+sys CPU seconds a pytest selection costs, everything it starts
counted (the sshd fleet's sessions and the jobs on its hosts, the stand-in cloud's servers, the
real gcloud CLI, multi-process JAX), per selection and per test, with its runs of gcloud.

CPU time, not wall time: the machine is shared, and CPU time is what another process's load
changes least. This process makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) and
takes the test fleet ($MULTIHOST_FLEET_DIR) down before each run, so the session's own fleet
(started by the ``ssh_fleet`` fixture) and every process that leaves its parent behind end up
reaped here, as they exit: the total is ``RUSAGE_CHILDREN`` after the last of them. Per test,
benchmarks/suite_cpu_plugin.py (loaded into pytest) writes what each test cost.

Usage: ``python benchmarks/suite_cpu.py [--before DIR] [--repeat N] [--top 15] [--write NAME]
[--sel 'ARGS']... [-- ARGS]``: each selection is pytest's arguments (test files, ``-k``,
``-m``). ``--before DIR``: another checkout (say ``git worktree add DIR main``) measured too,
interleaved with this one, each run with its own tests and code. ``--write NAME`` puts the
table in benchmarks/RESULTS.md under a section of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from benchmarks.suite_cpu_plugin import ENV_LOG, ENV_TOP  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36


def _reap_all(main_pid: int, grace: float) -> tuple[int, list[str]]:
    """Reap every child as it exits until none is left; once ``main_pid`` has exited, what is
    still alive after ``grace`` seconds is named and killed. Main's exit code, the leftovers."""
    code = -1
    deadline: float | None = None
    leftovers: list[str] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code, leftovers
        if pid == main_pid:
            code = os.waitstatus_to_exitcode(status)
            deadline = time.monotonic() + grace
        if pid:
            continue
        if deadline is not None and time.monotonic() > deadline:
            for child in _children():
                leftovers.append(f"{child}: {_cmdline(child)}")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 60
        time.sleep(0.05)


def _children() -> list[int]:
    me = str(os.getpid())
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2 :].split()[1] == me:
                kids.append(int(name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(root: Path, selection: Sequence[str], scratch: Path) -> dict[str, Any]:
    """One pytest run of ``selection`` in the checkout ``root``: total CPU, wall, exit code,
    and each test's numbers."""
    from tests import fleet

    fleet.down()  # the session starts (and stops) its own fleet, under this subreaper
    log = scratch / f"tests-{time.monotonic_ns()}.jsonl"
    path = [str(root), os.environ.get("PYTHONPATH", ""), str(ROOT / "benchmarks")]
    env = {
        **os.environ,
        ENV_TOP: str(os.getpid()),
        ENV_LOG: str(log),
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }
    before = _children_cpu()
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", "-q", *selection],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    tail: list[str] = []

    def read(out: IO[bytes]) -> None:
        for raw in out:
            tail[:] = [*tail[-40:], raw.decode(errors="replace").rstrip()]

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    # Reaped as they exit, not at the end: an orphan left a zombie here would still look
    # alive to a test (or to multihost) that waits for it to be gone.
    code, leftovers = _reap_all(proc.pid, grace=10)
    proc.returncode = code
    reader.join(timeout=10)
    wall = time.monotonic() - start
    tests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    overhead = sum(t.get("overhead", 0.0) for t in tests)
    return {
        "checkout": str(root),
        "selection": list(selection),
        "cpu": _children_cpu() - before - overhead,
        "overhead": overhead,
        "wall": wall,
        "code": code,
        "load": max(load0, os.getloadavg()[0]),
        "gcloud": sum(t.get("gcloud", 0) for t in tests),
        "tests": tests,
        "leftovers": leftovers,
        "tail": tail,
    }


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(runs: list[dict[str, Any]], roots: dict[str, Path], top: int) -> list[str]:
    """The selections' rows (and a before/this ratio with two checkouts), then the costliest
    tests of this checkout."""
    selections: list[list[str]] = []
    for r in runs:
        if r["selection"] not in selections:
            selections.append(r["selection"])

    def of(label: str, sel: list[str]) -> list[dict[str, Any]]:
        return [r for r in runs if r["checkout"] == str(roots[label]) and r["selection"] == sel]

    labels = list(roots)
    rows = [
        "| selection | "
        + " | ".join(f"{x}: CPU (s)" for x in labels)
        + (" | this / before" if len(labels) > 1 else "")
        + " | "
        + " | ".join(f"{x}: gcloud runs" for x in labels)
        + " | wall (s), this | tests | exit |",
        "|---|" + "---:|" * (2 * len(labels) + (len(labels) > 1) + 2) + "---|",
    ]
    for sel in selections:
        cpus = {x: _median([r["cpu"] for r in of(x, sel)]) for x in labels}
        calls = {x: _median([r["gcloud"] for r in of(x, sel)]) for x in labels}
        mine = of("this checkout", sel)
        cells = [f"{cpus[x]:.1f}" for x in labels]
        if len(labels) > 1:
            cells.append(f"{cpus['this checkout'] / cpus['before']:.2f}")
        cells += [f"{calls[x]:g}" for x in labels]
        cells += [
            f"{_median([r['wall'] for r in mine]):.0f}",
            str(len(mine[0]["tests"])),
            ",".join(str(r["code"]) for x in labels for r in of(x, sel)),
        ]
        rows.append(f"| `{' '.join(sel)}` | " + " | ".join(cells) + " |")
    per: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        label = next(x for x in labels if str(roots[x]) == r["checkout"])
        for t in r["tests"]:
            per.setdefault((label, t["test"]), []).append(t)
    mine_tests = {name: ts for (x, name), ts in per.items() if x == "this checkout"}
    costly = sorted(mine_tests, key=lambda n: -_median([t["cpu"] for t in mine_tests[n]]))
    rows += [
        "",
        "| test (setup + call + teardown), this checkout's costliest | "
        + " | ".join(f"{x}: CPU (s)" for x in labels)
        + " | gcloud runs |",
        "|---|" + "---:|" * (len(labels) + 1),
    ]
    for name in costly[:top]:
        cells = [f"{_median([t['cpu'] for t in per.get((x, name), [])]):.2f}" for x in labels]
        calls = _median([t.get("gcloud", 0) for t in mine_tests[name]])
        rows.append(f"| `{name}` | " + " | ".join(cells) + f" | {calls:g} |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, help="another checkout, measured interleaved")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--top", type=int, default=15, help="the costliest tests to list")
    p.add_argument("--sel", action="append", default=[], help="one more selection (quoted)")
    p.add_argument("--write", metavar="NAME", help="record the table in benchmarks/RESULTS.md")
    p.add_argument("--json", type=Path, help="also dump every run's numbers here")
    p.add_argument("selection", nargs="*")
    args = p.parse_args(argv)
    selections = [shlex.split(s) for s in args.sel]
    if args.selection:
        selections.insert(0, args.selection)
    if not selections:
        p.error("nothing to measure: give pytest arguments after --, or --sel")
    roots = {"before": args.before.resolve()} if args.before else {}
    roots["this checkout"] = ROOT
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="multihost-suite-cpu-") as tmp:
        for _ in range(args.repeat):
            for sel in selections:
                for label, root in roots.items():
                    run = measure(root, sel, Path(tmp))
                    runs.append(run)
                    print(
                        f"{label}: {' '.join(sel)}: exit {run['code']}, CPU {run['cpu']:.1f} s "
                        f"(measuring: {run['overhead']:.1f} s more), {run['gcloud']} gcloud "
                        f"runs, wall {run['wall']:.1f} s, load {run['load']:.1f}",
                        file=sys.stderr,
                    )
                    if run["code"] != 0:
                        print("\n".join(run["tail"]), file=sys.stderr)
                    for left in run["leftovers"]:
                        print(f"  left running, killed: {left}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    loads = [r["load"] for r in runs]
    command = "python benchmarks/suite_cpu.py " + " ".join(
        [f"--repeat {args.repeat}"]
        + (["--before DIR"] if args.before else [])
        + [f"--sel {shlex.quote(' '.join(s))}" for s in selections]
    )
    text = "\n".join(
        [
            f"Machine: {platform.processor() or platform.machine()}, "
            f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d')}; load average up to {max(loads):.1f} (shared "
            "machine: wall time is not the measure). CPU = user+sys of pytest and everything "
            "it started, the fleet's sshds and their sessions included; medians of "
            f"{args.repeat} run(s) each"
            + (", the two checkouts interleaved." if args.before else "."),
            "",
            f"Command: `{command}`",
            "",
            *table(runs, roots, args.top),
        ]
    )
    print(text)
    if args.write:
        name = f"suite-cpu-{args.write}"
        begin, end = markers(name)
        title = f"## Test suite CPU: {args.write} (benchmarks/suite_cpu.py)"
        write_section(name, "\n".join([begin, title, "", text, end]))
    return 0 if all(r["code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
