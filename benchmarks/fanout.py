"""Launch benchmark: multihost vs parallel-ssh vs the MaxText architecture, on a loopback fleet.

Each trial stages a fresh small script dir and runs a command that writes ``date +%s.%N``
into the host user's home; the hosts share this machine, so the timestamps are read back
directly. Methods:

- multihost: ``multihost run --hosts ... --ssh-config ... --script-dir ...`` (a subprocess).
- parallel-ssh: parallel-ssh 2.16 (the ``bench`` extra) in a subprocess: ``copy_file`` of the
  tar.gz over SFTP to every host, then one ``run_command`` that untars and runs the command
  (benchmarks/pssh_launch.py).
- asyncssh: bare asyncssh in a subprocess, one channel per host that untars stdin and runs the
  command (benchmarks/asyncssh_launch.py): the floor under any asyncssh runner's CPU.
- maxtext: like MaxText's multihost_runner.py: tar.gz once, one ``scp`` per host (all at
  once), then one ``ssh`` per host doing mkdir/untar/command (all at once).
- sequential: the same scp + ssh, one host after the other.
- before: multihost from another checkout (``--before DIR``), side by side with this one.

Methods are interleaved within each trial (A B C, A B C, …) so that load changes on the shared
machine hit them alike. Usage: ``python benchmarks/fanout.py [--sizes 16,64,256] [--repeat 3]``
(``--sizes 16,48,64,256,512 --large-repeat 1``: the 48- and 64-host bars and 512 hosts).
The code dir is ``--code-kib`` KiB (default 200, incompressible, a small project's); every
checkout measured is byte-compiled first, as an installed package is (an interpreter run with
PYTHONDONTWRITEBYTECODE would otherwise compile multihost from source in every trial, while
parallel-ssh and asyncssh load theirs compiled). After every trial the fleet users' processes
are counted (``left``: anything still running there once the launcher returned, after a short
grace). Writes its section of benchmarks/RESULTS.md. All traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import fcntl
import functools
import json
import os
import platform
import pwd
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from tests import fleet as loopback  # noqa: E402

TRIAL_TIMEOUT = 300.0
TARGET_N = 256  # the start skew target's size
TARGET_SKEW = 1.0  # s, last host start minus first, at 256
# Launch bars kept from earlier rounds: (N, wall / MaxText-arch at most, runner CPU ms/host at
# most or None): the 64-host bar (a third of MaxText-arch's wall) and the 48-host bar.
BARS = ((48, 0.5, None), (64, 1 / 3, 15.0))


@dataclass(frozen=True)
class Trial:
    """One timed launch on N hosts."""

    wall: float
    first_start: float
    last_start: float
    cpu: float
    sent: int  # bytes of code the runner sent (archive bytes × hosts that got it)
    load: float  # 1-min load average when the trial ended
    left: int = 0  # processes of the hosts' users still running after the trial


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


Launcher = Callable[[loopback.Fleet, Path, str, str], int]  # returns the bytes sent


# ---------------------------------------------------------------- payload


def make_script_dir(parent: Path, tag: str, kib: int = 0) -> Path:
    """A fresh script dir whose content differs per trial: a few KB, plus ``kib`` KiB of
    incompressible data in 20 KiB files (the archive is then about ``kib`` KiB)."""
    d = parent / f"src-{tag}"
    (d / "pkg").mkdir(parents=True)
    (d / "run.sh").write_text(f"#!/bin/sh\n# {tag}\necho hello from $MULTIHOST_TEST_HOST\n")
    (d / "pkg" / "__init__.py").write_text(f'"""Trial {tag}."""\nNONCE = "{tag}"\n')
    (d / "pkg" / "data.txt").write_text(secrets.token_hex(2048) + "\n")
    (d / "README.md").write_text(f"benchmark payload {tag}\n" * 20)
    for i in range(0, kib, 20):
        (d / "pkg" / f"shard{i // 20:03d}.bin").write_bytes(os.urandom(min(20, kib - i) << 10))
    return d


def byte_compile(root: Path) -> None:
    """Write ``root``'s bytecode (its package, benchmarks and tests), as an install does."""
    for sub in ("multihost", "benchmarks", "tests"):
        if (root / sub).is_dir():
            compileall.compile_dir(root / sub, quiet=1)


