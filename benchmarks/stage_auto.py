"""Where ``--stage-via auto`` switches from direct to peer: a grid of hosts × archive size.

For each (hosts, MB) cell, ``--stage-via direct`` and ``peer`` run alternately (the trial of
benchmarks/stage_via.py: a fresh code dir of MB incompressible megabytes, then ``true``) and
the median walls are compared. The threshold in ``multihost.staging.via.AUTO_THRESHOLD`` (hosts ×
archive bytes) is set from the smallest product at which peer was not slower than direct.

Usage (hold the fleet lock; needs ``python3 tests/fleet.py up 40``): ``flock /tmp/mh-ssh.lock
python benchmarks/stage_auto.py [--hosts 4,16,32] [--mb 1,4,16] [--repeat 2]`` (about 5 min).
Writes its section of benchmarks/RESULTS.md. All traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from benchmarks.stage_via import Trial, trial  # noqa: E402
from multihost.staging import via as stagevia  # noqa: E402
from tests import fleet as loopback  # noqa: E402

BEGIN, END = markers("stage-auto")
FIRST = 8  # h0..h7 stay for the tests


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="4,16,32")
    p.add_argument("--mb", default="1,4,16")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    sizes = [int(x) for x in args.hosts.split(",")]
    mbs = [int(x) for x in args.mb.split(",")]
    fleet = loopback.load()
    if len(fleet.hosts) < FIRST + max(sizes):
        sys.exit(
            f"the fleet has {len(fleet.hosts)} hosts: python3 tests/fleet.py up "
            f"{FIRST + max(sizes)}"
        )
    load_before = os.getloadavg()
    cells: dict[tuple[int, int], dict[str, list[Trial]]] = {}
    with tempfile.TemporaryDirectory(prefix="stage-auto-") as tmp:
        for n in sizes:
            sub = loopback.Fleet(
                fleet.dir,
                fleet.ssh_config,
                fleet.known_hosts,
                fleet.key,
                fleet.hosts[FIRST : FIRST + n],
            )
            hosts = f"h[{FIRST}-{FIRST + n - 1}]"
            for mb in mbs:
                rows: dict[str, list[Trial]] = {"direct": [], "peer": []}
                for r in range(args.repeat):
                    for via in ("direct", "peer") if r % 2 == 0 else ("peer", "direct"):
                        tag = f"{n}-{mb}-{via}-{r}-{time.time_ns()}"
                        t = trial(sub, hosts, Path(tmp), via, mb, tag)
                        rows[via].append(t)
                        print(
                            f"{n:3} hosts {mb:3} MB {via:6} wall {t.wall:6.2f} s "
                            f"cpu {t.cpu:5.2f} s",
                            flush=True,
                        )
                cells[n, mb] = rows
    load_after = os.getloadavg()
    lines = [
        "| hosts | archive | hosts × archive | direct wall | peer wall | peer / direct "
        "| runner CPU direct / peer |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    wins: list[int] = []
    for (n, mb), rows in sorted(cells.items(), key=lambda kv: kv[0][0] * kv[0][1]):
        d = statistics.median(t.wall for t in rows["direct"])
        pw = statistics.median(t.wall for t in rows["peer"])
        dc = statistics.median(t.cpu for t in rows["direct"])
        pc = statistics.median(t.cpu for t in rows["peer"])
        if pw <= d:
            wins.append(n * mb)
        lines.append(
            f"| {n} | {mb} MB | {n * mb} MB | {d:.2f} s | {pw:.2f} s | "
            f"{pw / d:.2f} | {dc:.2f} / {pc:.2f} s |"
        )
    threshold = stagevia.AUTO_THRESHOLD / 2**20
    text = "\n".join(
        [
            "## --stage-via auto: where peer staging starts to pay (benchmarks/stage_auto.py)",
            "",
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
            f"{os.cpu_count()} cores; load average {load_before[0]:.1f} before, "
            f"{load_after[0]:.1f} after. {args.repeat} trials per method and cell, alternating; "
            "medians. Loopback: the seed's server and every fetcher share the runner's 2 cores, "
            "so peer is handicapped here compared with real hosts, where the seed is another "
            "machine; bytes out of the runner are 1× the archive for peer against N× for direct.",
            "",
            *lines,
            "",
            f"Peer was not slower from {min(wins) if wins else '—'} MB (hosts × archive) in this "
            f"run; auto's threshold is {threshold:.0f} MiB (`staging.via.AUTO_THRESHOLD`, override "
            f"with ${stagevia.THRESHOLD_ENV}).",
        ]
    )
    print(text)
    if not args.no_record:
        write_section("stage-auto", f"{BEGIN}\n{text}\n{END}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
