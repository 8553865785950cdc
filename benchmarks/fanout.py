"""Launch benchmark: multihost vs the MaxText architecture vs sequential, on a loopback fleet.

Each trial stages a fresh small script dir and runs a command that writes ``date +%s.%N``
into the host user's home; the hosts share this machine, so the timestamps are read back
directly. Methods:

- multihost: ``multihost run --hosts ... --ssh-config ... --script-dir ...`` (a subprocess).
- maxtext: like MaxText's multihost_runner.py: tar.gz once, one ``scp`` per host (all at
  once), then one ``ssh`` per host doing mkdir/untar/command (all at once).
- sequential: the same scp + ssh, one host after the other.

Usage: ``python benchmarks/fanout.py [--sizes 16,64,128] [--repeat 3]``. Writes its section of
benchmarks/RESULTS.md. All traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import fleet as loopback  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- fanout:begin -->", "<!-- fanout:end -->"
TRIAL_TIMEOUT = 300.0
TARGET_RATIO, TARGET_CPU_MS, TARGET_N = 1 / 3, 15.0, 64


@dataclass(frozen=True)
class Trial:
    """One timed launch on N hosts."""

    wall: float
    first_start: float
    last_start: float
    cpu: float


@dataclass(frozen=True)
class Row:
    """All trials of one method at one fleet size."""

    n: int
    method: str
    trials: tuple[Trial, ...]
    note: str = ""

    def median(self, field: str) -> float:
        """Median of one Trial field over the trials."""
        return float(statistics.median(getattr(t, field) for t in self.trials))

    @property
    def skew(self) -> float:
        """Median start skew: last host's start minus first host's start."""
        return statistics.median(t.last_start - t.first_start for t in self.trials)

    @property
    def cpu_ms_per_host(self) -> float:
        """Median runner CPU (process + children) per host, in ms."""
        return self.median("cpu") * 1000 / self.n


Launcher = Callable[[loopback.Fleet, Path, str, str], None]


# ---------------------------------------------------------------- payload


def make_script_dir(parent: Path, tag: str) -> Path:
    """A fresh few-KB script dir whose content differs per trial."""
    d = parent / f"src-{tag}"
    (d / "pkg").mkdir(parents=True)
    (d / "run.sh").write_text(f"#!/bin/sh\n# {tag}\necho hello from $MULTIHOST_TEST_HOST\n")
    (d / "pkg" / "__init__.py").write_text(f'"""Trial {tag}."""\nNONCE = "{tag}"\n')
    (d / "pkg" / "data.txt").write_text(secrets.token_hex(2048) + "\n")
    (d / "README.md").write_text(f"benchmark payload {tag}\n" * 20)
    return d


def remote_command(tag: str) -> str:
    """The trivial command: record when it started in the user's home."""
    return f'date +%s.%N > "$HOME/.fanout-{tag}"'


def start_times(fleet: loopback.Fleet, tag: str) -> list[float]:
    """The start timestamps every host wrote (missing hosts raise)."""
    out = []
    for h in fleet.hosts:
        path = h.home / f".fanout-{tag}"
        try:
            out.append(float(path.read_text().strip()))
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{h.alias}: no start timestamp ({e})") from e
    return out


def clean_homes(fleet: loopback.Fleet) -> None:
    """Remove what trials left in the homes (we are root on the same machine)."""
    for h in fleet.hosts:
        for p in h.home.glob(".fanout-*"):
            p.unlink(missing_ok=True)
        shutil.rmtree(h.home / "fanout-mt", ignore_errors=True)


# ---------------------------------------------------------------- methods


def _check(procs: Sequence[subprocess.Popen[bytes]], what: str) -> None:
    failed = []
    for p in procs:
        _, err = p.communicate(timeout=TRIAL_TIMEOUT)
        if p.returncode != 0:
            failed.append(f"rc={p.returncode} {err.decode(errors='replace').strip()[-300:]}")
    if failed:
        raise RuntimeError(f"{what}: {len(failed)} failed; first: {failed[0]}")