def fleet_processes(fleet: loopback.Fleet) -> list[int]:
    """Live processes of the fleet's users, sshd's own left out (what
    ``loopback.user_processes`` finds per host, in one pass over /proc)."""
    uids = set()
    for h in fleet.hosts:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(h.user).pw_uid)
    out = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError):
            if not name.isdigit() or os.stat(f"/proc/{name}").st_uid not in uids:
                continue
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X") and os.readlink(f"/proc/{name}/exe") != loopback.SSHD:
                out.append(int(name))
    return out


def left_behind(fleet: loopback.Fleet, grace: float = 5.0) -> int:
    """How many of the fleet users' processes are still there ``grace`` s after a trial (0 as
    soon as there are none)."""
    deadline = time.monotonic() + grace
    while (left := len(fleet_processes(fleet))) and time.monotonic() < deadline:
        time.sleep(0.2)  # a poll loop: sessions that are ending still show for a moment
    return left


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
    """How to call the multihost CLI of this checkout: this Python, ``-m multihost`` (with
    ``ROOT`` first on its path, see ``_env``), never a version-manager shim found on PATH."""
    return [sys.executable, "-m", "multihost"]


def _env(root: Path = ROOT) -> dict[str, str]:
    """This checkout's package (or ``root``'s) first on the path, whatever is installed."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else str(root)}


@functools.cache
def long_host_list_broken(fleet: loopback.Fleet) -> bool:
    """True if this multihost cannot take the fleet's comma list (>255 chars: ENAMETOOLONG)."""
    spec = ",".join(fleet.aliases)
    if len(spec) <= 255:
        return False
    argv = [*multihost_argv(), "run", "--hosts", spec, "--ssh-config", str(fleet.ssh_config)]
    r = subprocess.run(
        [*argv, "--cmd", "true", "--dry-run"], capture_output=True, text=True, env=_env()
    )
    return "File name too long" in r.stderr


def hosts_arg(fleet: loopback.Fleet, work: Path) -> str:
    """``--hosts`` value: the comma list, or a TOML inventory where the list is broken."""
    if not long_host_list_broken(fleet):
        return ",".join(fleet.aliases)
    inventory = work / "inventory.toml"
    hosts = ", ".join(f'"{a}"' for a in fleet.aliases)
    inventory.write_text(f"[[slices]]\nhosts = [{hosts}]\n")
    return str(inventory)


def launch_multihost(
    fleet: loopback.Fleet, src: Path, tag: str, cmd: str, root: Path = ROOT
) -> int:
    """One ``multihost run`` on every host (multihost from the checkout ``root``)."""
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
        # in ``root``: ``python -m`` puts the working directory first on the path, ahead of
        # PYTHONPATH, so run from elsewhere it would load that directory's multihost
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=TRIAL_TIMEOUT, env=_env(root), cwd=root
        )
        if r.returncode != 0:
            raise RuntimeError(f"multihost rc={r.returncode}: {(r.stdout + r.stderr)[-800:]}")
        record = json.loads((Path(logs) / f"fanout-{tag}" / "run.json").read_text())
        return sum(int(h.get("bytes_sent", 0)) for h in record["hosts"])


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


