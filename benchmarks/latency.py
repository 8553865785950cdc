"""Launch at a distance: multihost vs parallel-ssh vs the MaxText architecture with every host
behind a relay that adds a network delay (benchmarks/netdelay.py), and the round trips each
host's connections take.

The trials are benchmarks/fanout.py's (a fresh script dir per trial, the trivial command that
writes its start time, the methods interleaved), with one relay per trial between the runner
and the loopback fleet: ``--rtts 0,50,100`` ms (0: through the relay, no delay). Every trial
counts each host's round trips (the times the client waited for an answer, plus TCP's
handshake, over all the host's connections: netdelay.round_trips). A separate run per RTT
(through the Python API, ``on_event``) splits multihost's round trips into its phases by the
time each host changed state: connect (until staging), claim+stage (until starting; the launch
goes out behind the code, so its round trip is counted here), launch (until running), gate and
end (the word, the job, its exit).

Usage: ``python benchmarks/latency.py [--sizes 16,64,256] [--rtts 0,50,100] [--repeat 3]
[--before OTHER_CHECKOUT]``. Writes its section of benchmarks/RESULTS.md (after each RTT).
All traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import fanout  # noqa: E402
from benchmarks.netdelay import round_trips  # noqa: E402
from benchmarks.results import markers, write_section  # noqa: E402
from tests import fleet as loopback  # noqa: E402

FLOOR = 6  # TCP, SSH version, key exchange, auth, channel, exec
RELAY_OFFSET = 50  # the relay listens on each host's address, the fleet's port + this
PHASES = ("connect", "claim+stage", "launch", "gate+end")
# since the launch goes out behind the code, its round trip is claim+stage's; "launch" is then
# what is left between every host being prepared and the word
STATES = ("staging", "starting", "running")  # the states that end the first three phases


@dataclass(frozen=True)
class Trial:
    """One fanout trial through the relay, with each host's round trips."""

    run: fanout.Trial
    trips: tuple[int, ...]  # per host, over all its connections
    conns: float  # connections per host


@dataclass(frozen=True)
class Row:
    """All trials of one method at one size and RTT."""

    rtt: int
    n: int
    method: str
    trials: tuple[Trial, ...]

    def median(self, field: str) -> float:
        """Median of a fanout.Trial field."""
        return float(statistics.median(getattr(t.run, field) for t in self.trials))

    @property
    def skew(self) -> float:
        return statistics.median(t.run.last_start - t.run.first_start for t in self.trials)

    @property
    def cpu_ms(self) -> float:
        return self.median("cpu") * 1000 / self.n

    @property
    def trips(self) -> float:
        return float(statistics.median(statistics.median(t.trips) for t in self.trials))

    @property
    def trips_max(self) -> int:
        return max(max(t.trips) for t in self.trials)


METHODS = dict(fanout.METHODS)

# ---------------------------------------------------------------- the relayed fleet