def _popen(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def multihost_argv() -> list[str]:
    """How to call the multihost CLI: the console script installed next to this Python (not a
    version-manager shim found on PATH, which would add its own processes to the CPU column)."""
    exe = Path(sys.executable).parent / "multihost"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "multihost"]


@functools.cache
def long_host_list_broken(fleet: loopback.Fleet) -> bool:
    """True if this multihost cannot take the fleet's comma list (>255 chars: ENAMETOOLONG)."""
    spec = ",".join(fleet.aliases)
    if len(spec) <= 255:
        return False
    argv = [*multihost_argv(), "run", "--hosts", spec, "--ssh-config", str(fleet.ssh_config)]
    r = subprocess.run([*argv, "--cmd", "true", "--dry-run"], capture_output=True, text=True)
    return "File name too long" in r.stderr


def hosts_arg(fleet: loopback.Fleet, work: Path) -> str:
    """``--hosts`` value: the comma list, or a TOML inventory where the list is broken."""
    if not long_host_list_broken(fleet):
        return ",".join(fleet.aliases)
    inventory = work / "inventory.toml"
    hosts = ", ".join(f'"{a}"' for a in fleet.aliases)
    inventory.write_text(f"[[slices]]\nhosts = [{hosts}]\n")
    return str(inventory)


def launch_multihost(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> None:
    """One ``multihost run`` on every host."""
    with tempfile.TemporaryDirectory(prefix="fanout-logs-") as logs:
        argv = [
            *multihost_argv(),
            "run",
            "--hosts",
            hosts_arg(fleet, Path(logs)),
            "--ssh-config",
            str(fleet.ssh_config),
            "--script-dir",
            str(src),
            "--stream",
            "none",
            "--log-dir",
            logs,
            "--run-name",
            f"fanout-{tag}",
            "--cmd",
            cmd,
        ]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TRIAL_TIMEOUT)
        if r.returncode != 0:
            raise RuntimeError(f"multihost rc={r.returncode}: {(r.stdout + r.stderr)[-800:]}")


def _tarball(src: Path, tag: str) -> Path:
    tar = src.parent / f"{tag}.tar.gz"
    subprocess.run(["tar", "--exclude=tmp", "-czf", str(tar), "-C", str(src), "."], check=True)
    return tar


def _scp_argv(fleet: loopback.Fleet, alias: str, tar: Path) -> list[str]:
    return ["scp", "-q", "-F", str(fleet.ssh_config), str(tar), f"{alias}:{tar.name}"]


def _ssh_argv(fleet: loopback.Fleet, alias: str, tar: Path, tag: str, cmd: str) -> list[str]:
    remote = f"fanout-mt/{tag}"
    script = (
        f"mkdir -p {remote} && mv {tar.name} {remote}/ && cd {remote} && "
        f"tar xzf {tar.name} && {cmd}"
    )
    return ["ssh", "-F", str(fleet.ssh_config), alias, script]