def launch_pssh(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> int:
    """parallel-ssh: SFTP copy of the tar.gz to every host, then one run_command each."""
    tar = _tarball(src, tag)
    worker = ROOT / "benchmarks" / "pssh_launch.py"
    fleet_json = fleet.ssh_config.parent / "fleet.json"  # loopback.private_client wrote it
    argv = [sys.executable, str(worker), str(fleet_json), str(len(fleet.hosts)), str(tar), tag]
    _check([_popen([*argv, cmd])], "parallel-ssh")
    return tar.stat().st_size * len(fleet.hosts)


def launch_asyncssh(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> int:
    """Bare asyncssh: one channel per host unpacks the tar.gz from stdin and runs the command
    (benchmarks/asyncssh_launch.py): what the library alone costs for the same work."""
    tar = _tarball(src, tag)
    worker = ROOT / "benchmarks" / "asyncssh_launch.py"
    fleet_json = fleet.ssh_config.parent / "fleet.json"
    argv = [sys.executable, str(worker), str(fleet_json), str(len(fleet.hosts)), str(tar), tag]
    _check([_popen([*argv, cmd])], "asyncssh")
    return tar.stat().st_size * len(fleet.hosts)


def launch_maxtext(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> int:
    """MaxText's architecture: every scp at once, then every ssh at once."""
    tar = _tarball(src, tag)
    _check([_popen(_scp_argv(fleet, a, tar)) for a in fleet.aliases], "scp")
    _check([_popen(_ssh_argv(fleet, a, tar, tag, cmd)) for a in fleet.aliases], "ssh")
    return tar.stat().st_size * len(fleet.hosts)


def launch_sequential(fleet: loopback.Fleet, src: Path, tag: str, cmd: str) -> int:
    """The same scp + ssh, one host after the other."""
    tar = _tarball(src, tag)
    for a in fleet.aliases:
        _check([_popen(_scp_argv(fleet, a, tar))], f"scp {a}")
        _check([_popen(_ssh_argv(fleet, a, tar, tag, cmd))], f"ssh {a}")
    return tar.stat().st_size * len(fleet.hosts)


METHODS: dict[str, Launcher] = {
    "multihost": launch_multihost,
    "parallel-ssh": launch_pssh,
    "asyncssh": launch_asyncssh,
    "maxtext": launch_maxtext,
    "sequential": launch_sequential,
}


# ---------------------------------------------------------------- measuring


def _cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def trial(fleet: loopback.Fleet, launch: Launcher, work: Path, kib: int = 0) -> Trial:
    """Stage a fresh dir and launch on every host; time it; count what it left running."""
    tag = secrets.token_hex(6)
    src = make_script_dir(work, tag, kib)
    cpu0, t0, wall0 = _cpu(), time.time(), time.monotonic()
    sent = launch(fleet, src, tag, remote_command(tag))
    wall, cpu = time.monotonic() - wall0, _cpu() - cpu0
    load = os.getloadavg()[0]
    starts = start_times(fleet, tag)
    left = left_behind(fleet)
    clean_homes(fleet)
    shutil.rmtree(src, ignore_errors=True)
    return Trial(wall, min(starts) - t0, max(starts) - t0, cpu, sent, load, left)


def _show(method: str, n: int, t: Trial) -> None:
    print(
        f"  {method:<12} N={n:<4} wall {t.wall:7.2f}s  skew {t.last_start - t.first_start:6.2f}s"
        f"  cpu {t.cpu * 1000 / n:6.1f} ms/host  sent {t.sent / 1e6:7.2f} MB  load {t.load:.1f}"
        f"  left {t.left}",
        flush=True,
    )


def multihost_available() -> str | None:
    """None if ``multihost run --help`` works, else why not."""
    try:
        r = subprocess.run(
            [*multihost_argv(), "run", "--help"], capture_output=True, text=True, env=_env()
        )
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
        "| runner CPU (ms/host) | bytes sent (MB) | wall / parallel-ssh | CPU / parallel-ssh "
        "| wall / MaxText-arch | load (1 min) | left |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pssh = {r.n: r for r in rows if r.method == "parallel-ssh" and r.trials}
    for r in rows:
        if not r.trials:
            lines.append(
                f"| {r.n} | {r.method} | 0 | – | – | – | – | – | – | – | – | {r.note} | – |"
            )
            continue
        ratio = f"{r.median('wall') / base[r.n]:.2f}" if r.n in base else "–"
        ps = pssh.get(r.n)
        vs = f"{r.median('wall') / ps.median('wall'):.2f}" if ps else "–"
        cpu_vs = f"{r.cpu_ms_per_host / ps.cpu_ms_per_host:.2f}" if ps else "–"
        load = f"{min(t.load for t in r.trials):.1f}–{max(t.load for t in r.trials):.1f}"
        lines.append(
            f"| {r.n} | {r.method} | {_trials_label(r, repeat)} | {r.median('wall'):.2f} "
            f"| {r.median('last_start'):.2f} | {r.skew:.3f} | {r.cpu_ms_per_host:.1f} "
            f"| {r.median('sent') / 1e6:.2f} | {vs} | {cpu_vs} | {ratio} | {load} "
            f"| {max(t.left for t in r.trials)} |"
        )
    return "\n".join(lines)


def _row(rows: Sequence[Row], n: int, method: str) -> Row | None:
    return next((r for r in rows if r.n == n and r.method == method and r.trials), None)


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def verdict(rows: Sequence[Row]) -> str:
    """Against the launch targets: at every size wall and runner CPU per host ≤ parallel-ssh's;
    start skew ≤ 1 s at 256 hosts; larger sizes end to end with nothing left; and the launch
    bars kept from earlier rounds (``BARS``)."""
    out = []
    for n in sorted({r.n for r in rows}):
        mh, ps = _row(rows, n, "multihost"), _row(rows, n, "parallel-ssh")
        if mh and ps:
            wall = mh.median("wall") / ps.median("wall")
            cpu = mh.cpu_ms_per_host / ps.cpu_ms_per_host
            out.append(
                f"N={n}: multihost/parallel-ssh wall {wall:.2f} (≤ 1: {_met(wall <= 1)}), "
                f"CPU {cpu:.2f} (≤ 1: {_met(cpu <= 1)})"
            )
    if (mh := _row(rows, TARGET_N, "multihost")) is not None:
        ok = mh.skew <= TARGET_SKEW
        out.append(f"N={TARGET_N}: start skew {mh.skew:.2f} s (≤ {TARGET_SKEW:g}: {_met(ok)})")
    for n in sorted({r.n for r in rows if r.n > TARGET_N}):
        if (big := _row(rows, n, "multihost")) is not None:
            left = max(t.left for t in big.trials)
            out.append(
                f"N={n}: ran end to end, start skew {big.skew:.2f} s, "
                f"{left} process(es) left ({_met(left == 0)})"
            )
    for n, most, cpu_most in BARS:
        mh, mt = _row(rows, n, "multihost"), _row(rows, n, "maxtext")
        if mh is None or mt is None:
            continue
        ratio = mh.median("wall") / mt.median("wall")
        ok = ratio <= most and (cpu_most is None or mh.cpu_ms_per_host <= cpu_most)
        cpu = "" if cpu_most is None else f", CPU {mh.cpu_ms_per_host:.2f} ≤ {cpu_most:g} ms/host"
        out.append(
            f"bar at N={n}: multihost/MaxText-arch {ratio:.2f} ≤ {most:.2f}{cpu}: {_met(ok)}"
        )
    return ("Targets: " + "; ".join(out) + ".") if out else "Targets: not measured."


def fit(rows: Sequence[Row], method: str) -> tuple[float, float] | None:
    """Least squares of a method's runner CPU (s, the median trial's) against N over the sizes
    measured: (s per added host, fixed s); None below two sizes."""
    points = [(r.n, r.cpu_ms_per_host * r.n / 1000) for r in rows if r.method == method]
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = sum(n for n, _ in points) / len(points)
    mean_c = sum(c for _, c in points) / len(points)
    slope = sum((n - mean_n) * (c - mean_c) for n, c in points) / sum(
        (n - mean_n) ** 2 for n, _ in points
    )
    return slope, mean_c - slope * mean_n


def fit_lines(rows: Sequence[Row]) -> list[str]:
    """Runner CPU = fixed + per added host × N, fitted per method over the sizes; the loopback
    targets: multihost's per added host ≤ 1.15× parallel-ssh's, its fixed part ≤ bare
    asyncssh's + 0.1 s."""
    fits = {m: f for m in ("multihost", "parallel-ssh", "asyncssh") if (f := fit(rows, m))}
    if "multihost" not in fits:
        return []
    parts = [
        f"{m}: {1000 * slope:.2f} ms per added host, fixed {fixed:.3f} s"
        for m, (slope, fixed) in fits.items()
    ]
    out = ["", "Runner CPU fitted over the sizes (least squares): " + "; ".join(parts) + "."]
    mh_slope, mh_fixed = fits["multihost"]
    targets = []
    if "parallel-ssh" in fits:
        ratio = mh_slope / fits["parallel-ssh"][0]
        ok = _met(ratio <= 1.15)
        targets.append(f"per added host {ratio:.2f}× parallel-ssh's (≤ 1.15: {ok})")
    if "asyncssh" in fits:
        more = mh_fixed - fits["asyncssh"][1]
        targets.append(f"fixed {more:+.3f} s over bare asyncssh's (≤ +0.1: {_met(more <= 0.1)})")
        mh1, bare1 = _row(rows, 1, "multihost"), _row(rows, 1, "asyncssh")
        if mh1 is not None and bare1 is not None:  # the fixed part measured, not extrapolated
            one = (mh1.cpu_ms_per_host - bare1.cpu_ms_per_host) / 1000
            targets.append(
                f"at N=1 (measured): {mh1.cpu_ms_per_host / 1000:.3f} s vs "
                f"{bare1.cpu_ms_per_host / 1000:.3f} s, {one:+.3f} s (≤ +0.1: {_met(one <= 0.1)})"
            )
    if targets:
        out.append("Loopback targets: " + "; ".join(targets) + ".")
    return out


def code_size(kib: int) -> str:
    """How the section names the trials' code dir."""
    return f"~5 KB + {kib} KiB (incompressible)" if kib else "~5 KB"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "–"


def before_method(checkouts: Sequence[Path], checkout: Path) -> str:
    """The method's name for a ``--before`` checkout: ``before``, or ``before:NAME`` for each
    of several."""
    return "before" if len(checkouts) == 1 else f"before:{checkout.name}"


def before_lines(rows: Sequence[Row], checkouts: Sequence[Path]) -> list[str]:
    """This checkout against each ``--before`` at each size: wall, skew and CPU ratios."""
    lines = []
    for checkout in checkouts:
        method, out = before_method(checkouts, checkout), []
        for n in sorted({r.n for r in rows}):
            mh, old = _row(rows, n, "multihost"), _row(rows, n, method)
            if mh and old:
                wall = _ratio(mh.median("wall"), old.median("wall"))
                skew = _ratio(mh.skew, old.skew)
                cpu = _ratio(mh.cpu_ms_per_host, old.cpu_ms_per_host)
                out.append(f"N={n}: wall {wall}, start skew {skew}, runner CPU {cpu} × its")
        lines += ["", f"This checkout against `--before {checkout}`: " + "; ".join(out) + "."]
    return lines


def section(rows: Sequence[Row], args: argparse.Namespace) -> str:
    """The RESULTS.md section this script owns (``--section``: another one of its own)."""
    notes = [f"- {r.method} at N={r.n}: {r.note}" for r in rows if r.note]
    begin, end = markers(args.section)
    return "\n".join(
        [
            begin,
            "## Fan-out: launching a trivial command on N loopback hosts"
            + (f" ({args.section})" if args.section != "fanout" else ""),
            "",
            f"Machine: {machine()}; load average before/after: {args.load_before:.1f} / "
            f"{os.getloadavg()[0]:.1f} (other work on the machine inflates every column).",
            "",
            f"Each trial stages a fresh {code_size(args.code_kib)} script dir (content differs "
            "per trial) and runs "
            "`date +%s.%N > $HOME/.fanout-TAG` on every host of a real OpenSSH loopback fleet "
            "(`tests/fleet.py`: one sshd and user per host on 127.0.0.K:2222). "
            "*wall*: launch until every host's command finished and the runner returned; "
            "*last host started*: last timestamp minus local launch time; *start skew*: last "
            "minus first host timestamp; *runner CPU*: user+sys of the benchmark process and its "
            "children (getrusage) per host — sshd's side is not counted; *bytes sent*: code "
            "archive bytes the runner sent (multihost: its run.json's `bytes_sent`; the others: "
            "tar.gz size × hosts). Medians over the trials; the methods are interleaved within "
            "each trial; *load*: the 1-min load average at the end of each trial, min–max; "
            "*left*: the most processes of the hosts' users found running after a trial (5 s "
            "grace; sshd's own left out). Every checkout is byte-compiled first. "
            "parallel-ssh: 2.16 (`ParallelSSHClient`, default pool size 100, libssh2): "
            "`copy_file` of the tar.gz over SFTP, then one `run_command` (mkdir/untar/cmd). "
            "asyncssh: bare asyncssh 2.x (the library multihost uses, same cipher, host keys "
            "checked), one channel per host that untars stdin and runs the command, nothing "
            "else: the floor under any asyncssh runner. "
            "MaxText-arch: tar.gz once, all `scp` at once, then all `ssh` "
            "(mkdir/untar/cmd) at once; sequential: the same, host after host.",
            "",
            f"Command: `python benchmarks/fanout.py --sizes {args.sizes} --repeat {args.repeat} "
            f"--code-kib {args.code_kib} "
            + (f"--large-repeat {args.large_repeat} " if args.large_repeat is not None else "")
            + f"--methods {args.methods} --seq-max {args.seq_max} "
            f"--seq-repeat {args.seq_repeat}"
            + "".join(f" --before {b}" for b in args.before)
            + (f" --section {args.section}" if args.section != "fanout" else "")
            + "`",
            "",
            table(rows, args.repeat),
            "",
            *notes,
            *([""] if notes else []),
            verdict(rows),
            *fit_lines(rows),
            *(before_lines(rows, args.before) if args.before else []),
            end,
        ]
    )


# ---------------------------------------------------------------- main


def _plan(n: int, sub: loopback.Fleet, args: argparse.Namespace) -> dict[str, tuple[int, str]]:
    """Per method: how many trials to run at size n, and the row's note (0 trials: why not)."""
    plan: dict[str, tuple[int, str]] = {}
    for method in args.methods.split(","):
        if method == "multihost" and (why := multihost_available()) is not None:
            plan[method] = (0, f"not measured: multihost CLI not usable ({why})")
        elif method == "multihost" and long_host_list_broken(sub):
            note = "hosts passed as a TOML inventory: a >255-char --hosts list hits ENAMETOOLONG"
            plan[method] = (args.repeat, note)
        elif method == "parallel-ssh" and (why := pssh_available()) is not None:
            plan[method] = (0, f"not measured: {why} (pip install -e '.[bench]')")
        elif method == "sequential" and n > args.seq_max:
            plan[method] = (0, f"skipped (N > --seq-max {args.seq_max})")
        elif n > TARGET_N and method != "sequential" and args.large_repeat is not None:
            plan[method] = (args.large_repeat, f"{args.large_repeat} trial(s) at N > {TARGET_N}")
        elif method == "sequential":
            note = f"{args.seq_repeat} trial(s) only" if args.seq_repeat != args.repeat else ""
            plan[method] = (args.seq_repeat, note)
        else:
            plan[method] = (args.repeat, "")
    return plan


@contextlib.contextmanager
def held(lock: Path | None) -> Iterator[None]:
    """``flock`` on ``lock`` (the SSH tests' fleet lock) for one round of trials (every
    method once), if given: others' SSH tests wait while the big fleet is busy, and run
    between rounds."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pssh_available() -> str | None:
    """None if parallel-ssh can be imported, else why not."""
    r = subprocess.run([sys.executable, "-c", "import pssh.clients"], capture_output=True)
    return None if r.returncode == 0 else "parallel-ssh is not installed"


def run_size(fleet: loopback.Fleet, n: int, args: argparse.Namespace) -> list[Row]:
    """Every method at fleet size n, interleaved: trial k of each method, then trial k+1."""
    sub = fleet.head(n)
    plan = _plan(n, sub, args)
    trials: dict[str, list[Trial]] = {m: [] for m in plan}
    with tempfile.TemporaryDirectory(prefix="fanout-") as work:
        for k in range(max(count for count, _ in plan.values())):
            with held(args.lock):
                for method, (count, _) in plan.items():
                    if k < count:
                        t = trial(sub, METHODS[method], Path(work), args.code_kib)
                        trials[method].append(t)
                        _show(method, n, t)
    return [Row(n, m, tuple(trials[m]), note) for m, (_, note) in plan.items()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="16,64,256", help="comma-separated fleet sizes (to 512)")
    p.add_argument("--repeat", type=int, default=3, help="trials per method and size")
    p.add_argument("--methods", default="multihost,parallel-ssh,asyncssh,maxtext,sequential")
    p.add_argument(
        "--large-repeat",
        type=int,
        default=None,
        help=f"trials per method at N > {TARGET_N} (default: --repeat)",
    )
    p.add_argument("--seq-max", type=int, default=16, help="largest N for the sequential one")
    p.add_argument("--seq-repeat", type=int, default=1, help="trials for the sequential one")
    p.add_argument(
        "--code-kib",
        type=int,
        default=200,
        help="KiB of incompressible data in each trial's code dir (0: ~5 KB only)",
    )
    p.add_argument(
        "--keep-fleet", action="store_true", help="leave the hosts this run brought up running"
    )
    p.add_argument("--dir", type=Path, default=loopback.DEFAULT_DIR, help="fleet dir")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument(
        "--before",
        type=Path,
        action="append",
        default=[],
        help="another checkout's multihost, measured as method 'before' beside "
        "this one's (again for more: 'before:DIRNAME' each)",
    )
    p.add_argument(
        "--section",
        default="fanout",
        help="the RESULTS.md section to write (default: fanout, the headline table)",
    )
    p.add_argument(
        "--lock",
        type=Path,
        default=None,
        help="flock this file during each round of trials (e.g. /tmp/mh-ssh.lock)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Bring up the fleet, measure every size, write the table, restore the fleet."""
    args = parse_args(argv)
    args.load_before = os.getloadavg()[0]
    olds = [before_method(args.before, b) for b in args.before]
    for b, method in zip(args.before, olds, strict=True):
        METHODS[method] = functools.partial(launch_multihost, root=b.resolve())
    if olds and not set(olds) & set(args.methods.split(",")):
        args.methods = args.methods.replace("multihost", ",".join(["multihost", *olds]), 1)
    sizes = [int(s) for s in args.sizes.split(",")]
    for root in (ROOT, *(b.resolve() for b in args.before)):
        byte_compile(root)
    before = set(loopback.running(args.dir))
    fleet = loopback.up(max(sizes), args.dir)
    client = Path(tempfile.mkdtemp(prefix="fanout-client-"))
    try:
        fleet = loopback.private_client(fleet, client)
        clean_homes(fleet)
        rows = [row for n in sizes for row in run_size(fleet, n, args)]
    finally:
        ours = [h.index for h in fleet.hosts if h.index not in before]
        if args.keep_fleet:
            pass
        elif not before:
            loopback.down(args.dir)
        else:
            for i in ours:
                loopback.stop_host(i, args.dir)
            loopback.kill_user_processes(ours)
        shutil.rmtree(client, ignore_errors=True)
    text = section(rows, args)
    print(text)
    if not args.no_write:
        write_section(args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
