"""Staging benchmark: ``--stage-via direct`` vs ``peer`` on the loopback fleet.

Each trial packs a fresh code dir (``--mb`` MB of incompressible data, so the archive is about
that size), runs ``multihost.run("true", stage_via=...)`` in a child process on hosts
``h{first}..h{first+n-1}`` of the running fleet, and records the wall time of the whole run, the
runner's CPU (the child's user+sys), and the bytes that left the runner (the transport's
counter, ``RunResult.staging``). Staged code is removed from the hosts after each trial.

Usage (hold the fleet lock): ``flock /tmp/multihost-fleet.lock python benchmarks/stage_via.py
[--n 64] [--first 8] [--mb 20] [--repeat 3]``. Writes its section of benchmarks/RESULTS.md.
All traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from tests import fleet as loopback  # noqa: E402

BEGIN, END = markers("stage-via")
TRIAL_TIMEOUT = 300.0
METHODS = ("direct", "peer")

CHILD = """
import json, resource, sys, time
import multihost
hosts, ssh_config, src, logs, via = sys.argv[1:6]
t0 = time.monotonic()
r = multihost.run("true", hosts=hosts, ssh_config=ssh_config, script_dir=src, log_dir=logs,
                  stage_via=via, stream="none")
wall = time.monotonic() - t0
u = resource.getrusage(resource.RUSAGE_SELF)
s = r.staging
print(json.dumps({"ok": r.ok, "wall": wall, "cpu": u.ru_utime + u.ru_stime,
                  "sent": s.runner_bytes, "archive": s.archive_bytes, "uploads": s.uploads,
                  "fetched": s.fetched, "fallbacks": len(s.fallbacks), "why": r.failed and
                  repr(r.failed[0]) or ""}))
"""


@dataclass(frozen=True)
class Trial:
    wall: float
    cpu: float
    sent: int
    archive: int
    uploads: int
    fetched: int
    fallbacks: int


def make_code(parent: Path, tag: str, mb: int) -> Path:
    d = parent / f"src-{tag}"
    (d / "data").mkdir(parents=True)
    (d / "train.py").write_text(f"# {tag}\nprint('hi')\n")
    for i in range(mb):
        (d / "data" / f"shard{i:03d}.bin").write_bytes(os.urandom(1 << 20))
    return d


def clean_hosts(fleet: loopback.Fleet) -> None:
    for h in fleet.hosts:
        shutil.rmtree(h.home / ".multihost" / "code", ignore_errors=True)
        shutil.rmtree(h.home / ".multihost" / "runs", ignore_errors=True)


def trial(fleet: loopback.Fleet, hosts: str, work: Path, via: str, mb: int, tag: str) -> Trial:
    src = make_code(work, tag, mb)
    logs = work / f"logs-{tag}"
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, hosts, str(fleet.ssh_config), str(src), str(logs), via],
            capture_output=True,
            text=True,
            timeout=TRIAL_TIMEOUT,
            cwd=ROOT,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{via}: rc={out.returncode}: {out.stderr[-800:]}")
        data = json.loads(out.stdout.strip().splitlines()[-1])
        if not data.pop("ok"):
            raise RuntimeError(f"{via}: the run failed: {data['why']}")
        data.pop("why")
        return Trial(**data)
    finally:
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
        clean_hosts(fleet)


def table(rows: dict[str, list[Trial]], n: int, mb: int) -> str:
    lines = [
        f"| method (N={n}, {mb} MB code) | wall (median) | runner CPU | bytes out of the runner "
        "| × archive | uploads | fetched | fallbacks |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = statistics.median(t.wall for t in rows["direct"]) if "direct" in rows else None
    for via, trials in rows.items():
        wall = statistics.median(t.wall for t in trials)
        cpu = statistics.median(t.cpu for t in trials)
        sent = statistics.median(t.sent for t in trials)
        ratio = sent / trials[0].archive
        rel = f" ({wall / base:.2f}×)" if base else ""
        walls = ", ".join(f"{t.wall:.1f}" for t in trials)
        lines.append(
            f"| {via} | {wall:.1f} s{rel} [{walls}] | {cpu:.1f} s | {sent / 1e6:.1f} MB | "
            f"{ratio:.2f} | {trials[0].uploads} | {trials[0].fetched} | "
            f"{max(t.fallbacks for t in trials)} |"
        )
    return "\n".join(lines)


def verdict(rows: dict[str, list[Trial]]) -> str:
    """The goal: bytes out ≤ 1.5× the archive, and wall no worse than direct."""
    peer, direct = rows["peer"], rows["direct"]
    ratio = statistics.median(t.sent for t in peer) / peer[0].archive
    wall = statistics.median(t.wall for t in peer) / statistics.median(t.wall for t in direct)
    return (
        f"Goal: bytes out ≤ 1.5× the archive — peer {ratio:.2f}×: "
        f"{'met' if ratio <= 1.5 else 'NOT met'}; wall no worse than direct — peer "
        f"{wall:.2f}× direct's: {'met' if wall <= 1.0 else 'NOT met'}."
    )


def record(text: str) -> None:
    write_section("stage-via", f"{BEGIN}\n{text}\n{END}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--first", type=int, default=8, help="first fleet host (h0..h7 stay alone)")
    p.add_argument("--mb", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    fleet = loopback.load()
    if len(fleet.hosts) < args.first + args.n:
        sys.exit(
            f"the fleet has {len(fleet.hosts)} hosts: python3 tests/fleet.py up "
            f"{args.first + args.n}"
        )
    sub = loopback.Fleet(
        fleet.dir,
        fleet.ssh_config,
        fleet.known_hosts,
        fleet.key,
        fleet.hosts[args.first : args.first + args.n],
    )
    hosts = f"h[{args.first}-{args.first + args.n - 1}]"
    load_before = os.getloadavg()
    rows: dict[str, list[Trial]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory(prefix="stage-via-") as tmp:
        for r in range(args.repeat):
            for via in METHODS if r % 2 == 0 else METHODS[::-1]:  # alternate the order
                t = trial(sub, hosts, Path(tmp), via, args.mb, f"{via}-{r}-{time.time_ns()}")
                rows[via].append(t)
                print(
                    f"{via:7} wall {t.wall:6.1f} s  cpu {t.cpu:5.1f} s  "
                    f"sent {t.sent / 1e6:7.1f} MB  fetched {t.fetched}",
                    flush=True,
                )
    load_after = os.getloadavg()
    text = "\n".join(
        [
            "## --stage-via: bytes out of the runner and wall time (benchmarks/stage_via.py)",
            "",
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
            f"{os.cpu_count()} cores; load average {load_before[0]:.1f} before, "
            f"{load_after[0]:.1f} after (the machine is shared: other work inflates walls). "
            f"{args.repeat} trials per method, alternating order; each a fresh code dir, staged "
            "on hosts that lack it, then `true`. Loopback fleet: seeds and fetchers share this "
            "machine's 2 cores, so every host's unpack competes with the runner.",
            "",
            table(rows, args.n, args.mb),
            "",
            verdict(rows),
        ]
    )
    print(text)
    if not args.no_record:
        record(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