def launch_maxtext(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> None:
    """MaxText's architecture: every scp at once, then every ssh at once."""
    tar = _tarball(src, tag)
    _check([_popen(_scp_argv(fleet, a, tar)) for a in fleet.aliases], "scp")
    _check([_popen(_ssh_argv(fleet, a, tar, tag, cmd)) for a in fleet.aliases], "ssh")


def launch_sequential(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> None:
    """The same scp + ssh, one host after the other."""
    tar = _tarball(src, tag)
    for a in fleet.aliases:
        _check([_popen(_scp_argv(fleet, a, tar))], f"scp {a}")
        _check([_popen(_ssh_argv(fleet, a, tar, tag, cmd))], f"ssh {a}")


METHODS: dict[str, Launcher] = {
    "multihost": launch_multihost,
    "maxtext": launch_maxtext,
    "sequential": launch_sequential,
}


# ---------------------------------------------------------------- measuring


def _cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def trial(fleet: loopback.Fleet, launch: Launcher, work: Path) -> Trial:
    """Stage a fresh dir and launch on every host; time it."""
    tag = secrets.token_hex(6)
    src = make_script_dir(work, tag)
    cpu0, t0, wall0 = _cpu(), time.time(), time.monotonic()
    launch(fleet, src, tag, remote_command(tag))
    wall, cpu = time.monotonic() - wall0, _cpu() - cpu0
    starts = start_times(fleet, tag)
    clean_homes(fleet)
    return Trial(wall, min(starts) - t0, max(starts) - t0, cpu)


def measure(fleet: loopback.Fleet, method: str, repeat: int, note: str = "") -> Row:
    """Run ``repeat`` trials of one method."""
    with tempfile.TemporaryDirectory(prefix="fanout-") as work:
        trials = tuple(trial(fleet, METHODS[method], Path(work)) for _ in range(repeat))
    row = Row(len(fleet.hosts), method, trials, note)
    print(
        f"  {method:<10} N={row.n:<4} wall {row.median('wall'):7.2f}s  "
        f"skew {row.skew:6.2f}s  cpu {row.cpu_ms_per_host:6.1f} ms/host",
        flush=True,
    )
    return row


def multihost_available() -> str | None:
    """None if ``multihost run --help`` works, else why not."""
    try:
        r = subprocess.run([*multihost_argv(), "run", "--help"], capture_output=True, text=True)
    except OSError as e:
        return str(e)
    if r.returncode != 0:
        return (r.stdout + r.stderr).strip().splitlines()[-1:][0] if r.stderr else "fails"
    missing = [f for f in ("--ssh-config", "--script-dir", "--stream") if f not in r.stdout]
    return f"run --help lacks {', '.join(missing)}" if missing else None


# ---------------------------------------------------------------- report


def machine() -> str:
    """CPU, cores, OpenSSH, Python and date, in one line."""
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    cores = len(os.sched_getaffinity(0))
    day = datetime.date.today().isoformat()
    return (
        f"{model}, {cores} cores, {ssh.split(',')[0]}, Python {platform.python_version()}, "
        f"Linux {platform.release()}, {day}"
    )


def _trials_label(row: Row, repeat: int) -> str:
    return f"{len(row.trials)}" + ("" if len(row.trials) == repeat else f" (of {repeat})")


def table(rows: Sequence[Row], repeat: int) -> str:
    """Markdown table of medians, with multihost / MaxText-arch ratios."""
    base = {r.n: r.median("wall") for r in rows if r.method == "maxtext"}
    lines = [
        "| N | method | trials | wall (s) | last host started (s) | start skew (s) "
        "| runner CPU (ms/host) | wall / MaxText-arch |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if not r.trials:
            lines.append(f"| {r.n} | {r.method} | 0 | – | – | – | – | {r.note} |")
            continue
        ratio = f"{r.median('wall') / base[r.n]:.2f}" if r.n in base else "–"
        lines.append(
            f"| {r.n} | {r.method} | {_trials_label(r, repeat)} | {r.median('wall'):.2f} "
            f"| {r.median('last_start'):.2f} | {r.skew:.3f} | {r.cpu_ms_per_host:.1f} | {ratio} |"
        )
    return "\n".join(lines)


def verdict(rows: Sequence[Row]) -> str:
    """Against the target: at N=64 wall ≤ 1/3 of MaxText-arch and CPU ≤ 15 ms/host."""
    mh = next((r for r in rows if r.n == TARGET_N and r.method == "multihost" and r.trials), None)
    mt = next((r for r in rows if r.n == TARGET_N and r.method == "maxtext" and r.trials), None)
    if mh is None or mt is None:
        return f"Target (N={TARGET_N}): not measured."
    ratio = mh.median("wall") / mt.median("wall")
    ok_wall, ok_cpu = ratio <= TARGET_RATIO, mh.cpu_ms_per_host <= TARGET_CPU_MS
    wall = "met" if ok_wall else "MISSED"
    cpu = "met" if ok_cpu else "MISSED"
    return (
        f"Target at N={TARGET_N}: multihost/MaxText-arch wall {ratio:.2f} (≤ 0.33: {wall}); "
        f"runner CPU {mh.cpu_ms_per_host:.1f} ms/host (≤ {TARGET_CPU_MS:.0f}: {cpu})."
    )


def section(rows: Sequence[Row], args: argparse.Namespace) -> str:
    """The RESULTS.md section this script owns."""
    notes = [f"- {r.method} at N={r.n}: {r.note}" for r in rows if r.note]
    return "\n".join(
        [
            BEGIN,
            "## Fan-out: launching a trivial command on N loopback hosts",
            "",
            f"Machine: {machine()}; load average before/after: {args.load_before:.1f} / "
            f"{os.getloadavg()[0]:.1f} (other work on the machine inflates every column).",
            "",
            "Each trial stages a fresh ~5 KB script dir (content differs per trial) and runs "
            "`date +%s.%N > $HOME/.fanout-TAG` on every host of a real OpenSSH loopback fleet "
            "(`tests/fleet.py`: one sshd and user per host on 127.0.0.K:2222). "
            "*wall*: launch until every host's command finished and the runner returned; "
            "*last host started*: last timestamp minus local launch time; *start skew*: last "
            "minus first host timestamp; *runner CPU*: user+sys of the benchmark process and its "
            "children (getrusage) per host — sshd's side is not counted. Medians over the "
            "trials. MaxText-arch: tar.gz once, all `scp` at once, then all `ssh` "
            "(mkdir/untar/cmd) at once; sequential: the same, host after host.",
            "",
            f"Command: `python benchmarks/fanout.py --sizes {args.sizes} --repeat {args.repeat} "
            f"--seq-max {args.seq_max} --seq-repeat {args.seq_repeat}`",
            "",
            table(rows, args.repeat),
            "",
            *notes,
            *([""] if notes else []),
            verdict(rows),
            END,
        ]
    )


def write_section(text: str, path: Path = RESULTS) -> None:
    """Replace (or append) only the fanout section of RESULTS.md."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + text + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


# ---------------------------------------------------------------- main


def run_size(fleet: loopback.Fleet, n: int, args: argparse.Namespace) -> list[Row]:
    """Every method at fleet size n."""
    sub = fleet.head(n)
    rows = []
    for method in args.methods.split(","):
        if method == "multihost" and (why := multihost_available()) is not None:
            rows.append(Row(n, method, (), f"not measured: multihost CLI not usable ({why})"))
            continue
        if method == "multihost" and long_host_list_broken(sub):
            note = "hosts passed as a TOML inventory: a >255-char --hosts list hits ENAMETOOLONG"
            rows.append(measure(sub, method, args.repeat, note))
            continue
        if method == "sequential":
            if n > args.seq_max:
                rows.append(Row(n, method, (), f"skipped (N > --seq-max {args.seq_max})"))
                continue
            note = f"{args.seq_repeat} trial(s) only" if args.seq_repeat != args.repeat else ""
            rows.append(measure(sub, method, args.seq_repeat, note))
            continue
        rows.append(measure(sub, method, args.repeat))
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16,64,128", help="comma-separated fleet sizes")
    p.add_argument("--repeat", type=int, default=3, help="trials per method and size")
    p.add_argument("--methods", default="multihost,maxtext,sequential")
    p.add_argument("--seq-max", type=int, default=64, help="largest N for the sequential one")
    p.add_argument("--seq-repeat", type=int, default=1, help="trials for the sequential one")
    p.add_argument("--dir", type=Path, default=loopback.DEFAULT_DIR, help="fleet dir")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Bring up the fleet, measure every size, write the table, restore the fleet."""
    args = parse_args(argv)
    args.load_before = os.getloadavg()[0]
    sizes = [int(s) for s in args.sizes.split(",")]
    before = set(loopback.running(args.dir))
    fleet = loopback.up(max(sizes), args.dir)
    try:
        clean_homes(fleet)
        rows = [row for n in sizes for row in run_size(fleet, n, args)]
    finally:
        ours = [h.index for h in fleet.hosts if h.index not in before]
        if not before:
            loopback.down(args.dir)
        else:
            for i in ours:
                loopback.stop_host(i, args.dir)
            loopback.kill_user_processes(ours)
    text = section(rows, args)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
