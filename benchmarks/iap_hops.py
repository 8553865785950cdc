"""IAP at pod scale: one tunnel per slice (workers hopped through it) vs one per worker.

The stand-in of multihost/sandbox/standin/ (the real gcloud CLI against the TPU API stand-in;
the real ``gcloud start-iap-tunnel`` against the relay of tests/cloud/iap.py) with the workers
in a VPC of their own (tests/cloud/vpc.py: a network namespace the runner cannot reach). Each trial
runs ``multihost run --prefix Q --tunnel-through-iap [--iap-per-host] --cmd 'echo hi'`` on
SLICES slices of WORKERS workers and measures: tunnels the relay opened; the runner's CPU
(user+sys of it and every child it waited for: discovery's gcloud calls, the tunnels); the
tunnels' own CPU (read from /proc while they run, the last reading of each); the peak of the
summed RSS of the runner and all its descendants, and of the tunnels alone (sampled every
50 ms); wall time. The two modes alternate within each trial.

Usage: ``python benchmarks/iap_hops.py [--slices 2] [--type v4-64] [--repeat 3]`` (root:
the fleet and the namespace). Writes its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from multihost.sandbox.standin.zones import ACCELERATOR_TYPES, workers_of  # noqa: E402
from tests import fleet as loopback  # noqa: E402
from tests.cloud import vpc as vpcs  # noqa: E402
from tests.cloud.fixture import ZONE, Cloud, standin  # noqa: E402
from tests.cloud.iap import WRAPPER, IapRelay  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, RSS bytes) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[21]) * PAGE


def _is_tunnel(pid: int) -> bool:
    try:
        return b"start-iap-tunnel" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Sampler(threading.Thread):
    """Peak RSS of a process tree and of its tunnels; each tunnel's last CPU reading."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak_tree = self.peak_tunnels = 0
        self.tunnel_cpu: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            stats = {
                int(p): s
                for p in os.listdir("/proc")
                if p.isdigit() and (s := _stat(int(p))) is not None
            }
            tree, todo = {self.root}, [self.root]
            while todo:
                parent = todo.pop()
                for pid, (pp, _, _) in stats.items():
                    if pp == parent and pid not in tree:
                        tree.add(pid)
                        todo.append(pid)
            rss = sum(stats[p][2] for p in tree if p in stats)
            tunnels = [p for p in tree if p in stats and _is_tunnel(p)]
            for p in tunnels:
                self.tunnel_cpu[p] = stats[p][1]
            self.peak_tree = max(self.peak_tree, rss)
            self.peak_tunnels = max(self.peak_tunnels, sum(stats[p][2] for p in tunnels))
            time.sleep(0.05)


