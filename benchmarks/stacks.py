"""Stack benchmark: ``multihost stack`` on N loopback hosts, beside doing it one host at a time.

Each host runs a detached Python job stuck in a function (the stack hook staged by multihost
listens); the benchmark times the whole ``multihost stack RUN --json`` process (connect to every
host, signal, collect, group, save) and, as the peer, what a user does without it: one
``ssh host 'kill -USR2 PID; cat dump'`` per host, one after the other (py-spy would need ptrace
too, which these hosts' users do not have over processes they did not start).

Usage: ``python benchmarks/stacks.py [--sizes 8,64] [--repeat 3]``. Writes its section of
benchmarks/RESULTS.md. All traffic stays on 127.0.0.0/8.
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

from benchmarks.fanout import multihost_argv  # noqa: E402
from benchmarks.results import markers, write_section  # noqa: E402
from tests import fleet as loopback  # noqa: E402

BEGIN, END = markers("stacks")
GOAL_S, GOAL_N = 5.0, 64
STALL = "import time\n\ndef wait_for_data():\n    time.sleep(3600)\n\nwait_for_data()\n"


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*multihost_argv(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _ready(fleet: loopback.Fleet, run: str) -> bool:
    hooks = [Path(h.home) / ".multihost" / "runs" / run / "hook" for h in fleet.hosts]
    return all(d.is_dir() and any(d.glob("*.ready")) for d in hooks)


def measure(fleet: loopback.Fleet, repeat: int, work: Path) -> tuple[list[float], list[float]]:
    """Seconds for ``multihost stack`` and for the one-host-at-a-time peer, ``repeat`` each."""
    code = work / f"code{len(fleet.hosts)}"
    code.mkdir()
    (code / "stall.py").write_text(STALL)
    run = f"stacks-{len(fleet.hosts)}-{os.getpid()}-{time.time_ns()}"
    logs = work / "logs"
    inventory = work / f"hosts{len(fleet.hosts)}.toml"
    inventory.write_text(
        "[[slices]]\nhosts = [" + ", ".join(f'"{a}"' for a in fleet.aliases) + "]\n"
    )
    started = _cli(
        "run",
        "--hosts",
        str(inventory),
        "--ssh-config",
        str(fleet.ssh_config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        run,
        "--detach",
        "--cmd",
        "python3 stall.py",
    )
    if started.returncode != 0:
        raise SystemExit(f"could not start the job: {started.stderr[-2000:]}")
    deadline = time.monotonic() + 120
    while not _ready(fleet, run):
        if time.monotonic() > deadline:
            raise SystemExit("the jobs' stack hooks never became ready")
        time.sleep(0.2)
    ours, peer = [], []
    try:
        for _ in range(repeat):
            t0 = time.monotonic()
            res = _cli("stack", run, "--log-dir", str(logs), "--json")
            ours.append(time.monotonic() - t0)
            report = json.loads(res.stdout)
            if res.returncode != 0 or report["errors"] or len(report["groups"]) != 1:
                raise SystemExit(f"unexpected stack result: {res.stdout[-2000:]} {res.stderr}")
            t0 = time.monotonic()
            for h in fleet.hosts:
                hook = f"~/.multihost/runs/{run}/hook"
                script = (
                    f"cd {hook} && for f in *.ready; do p=${{f%.ready}}; "
                    "kill -USR2 $p; sleep 0.2; tail -n 20 $p.txt; done"
                )
                subprocess.run(
                    ["ssh", "-F", str(fleet.ssh_config), h.alias, script],
                    capture_output=True,
                    check=True,
                    timeout=60,
                )
            peer.append(time.monotonic() - t0)
    finally:
        _cli("kill", run, "--log-dir", str(logs), "--grace", "2")
    return ours, peer


def section(rows: list[tuple[int, list[float], list[float]]], repeat: int) -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        BEGIN,
        "## Stacks: `multihost stack` on N hosts",
        "",
        f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, load average "
        f"{load} (1/5/15 min) at the end; {repeat} trial(s) per size, medians. A detached "
        "Python job stuck in a function on every loopback sshd host; `multihost stack RUN "
        "--json` (connect, signal, collect, group, save) against one `ssh` per host, one after "
        "the other (what a user does by hand).",
        "",
        "| hosts | multihost stack | one host at a time | ratio | goal |",
        "|---:|---:|---:|---:|---|",
    ]
    for n, ours, peer in rows:
        a, b = statistics.median(ours), statistics.median(peer)
        goal = f"< {GOAL_S:g} s: {'met' if a < GOAL_S else 'NOT met'}" if n == GOAL_N else ""
        lines.append(f"| {n} | {a:.2f} s | {b:.2f} s | {a / b:.2f} | {goal} |")
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    fleet = loopback.up(max(sizes))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            ours, peer = measure(fleet.head(n), args.repeat, Path(tmp))
            rows.append((n, ours, peer))
            print(
                f"{n} hosts: multihost stack {statistics.median(ours):.2f} s, "
                f"one at a time {statistics.median(peer):.2f} s",
                flush=True,
            )
    text = section(rows, args.repeat)
    print(text)
    if not args.no_write:
        write_section("stacks", text)


if __name__ == "__main__":
    main()
