"""Pull benchmark: ``multihost.pull`` vs one ``scp`` per host (all at once, as pslurp does), on
the loopback fleet.

Setup: one run stages a code dir holding a random file of SIZE MiB on N hosts (so each host has
it in the run's work dir). Each trial copies that file back from every host into a fresh folder;
a last multihost trial re-pulls into a full folder (everything skipped). Medians over trials.

Usage: ``python benchmarks/pull.py [--sizes 8,32] [--mib 8] [--repeat 3]`` (hold the fleet
lock: ``flock /tmp/multihost-fleet.lock ...``). Writes its section of benchmarks/RESULTS.md.
All traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import multihost  # noqa: E402
from benchmarks.results import markers, write_section  # noqa: E402
from multihost.runs.past import find_run  # noqa: E402
from tests import fleet as loopback  # noqa: E402

BEGIN, END = markers("pull")


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def bench(fleet: loopback.Fleet, n: int, mib: int, repeat: int, work: Path) -> list[str]:
    hosts = fleet.head(n)
    code = work / f"code{n}"
    code.mkdir()
    (code / "blob.bin").write_bytes(os.urandom(mib << 20))
    logs = work / "logs"
    name = f"bench-pull-{secrets.token_hex(3)}"
    result = multihost.run(
        "true",
        hosts=",".join(hosts.aliases),
        ssh_config=fleet.ssh_config,
        script_dir=code,
        log_dir=logs,
        run_name=name,
        stream="none",
    )
    assert result.ok, result
    code_hash = find_run(logs, name)[1].code_hash
    remote = f".multihost/code/{code_hash}/blob.bin"
    rows = []
    try:
        mh, scp = [], []
        for t in range(repeat):
            dest = work / f"mh{n}-{t}"
            start = time.perf_counter()
            results = multihost.pull(name, "blob.bin", to=dest, log_dir=logs)
            mh.append(time.perf_counter() - start)
            assert all(r.ok and r.files == 1 for r in results), results
            out = work / f"scp{n}-{t}"

            def scp_all(out: Path = out) -> None:
                procs = []
                for h in hosts.hosts:
                    (out / h.alias).mkdir(parents=True)
                    procs.append(
                        subprocess.Popen(
                            [
                                "scp",
                                "-q",
                                "-F",
                                str(fleet.ssh_config),
                                f"{h.alias}:{remote}",
                                str(out / h.alias),
                            ]
                        )
                    )
                assert all(p.wait() == 0 for p in procs)

            scp.append(_timed(scp_all))
        again = _timed(lambda: multihost.pull(name, "blob.bin", to=work / f"mh{n}-0", log_dir=logs))
        total = n * mib
        for method, times in (("multihost pull", mh), ("scp per host, all at once", scp)):
            wall = statistics.median(times)
            ratio = wall / statistics.median(scp)
            rows.append(
                f"| {n} | {mib} | {method} | {len(times)} | {wall:.2f} | "
                f"{total / wall:.0f} | {ratio:.2f} |"
            )
        rows.append(
            f"| {n} | {mib} | multihost pull again (all skipped) | 1 | {again:.2f} | – "
            f"| {again / statistics.median(scp):.2f} |"
        )
    finally:
        for h in hosts.hosts:
            shutil.rmtree(h.home / ".multihost" / "code" / code_hash, ignore_errors=True)
            shutil.rmtree(h.home / ".multihost" / "runs" / name, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,32")
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    fleet = loopback.up(max(sizes))
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for n in sizes for r in bench(fleet, n, args.mib, args.repeat, Path(tmp))]
    after = os.getloadavg()[0]
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    section = "\n".join(
        [
            BEGIN,
            "## Pull: one file back from every one of N loopback hosts",
            "",
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} "
            f"cores, {ssh}, "
            f"Python {platform.python_version()}, {datetime.date.today()}; load average "
            f"before/after: {before:.1f} / {after:.1f}.",
            "",
            "Each host holds a random file in the run's work dir; a trial copies it back "
            "from every "
            "host into a fresh folder. *multihost pull*: the API (list on each host, then "
            "SFTP over "
            "one connection per host, 16 hosts at a time); *scp*: one OpenSSH `scp` process per "
            "host, all at once (pslurp's way). Medians; MiB/s is all hosts together.",
            "",
            f"Command: `python benchmarks/pull.py --sizes {args.sizes} --mib {args.mib} "
            f"--repeat {args.repeat}`",
            "",
            "| N | MiB/host | method | trials | wall (s) | MiB/s | wall / scp |",
            "|---:|---:|---|---:|---:|---:|---:|",
            *rows,
            END,
        ]
    )
    write_section("pull", section)
    print(section)


if __name__ == "__main__":
    main()