def trial(
    cloud: Cloud,
    relay: IapRelay,
    config: Path,
    tmp: Path,
    name: str,
    args: argparse.Namespace,
    per_host: bool,
) -> dict[str, float]:
    cloud.tpu.reset()
    cloud.tpu.internal_address = vpcs.address
    cloud.tpu.add(name, args.type, args.slices, internal_only=True)
    cloud.tpu.wait_state(name, "ACTIVE")
    relay.tunnels.clear()
    token = tmp / "token"
    token.write_text("bench\n")
    env = cloud.env | {
        "XDG_STATE_HOME": str(tmp / "state"),
        "MULTIHOST_GCLOUD": str(WRAPPER),
        "MULTIHOST_TEST_IAP_URL": relay.url,
        "MULTIHOST_TEST_IAP_TOKEN": str(token),
    }
    argv = [
        sys.executable,
        "-m",
        "multihost",
        "run",
        "--prefix",
        name,
        "--zone",
        ZONE,
        "--ssh-config",
        str(config),
        "--script-dir",
        str(tmp / "code"),
        "--log-dir",
        str(tmp / "logs"),
        "--run-name",
        name,
        "--no-add-key",
        "--tunnel-through-iap",
        *(["--iap-per-host"] if per_host else []),
        "--cmd",
        "echo hi",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = Sampler(proc.pid)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{name} failed: {err[-3000:]}")
    return {
        "tunnels": len(relay.tunnels),
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "tunnel_cpu": sum(sampler.tunnel_cpu.values()),
        "rss": sampler.peak_tree / 2**20,
        "tunnel_rss": sampler.peak_tunnels / 2**20,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slices", type=int, default=2)
    p.add_argument("--type", default="v4-64", help="a TPU type the stand-in offers (v4-64)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if args.type not in ACCELERATOR_TYPES:
        p.error(f"--type: not a TPU type the stand-in offers: {args.type}")
    n = args.slices * workers_of(args.type)
    fleet = loopback.up(n)
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    load = [os.getloadavg()[0]]
    with standin(fleet) as cloud, vpcs.vpc(fleet) as vpc, tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (tmp / "code").mkdir()
        config = tmp / "ssh_config"
        config.write_text(
            "".join(
                f"Host {vpcs.address(h.index)}\n  User {h.user}\n  Port 22\n"
                f"  IdentityFile {fleet.key}\n  IdentitiesOnly yes\n"
                for h in fleet.hosts
            )
        )

        def resolve(instance: str) -> str | None:
            worker = cloud.tpu.worker_by_instance(instance)
            return None if worker is None else vpcs.address(worker.host)

        relay = IapRelay(resolve, vpc.connect)
        try:
            for i in range(args.repeat):
                for per_host in (False, True) if i % 2 == 0 else (True, False):
                    r = trial(cloud, relay, config, tmp, f"iap{i}{int(per_host)}", args, per_host)
                    results[per_host].append(r)
                    print(("per-host " if per_host else "per-slice ") + str(r), file=sys.stderr)
                    fleet.kill_user_processes()
        finally:
            relay.stop()
    load.append(os.getloadavg()[0])
    write(results, args, n, load)


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def write(
    results: dict[bool, list[dict[str, float]]],
    args: argparse.Namespace,
    n: int,
    load: list[float],
) -> None:
    gcloud = subprocess.run(["gcloud", "version"], capture_output=True, text=True).stdout
    version = gcloud.splitlines()[0] if gcloud else "?"
    keys = ("tunnels", "wall", "cpu", "tunnel_cpu", "rss", "tunnel_rss")
    lines = [
        "<!-- iap_hops:begin -->",
        "## IAP at pod scale: one tunnel per slice vs one per worker (benchmarks/iap_hops.py)",
        "",
        f"Machine: 2 cores shared with other work, {version}, Python {sys.version.split()[0]}, "
        f"{datetime.date.today()}; load average before/after {load[0]:.1f} / {load[1]:.1f}. "
        f"{args.slices} slices × {workers_of(args.type)} workers ({args.type}) = {n} workers with "
        "internal addresses only, in a network namespace the runner cannot reach "
        "(tests/cloud/vpc.py); the real `gcloud start-iap-tunnel` against the relay stand-in. "
        "*runner CPU*: user+sys of `multihost run` and every child it waited for (discovery's "
        "gcloud calls, the same in both modes, and the tunnels); *tunnels' CPU*: their own, "
        "read from /proc while they run; *peak RSS*: the summed RSS of the runner and all its "
        "descendants, and of the tunnels alone, sampled every 50 ms. Medians of "
        f"{args.repeat} trials, the modes alternating.",
        "",
        f"Command: `python benchmarks/iap_hops.py --slices {args.slices} --type {args.type} "
        f"--repeat {args.repeat}`",
        "",
        "| mode | tunnels | wall (s) | runner CPU (s) | tunnels' CPU (s) | peak RSS, runner + "
        "children (MiB) | peak RSS, tunnels (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for per_host, label in ((False, "per slice (default)"), (True, "`--iap-per-host`")):
        rows = results[per_host]
        vals = [med(rows, k) for k in keys]
        lines.append(
            f"| {label} | {vals[0]:.0f} | {vals[1]:.1f} | {vals[2]:.1f} | {vals[3]:.1f} "
            f"| {vals[4]:.0f} | {vals[5]:.0f} |"
        )
    ratio = {k: med(results[False], k) / max(med(results[True], k), 1e-9) for k in keys}
    rest = [statistics.median(r["cpu"] - r["tunnel_cpu"] for r in results[m]) for m in (0, 1)]
    lines += [
        "",
        f"Runner CPU less the tunnels' (discovery's gcloud calls and multihost itself, the hops' "
        f"second layer of encryption included): {rest[0]:.1f} s per slice, {rest[1]:.1f} s per "
        "worker; what IAP costs is the tunnels.",
        f"Per slice / per worker: tunnels {ratio['tunnels']:.2f}, runner CPU {ratio['cpu']:.2f}, "
        f"tunnels' CPU {ratio['tunnel_cpu']:.2f}, peak RSS (runner + children) "
        f"{ratio['rss']:.2f}, peak RSS of the tunnels {ratio['tunnel_rss']:.2f}.",
        "<!-- iap_hops:end -->",
    ]
    section = "\n".join(lines) + "\n"
    write_section("iap_hops", section)
    print(section)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    main()