def relayed(fleet: loopback.Fleet, out: Path) -> loopback.Fleet:
    """``fleet`` reached through the relay: each host's port is the relay's, with its own
    ssh config, known_hosts and fleet.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    hosts = tuple(replace(h, port=h.port + RELAY_OFFSET) for h in fleet.hosts)
    known, blocks = [], []
    for h, real in zip(hosts, fleet.hosts, strict=True):
        key = (loopback._host_dir(fleet.dir, real.index) / "host_key.pub").read_text().split()[:2]
        known.append(f"[{h.address}]:{h.port} {' '.join(key)}\n")
        blocks.append(
            f"Host {h.alias}\n  HostName {h.address}\n  Port {h.port}\n  User {h.user}\n"
            f"  UserKnownHostsFile {out / 'known_hosts'}\n"
        )
    blocks.append(loopback._defaults_block(fleet.key))
    (out / "known_hosts").write_text("".join(known))
    (out / "ssh_config").write_text("\n".join(blocks))
    private = loopback.Fleet(fleet.dir, out / "ssh_config", out / "known_hosts", fleet.key, hosts)
    (out / "fleet.json").write_text(private.to_json() + "\n")
    return private


@contextlib.contextmanager
def relay(fleet: loopback.Fleet, real: loopback.Fleet, rtt_ms: float) -> Iterator[list[dict]]:
    """The relay between the runner and ``fleet``'s hosts while the block runs; the list
    yielded holds its connections (netdelay's JSON) once the block is over."""
    with tempfile.NamedTemporaryFile(prefix="netdelay-", suffix=".json") as f:
        pairs = [
            f"{h.address}:{h.port}={r.address}:{r.port}"
            for h, r in zip(fleet.hosts, real.hosts, strict=True)
        ]
        argv = [
            sys.executable,
            str(ROOT / "benchmarks" / "netdelay.py"),
            "--delay-ms",
            str(rtt_ms / 2),
            "--out",
            f.name,
            *pairs,
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            raise RuntimeError("the relay did not start")
        links: list[dict] = []
        try:
            yield links
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        links += json.loads(Path(f.name).read_text() or "[]")


def per_host(links: Sequence[dict], fleet: loopback.Fleet, rtt: int) -> tuple[list[int], float]:
    """Each host's round trips over its connections, and connections per host."""
    by = {f"{h.address}:{h.port}": 0 for h in fleet.hosts}
    conns = 0
    for link in links:
        if link["listen"] in by and link["chunks"]:
            by[link["listen"]] += round_trips(link["chunks"], rtt / 2000)
            conns += 1
    return list(by.values()), conns / len(fleet.hosts)


def trial(
    fleet: loopback.Fleet, real: loopback.Fleet, method: str, rtt: int, work: Path, kib: int
) -> Trial:
    """One fanout trial of ``method`` through a relay adding ``rtt``."""
    with relay(fleet, real, rtt) as links:
        run = fanout.trial(fleet, METHODS[method], work, kib)
    trips, conns = per_host(links, fleet, rtt)
    return Trial(run, tuple(trips), conns)


# ---------------------------------------------------------------- multihost's phases


def phases_worker(argv: Sequence[str]) -> int:
    """``--phases-worker FLEET_JSON N SRC OUT ROOT``: one ``multihost.api.runs.run`` (ROOT's) with
    ``on_event``, writing each host's state times (by address:port) to OUT."""
    fleet_json, n, src, out, root = argv
    sys.path.insert(0, root)  # that checkout's multihost, not this one's (ROOT)
    import multihost.api.runs as api
    from multihost.events import HostEvent

    fleet = loopback.Fleet.from_json(Path(fleet_json).read_text()).head(int(n))
    where = {h.alias: f"{h.address}:{h.port}" for h in fleet.hosts}
    times: dict[str, dict[str, float]] = {a: {} for a in where.values()}

    def on_event(event: object) -> None:
        if isinstance(event, HostEvent):
            times[where[event.host.address]].setdefault(str(event.state), time.time())

    tag = secrets.token_hex(6)
    with tempfile.TemporaryDirectory(prefix="latency-logs-") as logs:
        result = api.run(
            fanout.remote_command(tag),
            hosts=",".join(where),
            ssh_config=str(fleet.ssh_config),
            script_dir=src,
            stream="none",
            log_dir=logs,
            run_name=f"latency-{tag}",
            on_event=on_event,
        )
    Path(out).write_text(json.dumps(times))
    return 1 if result.failed else 0


def phase_trips(
    fleet: loopback.Fleet, real: loopback.Fleet, rtt: int, work: Path, kib: int, root: Path = ROOT
) -> dict[str, float]:
    """Median round trips per host in each of multihost's phases, at ``rtt`` (multihost from
    the checkout ``root``)."""
    src = fanout.make_script_dir(work, secrets.token_hex(6), kib)
    out = work / "phases.json"
    argv = [
        sys.executable,
        __file__,
        "--phases-worker",
        str(fleet.ssh_config.parent / "fleet.json"),
        str(len(fleet.hosts)),
        str(src),
        str(out),
        str(root),
    ]
    with relay(fleet, real, rtt) as links:
        subprocess.run(argv, check=True, env=fanout._env(root), timeout=fanout.TRIAL_TIMEOUT)
    times = json.loads(out.read_text())
    shutil.rmtree(src, ignore_errors=True)
    counts: dict[str, list[int]] = {p: [] for p in PHASES}
    for link in links:
        t = times.get(link["listen"])
        if not t or not link["chunks"] or any(s not in t for s in STATES):
            continue
        edges = [float("-inf"), *(t[s] for s in STATES), float("inf")]
        for i, phase in enumerate(PHASES):
            trips = round_trips(link["chunks"], rtt / 2000, edges[i], edges[i + 1], tcp=i == 0)
            counts[phase].append(trips)
    return {p: float(statistics.median(c)) if c else float("nan") for p, c in counts.items()}


# ---------------------------------------------------------------- the table


def table(rows: Sequence[Row]) -> str:
    """Markdown: per RTT, size and method the medians, ratios to parallel-ssh and to the
    RTT-0 wall."""
    lines = [
        "| RTT (ms) | N | method | trials | wall (s) | start skew (s) | runner CPU (ms/host) "
        "| round trips/host | connections/host | wall / parallel-ssh | (wall − RTT-0 wall) / RTT "
        "| load (1 min) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ps = next((p for p in rows if (p.rtt, p.n, p.method) == (r.rtt, r.n, "parallel-ssh")), None)
        zero = next((z for z in rows if (z.rtt, z.n, z.method) == (0, r.n, r.method)), None)
        vs = f"{r.median('wall') / ps.median('wall'):.2f}" if ps else "–"
        over = (
            f"{(r.median('wall') - zero.median('wall')) * 1000 / r.rtt:.1f}"
            if zero and r.rtt
            else "–"
        )
        load = f"{min(t.run.load for t in r.trials):.1f}–{max(t.run.load for t in r.trials):.1f}"
        conns = statistics.median(t.conns for t in r.trials)
        trips = f"{r.trips:g} (max {r.trips_max})" if r.rtt else "–"  # no delay: no turns to see
        lines.append(
            f"| {r.rtt} | {r.n} | {r.method} | {len(r.trials)} | {r.median('wall'):.2f} "
            f"| {r.skew:.3f} | {r.cpu_ms:.1f} | {trips} | {conns:g} "
            f"| {vs} | {over} | {load} |"
        )
    return "\n".join(lines)


def phase_table(phases: dict[tuple[int, str], tuple[int, dict[str, float]]]) -> str:
    """Markdown: multihost's round trips per host in each phase, per RTT (and checkout)."""
    head = "| RTT (ms) | N | multihost | " + " | ".join(PHASES) + " | total | floor |"
    lines = [head, "|---:|---:|---|" + "---:|" * (len(PHASES) + 2)]
    for (rtt, method), (n, counts) in sorted(phases.items()):
        total = sum(counts.values())
        lines.append(
            f"| {rtt} | {n} | {method} | "
            + " | ".join(f"{counts[p]:g}" for p in PHASES)
            + f" | {total:g} | {FLOOR} |"
        )
    return "\n".join(lines)


def verdict(rows: Sequence[Row], target_rtt: int = 50) -> str:
    """Against the targets at RTT 50 ms: wall ≤ 0.5× parallel-ssh; wall ≤ (floor + 4) × RTT
    + the RTT-0 wall."""
    out = []
    for r in rows:
        if r.method != "multihost" or r.rtt != target_rtt:
            continue
        ps = next((p for p in rows if (p.rtt, p.n, p.method) == (r.rtt, r.n, "parallel-ssh")), None)
        zero = next((z for z in rows if (z.rtt, z.n, z.method) == (0, r.n, "multihost")), None)
        if ps:
            ratio = r.median("wall") / ps.median("wall")
            out.append(
                f"N={r.n}: wall / parallel-ssh {ratio:.2f} "
                f"(≤ 0.5: {'met' if ratio <= 0.5 else 'MISSED'})"
            )
        if zero:
            bound = (FLOOR + 4) * r.rtt / 1000 + zero.median("wall")
            ok = r.median("wall") <= bound
            out.append(
                f"N={r.n}: wall {r.median('wall'):.2f} s vs (floor + 4) × RTT + RTT-0 "
                f"wall = {bound:.2f} s ({'met' if ok else 'MISSED'})"
            )
    return ("Targets at RTT 50 ms: " + "; ".join(out) + ".") if out else "Targets: not measured."


def section(
    rows: Sequence[Row],
    phases: dict[tuple[int, str], tuple[int, dict[str, float]]],
    args: argparse.Namespace,
) -> str:
    """The RESULTS.md section this script owns."""
    begin, end = markers(args.section)
    return "\n".join(
        [
            begin,
            "## Latency: launch with every host an RTT away (benchmarks/latency.py)",
            "",
            f"Machine: {fanout.machine()}; load average before/after: {args.load_before:.1f} / "
            f"{os.getloadavg()[0]:.1f} (the machine is shared: other helpers' work inflates every "
            "column; the methods are interleaved so that it hits them alike).",
            "",
            "Every host is reached through benchmarks/netdelay.py, a user-space TCP relay (one "
            "process, not counted in the runner's CPU) that delivers each chunk RTT/2 after it "
            "arrived, each way, and models TCP's handshake (the client's first bytes reach the "
            "host 1.5 RTT after its connect). The trials are benchmarks/fanout.py's: a fresh "
            f"{fanout.code_size(args.code_kib)} script dir per trial, `date +%s.%N > "
            "$HOME/.fanout-TAG` on every host. *round trips/host*: per host, over all its "
            "connections, the times the client waited: a client→host chunk answered by a "
            "host→client chunk at least RTT/2 later at the relay counts one (the client's chunks "
            "sent meanwhile are pipelined, not waited for), plus one for TCP's handshake (median "
            "over hosts, then over trials; max over all; not shown at RTT 0, where no turn can be "
            "told from traffic already on its way). "
            "*(wall − RTT-0 wall) / RTT*: how many round trips the delay added to the wall. "
            "parallel-ssh: SFTP copy then run_command (one connection per host); MaxText-arch: "
            "one scp and one ssh process per host (two connections)."
            + (
                f" *before*: multihost from `--before {args.before}` (the code before the "
                f"round-trip "
                "changes), interleaved with this checkout's."
                if args.before
                else ""
            ),
            "",
            f"Command: `python benchmarks/latency.py --sizes {args.sizes} --rtts {args.rtts} "
            f"--repeat {args.repeat} --code-kib {args.code_kib} --methods {args.methods}"
            + (f" --before {args.before}" if args.before else "")
            + (f" --repeat-256 {args.repeat_256}" if args.repeat_256 is not None else "")
            + (
                f" --maxtext-repeat-256 {args.maxtext_repeat_256}"
                if args.maxtext_repeat_256 is not None
                else ""
            )
            + "`",
            "",
            table(rows),
            "",
            *(
                ["Trials that failed (left out above): " + "; ".join(args.failures), ""]
                if args.failures
                else []
            ),
            verdict(rows),
            "",
            "multihost's round trips per host by phase (from the same relay, split by the time "
            "each host changed state in a run through the Python API; the floor for any "
            "connect + command is 6: TCP, SSH version, key exchange, auth, channel open, exec):",
            "",
            phase_table(phases) if phases else "(not measured)",
            end,
        ]
    )


# ---------------------------------------------------------------- main


def trials_at(args: argparse.Namespace, method: str, n: int) -> int:
    """How many trials ``method`` gets at ``n`` hosts."""
    k = args.repeat if n < 256 or args.repeat_256 is None else args.repeat_256
    if method == "maxtext" and n >= 256 and args.maxtext_repeat_256 is not None:
        k = min(k, args.maxtext_repeat_256)
    return k


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16,64,256")
    p.add_argument("--rtts", default="0,50,100", help="round-trip times in ms")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--methods", default="multihost,parallel-ssh,maxtext")
    p.add_argument("--code-kib", type=int, default=200)
    p.add_argument("--phase-size", type=int, default=16, help="hosts in the phase-count run")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--section", default="latency")
    p.add_argument("--dir", type=Path, default=loopback.DEFAULT_DIR, help="fleet dir")
    p.add_argument(
        "--before",
        type=Path,
        default=None,
        help="another checkout's multihost, measured as method 'before' too",
    )
    p.add_argument(
        "--repeat-256",
        type=int,
        default=None,
        help="trials per method at 256+ hosts (default: --repeat)",
    )
    p.add_argument(
        "--maxtext-repeat-256",
        type=int,
        default=None,
        help="trials of maxtext at 256+ hosts (default: --repeat)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Bring up the fleet, measure every RTT and size, write the table."""
    if argv is None and sys.argv[1:2] == ["--phases-worker"]:
        return phases_worker(sys.argv[2:])
    args = parse_args(argv)
    args.load_before = os.getloadavg()[0]
    sizes = [int(s) for s in args.sizes.split(",")]
    rtts = [int(r) for r in args.rtts.split(",")]
    methods = args.methods.split(",")
    fanout.byte_compile(ROOT)
    roots = {"multihost": ROOT}
    if args.before is not None:
        roots["before"] = args.before.resolve()
        METHODS["before"] = functools.partial(fanout.launch_multihost, root=roots["before"])
        fanout.byte_compile(roots["before"])
        if "before" not in methods:
            methods.insert(
                methods.index("multihost") + 1 if "multihost" in methods else 0, "before"
            )
    fleet = loopback.up(max(sizes), args.dir)
    client = Path(tempfile.mkdtemp(prefix="latency-client-"))
    rows: list[Row] = []
    phases: dict[tuple[int, str], tuple[int, dict[str, float]]] = {}
    failures = args.failures = []
    try:
        real = loopback.private_client(fleet, client / "direct")
        near = relayed(real, client / "relayed")
        fanout.clean_homes(real)
        with tempfile.TemporaryDirectory(prefix="latency-") as work:
            for rtt in rtts:
                for n in sizes:
                    sub, sub_real = near.head(n), real.head(n)
                    got: dict[str, list[Trial]] = {m: [] for m in methods}
                    for k in range(args.repeat):
                        for m in methods:
                            if k >= trials_at(args, m, n):
                                continue
                            try:
                                t = trial(sub, sub_real, m, rtt, Path(work), args.code_kib)
                            except (RuntimeError, subprocess.SubprocessError) as exc:
                                failures.append(f"RTT {rtt} ms, N={n}, {m}: {str(exc)[:200]}")
                                print(f"  RTT {rtt:>3} N={n:<4} {m:<12} FAILED {exc}", flush=True)
                                fanout.clean_homes(real)
                                continue
                            got[m].append(t)
                            print(
                                f"  RTT {rtt:>3} N={n:<4} {m:<12} wall {t.run.wall:6.2f}s "
                                f"skew {t.run.last_start - t.run.first_start:5.2f}s cpu "
                                f"{t.run.cpu * 1000 / n:5.1f} ms/host trips "
                                f"{statistics.median(t.trips):g} load {t.run.load:.1f}",
                                flush=True,
                            )
                    rows += [Row(rtt, n, m, tuple(got[m])) for m in methods if got[m]]
                for m, root in roots.items():
                    if m not in methods or not rtt:
                        continue
                    k = min(args.phase_size, len(near.hosts))
                    counts = phase_trips(
                        near.head(k), real.head(k), rtt, Path(work), args.code_kib, root
                    )
                    phases[rtt, m] = (k, counts)
                    print(f"  RTT {rtt} {m} phases at N={k}: {counts}", flush=True)
                if not args.no_write:  # what is measured so far, should a later RTT fail
                    write_section(args.section, section(rows, phases, args))
    finally:
        shutil.rmtree(client, ignore_errors=True)
    text = section(rows, phases, args)
    print(text)
    if not args.no_write:
        write_section(args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
