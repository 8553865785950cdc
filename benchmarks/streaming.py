"""Streaming benchmark: the runner's CPU per line of host output echoed, and a flood's delay.

``multihost run --local H --stream all --cmd "seq 1 N"`` with stderr on a pseudo-terminal
(the live status line) and stdout on it or on a pipe, both read as fast as they come, against
the same run with ``--stream none`` (the logs are still written, nothing is echoed). The
runner's own user+sys CPU is read from inside it (``getrusage(RUSAGE_SELF)`` at exit), so the
hosts' processes (``seq``, ``tail``) are not counted. Every trial checks that each host's lines
reached stdout complete and in order, and that every log file is byte-exact. ``--before DIR``
also measures another checkout (e.g. the main branch) side by side, trials interleaved. Then
one host (and then all but one) floods while the last prints time-stamped ticks: how late the
ticks reach stdout.

Usage: ``python benchmarks/streaming.py [--hosts 8] [--lines 250000] [--repeat 3]
[--before ../main] [--ssh]``; ``--ssh``: hosts h0.. of the loopback sshd fleet instead of
``--local`` (hold the fleet lock: ``flock /tmp/multihost-fleet.lock python ...``). Writes its
section of benchmarks/RESULTS.md (one for --local, one for --ssh).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import selectors
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

from benchmarks.results import markers, write_section  # noqa: E402

SECTION, SSH_SECTION = "streaming", "streaming-ssh"
TARGET_US = 5.0
# Runs the CLI, then writes its own CPU (user+sys seconds) to the file named by $CPU_OUT.
DRIVER = """\
import atexit, os, resource, sys
import multihost
def _dump():
    r = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["CPU_OUT"], "w") as f:
        f.write(f"{r.ru_utime + r.ru_stime} {multihost.__file__}\\n")
atexit.register(_dump)
from multihost.cli import main
sys.exit(main())
"""


@dataclass(frozen=True)
class Version:
    """A checkout to measure and the lines per host to run it with."""

    name: str
    root: Path
    lines: int


@dataclass(frozen=True)
class Where:
    """The hosts: ``multihost run``'s flags that name them, and how many."""

    args: tuple[str, ...]
    n: int
    homes: tuple[Path, ...] = ()  # the sshd fleet's hosts' homes: their run dirs are removed

    @staticmethod
    def of(n: int, ssh: bool) -> Where:
        if not ssh:
            return Where(("--local", str(n)), n)
        from tests import fleet as loopback

        fleet = loopback.load()
        names = ",".join(loopback.alias(i) for i in range(n))
        homes = tuple(h.home for h in fleet.hosts[:n])
        return Where(("--hosts", names, "--ssh-config", str(fleet.ssh_config)), n, homes)


OUTPUTS = ("tty", "pipe", "none")  # stdout: the pty, a pipe, or nothing (--stream none)


@dataclass(frozen=True)
class Trial:
    """One run: the runner's CPU, wall time and load."""

    cpu: float
    wall: float
    load: float


@dataclass(frozen=True)
class Ran:
    """What one ``multihost run`` printed on stdout and cost."""

    out: str
    wall: float
    cpu: float
    logs: Path


def launch(
    root: Path,
    work: Path,
    where: Where,
    output: str,
    cmd: str,
    on_out: Callable[[bytes], object] = lambda _b: None,
) -> Ran:
    """One ``multihost run WHERE --cmd CMD`` with stderr on a pty and stdout on it
    (``tty``, and ``none``: ``--stream none``) or on a pipe (``pipe``); ``on_out`` sees
    stdout's chunks as they come."""
    root = root.resolve()
    home, logs, code = work / "home", work / "logs", work / "code"
    for d in (home, code):
        d.mkdir(parents=True, exist_ok=True)
    (code / "x.txt").write_text("x\n")
    cpu_file = work / "cpu.txt"
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONPATH": str(root),
        "CPU_OUT": str(cpu_file),
        "TERM": "xterm-256color",
        "COLUMNS": "120",
        "LINES": "40",
    }
    run = f"streaming-{time.time_ns()}"
    argv = [
        sys.executable,
        "-c",
        DRIVER,
        "run",
        *where.args,
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        run,
        "--stream",
        "none" if output == "none" else "all",
        "--cmd",
        cmd,
    ]
    master, slave = os.openpty()
    reader, writer = os.pipe() if output == "pipe" else (master, slave)
    t0 = time.monotonic()
    # cwd: ``python -c`` puts the working directory first on sys.path, ahead of PYTHONPATH.
    proc = subprocess.Popen(argv, stdin=slave, stdout=writer, stderr=slave, env=env, cwd=root)
    os.close(slave)
    if writer != slave:
        os.close(writer)
    out = drain(master, reader, on_out)
    rc = proc.wait()
    wall = time.monotonic() - t0
    for home in where.homes:
        shutil.rmtree(home / ".multihost" / "runs" / run, ignore_errors=True)
    shown = out.decode(errors="replace")
    if rc != 0:
        raise RuntimeError(f"multihost rc={rc}: {shown[-800:]}")
    cpu, imported = cpu_file.read_text().split(maxsplit=1)
    if not Path(imported.strip()).is_relative_to(root):
        raise RuntimeError(f"ran {imported.strip()}, not the checkout in {root}")
    return Ran(shown, wall, float(cpu), logs / run)


def run_once(root: Path, where: Where, lines: int, output: str, work: Path) -> Trial:
    """``seq 1 LINES`` on every host; checks what reached stdout and the logs."""
    hosts = where.n
    ran = launch(root, work, where, output, f"seq 1 {lines}")
    check(ran.out, ran.logs, hosts, lines, output)
    return Trial(ran.cpu, ran.wall, os.getloadavg()[0])


# Hosts below FLOODERS print blocks of 5000 lines as fast as they can for 3 s while the last
# host prints 8 time-stamped ticks 0.25 s apart; the others print nothing.
FLOOD = r"""
case $JAX_PROCESS_ID in
LAST) for i in 1 2 3 4 5 6 7 8; do echo "tick $(date +%s.%N)"; sleep 0.25; done ;;
*) [ "$JAX_PROCESS_ID" -lt FLOODERS ] || exit 0
   end=$(($(date +%s) + 3))
   while [ "$(date +%s)" -lt "$end" ]; do seq 1 5000 | sed "s/^/flood /"; done ;;
esac
"""


# a streamed host line ("[s0/w7] tick ..."), not the summary's last-output cell
_TICK = re.compile(rb"\] (?:\x1b\[[0-9;]*m)*tick (\d+\.\d+)\D")


def flood_delays(root: Path, where: Where, flooders: int, output: str, work: Path) -> list[float]:
    """How long after it was printed each of the quiet host's ticks reached stdout, while
    ``flooders`` hosts flood."""
    arrived: list[tuple[float, bytes]] = []
    tail = b""

    def seen(chunk: bytes) -> None:  # cheap (in C): the reader must keep up with a flood
        nonlocal tail
        now = time.time()
        data = tail + chunk
        whole = data.rfind(b"\n") + 1
        arrived.extend((now, m.group(1)) for m in _TICK.finditer(data, 0, whole))
        tail = data[whole:]

    cmd = FLOOD.replace("LAST", str(where.n - 1)).replace("FLOODERS", str(flooders))
    launch(root, work, where, output, cmd, seen)
    if len(arrived) != 8:
        raise RuntimeError(f"{len(arrived)} ticks of 8 reached stdout")
    return [now - float(stamp) for now, stamp in arrived]


def drain(master: int, reader: int, on_out: Callable[[bytes], object]) -> bytes:
    """Read the pty (and the stdout pipe, if another fd) as fast as they come until both end;
    returns what came on ``reader``, the run's stdout."""
    out: list[bytes] = []
    with selectors.DefaultSelector() as sel:
        for fd in {master, reader}:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except OSError:  # EIO: the pty's last writer is gone
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                elif key.fd == reader:
                    out.append(chunk)
                    on_out(chunk)
    return b"".join(out)


_ROW = re.compile(r"\[s0/w(\d+)\] (\d+)")


def check(shown: str, run_dir: Path, hosts: int, lines: int, output: str) -> None:
    """Every host's lines on stdout, complete and in order; logs byte-exact."""
    expected = "".join(f"{n}\n" for n in range(1, lines + 1)).encode()
    for i in range(hosts):
        log = run_dir / f"slice_0000_worker_{i:04d}.log"
        if log.read_bytes() != expected:
            raise RuntimeError(f"{log}: not byte-exact")
    if output == "none":
        return
    if output == "pipe" and "\x1b" in shown:
        raise RuntimeError("escape codes on a pipe")
    seen: dict[int, list[int]] = {i: [] for i in range(hosts)}
    for m in _ROW.finditer(re.sub(r"\x1b\[[0-9;]*m", "", shown)):
        seen[int(m.group(1))].append(int(m.group(2)))
    for i, got in seen.items():
        if got != list(range(1, lines + 1)):
            raise RuntimeError(f"host {i}: {len(got)} lines on stdout, or out of order")


def machine() -> str:
    """CPU, cores, Python, date."""
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "unknown CPU",
    )
    cores = len(os.sched_getaffinity(0))
    return (
        f"{model}, {cores} cores, Python {platform.python_version()}, "
        f"Linux {platform.release()}, {datetime.date.today().isoformat()}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print and record the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--lines", type=int, default=250_000, help="lines per host")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--before", type=Path, default=None, help="another checkout to compare")
    p.add_argument(
        "--before-lines",
        type=int,
        default=25_000,
        help="lines per host for --before (a slow checkout at full size takes "
        "minutes per trial; the cost per line is what is compared)",
    )
    p.add_argument(
        "--ssh",
        action="store_true",
        help="hosts h0.. of the loopback sshd fleet (tests/fleet.py; hold its lock) "
        "instead of --local",
    )
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--section",
        default=None,
        help="the RESULTS.md section to write (default: streaming, or streaming-ssh "
        "with --ssh: the headline tables)",
    )
    args = p.parse_args(argv)
    where = Where.of(args.hosts, args.ssh)
    load_before = os.getloadavg()[0]
    versions = [Version("this branch", ROOT, args.lines)]
    if args.before:
        versions.append(Version("before", args.before, args.before_lines))
    trials: dict[tuple[str, str], list[Trial]] = {
        (v.name, o): [] for v in versions for o in OUTPUTS
    }
    with tempfile.TemporaryDirectory(prefix="streaming-") as tmp:
        for k in range(args.repeat):
            for v in versions:  # interleaved
                for output in OUTPUTS:
                    work = Path(tmp) / f"{k}-{v.name}-{output}".replace(" ", "-")
                    t = run_once(v.root, where, v.lines, output, work)
                    trials[(v.name, output)].append(t)
                    print(
                        f"  {v.name:<12} {output:<4} cpu {t.cpu:7.2f} s  wall {t.wall:7.2f} s"
                        f"  load {t.load:.1f}",
                        flush=True,
                    )
        flood = {
            (o, n): flood_delays(ROOT, where, n, o, Path(tmp) / f"flood-{o}-{n}")
            for o in ("tty", "pipe")
            for n in (1, args.hosts - 1)
        }
    rows = [
        "| version | stdout | lines (hosts × per host) | runner CPU (s): median [trials] "
        "| wall (s) | µs/line, all of the runner | µs/line echoing (− none) | load (1 min) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    per: dict[tuple[str, str], tuple[float, float]] = {}  # (version, output) -> (total, echo)
    for v in versions:
        total = args.hosts * v.lines
        cpu = {o: statistics.median(t.cpu for t in trials[(v.name, o)]) for o in OUTPUTS}
        for output in OUTPUTS:
            ts = trials[(v.name, output)]
            per[(v.name, output)] = (
                cpu[output] / total * 1e6,
                (cpu[output] - cpu["none"]) / total * 1e6,
            )
            shown = f"{per[(v.name, output)][1]:.2f}" if output != "none" else "–"
            rows.append(
                f"| {v.name} | {output} | {args.hosts} × {v.lines:,} | {cpu[output]:.2f} "
                f"[{', '.join(f'{t.cpu:.2f}' for t in ts)}] "
                f"| {statistics.median(t.wall for t in ts):.2f} "
                f"| {per[(v.name, output)][0]:.2f} | {shown} "
                f"| {min(t.load for t in ts):.1f}–{max(t.load for t in ts):.1f} |"
            )
    verdicts = []
    for output in ("tty", "pipe"):
        total, echo = per[("this branch", output)]
        ok = "met" if echo <= TARGET_US else "MISSED"
        line = f"{output}: echoing {echo:.2f} µs/line (≤ {TARGET_US:g}: {ok}), {total:.2f} in all"
        if args.before:
            b_total, b_echo = per[("before", output)]
            if b_total / total >= 2:
                times = f"{b_echo / echo:.0f}× less" if echo >= 0.05 else "now within noise of none"
                ratio = f"echoing {times}, all {b_total / total:.0f}× less"
            else:  # a before of the same speed: the plain ratio
                ratio = f"this / before: echoing {echo / b_echo:.2f}, all {total / b_total:.2f}"
            line += f" (before: {b_echo:.2f} and {b_total:.2f}: {ratio})"
        verdicts.append(line)
    flood_rows = [
        "| stdout | hosts flooding | the quiet host's 8 ticks: delay (s), max [all] |",
        "|---|---:|---|",
        *(
            f"| {o} | {n} of {args.hosts} | {max(d):.3f} [{', '.join(f'{x:.3f}' for x in d)}] |"
            for (o, n), d in flood.items()
        ),
    ]
    worst = max(max(d) for (_, n), d in flood.items() if n == 1)
    verdicts.append(
        f"a flooding host delays another host's line by at most {worst:.2f} s "
        f"(≤ 1: {'met' if worst <= 1 else 'MISSED'})"
    )
    before = f" --before {args.before} --before-lines {args.before_lines}" if args.before else ""
    name = args.section or (SSH_SECTION if args.ssh else SECTION)
    begin, end = markers(name)
    hosts = f"--local {args.hosts}" if not args.ssh else f"--hosts h0..h{args.hosts - 1}"
    text = "\n".join(
        [
            begin,
            "## Streaming: runner CPU per line of host output echoed (benchmarks/streaming.py"
            + (" --ssh: over SSH, the loopback sshd fleet)" if args.ssh else ")")
            + (f" ({args.section})" if args.section else ""),
            "",
            f"Machine: {machine()}; load average before/after: {load_before:.1f} / "
            f"{os.getloadavg()[0]:.1f} (the machine is shared).",
            "",
            f"`multihost run {hosts} --stream all --cmd 'seq 1 N'` with stderr on a "
            "pseudo-terminal (the live status line) and stdout on it (*tty*) or on a pipe "
            "(*pipe*), read as fast as it comes; *none*: `--stream none` on the terminal (the "
            "logs are written, nothing echoed). *runner CPU*: user+sys of the multihost process "
            "itself (getrusage at its exit; the hosts' `seq` and `tail` not counted). *echoing*: "
            "(CPU − CPU of none) / lines. Medians of the trials, versions and modes interleaved. "
            "Every trial checks that each host's lines reached stdout complete and in order, and "
            "that every log file is byte-exact.",
            "",
            f"Command: `python benchmarks/streaming.py --hosts {args.hosts} --lines {args.lines} "
            f"--repeat {args.repeat}{before}{' --ssh' if args.ssh else ''}"
            + (f" --section {args.section}" if args.section else "")
            + "`",
            "",
            *rows,
            "",
            "Flooding: hosts print blocks of `seq 1 5000 | sed 's/^/flood /'` as fast as they can "
            "for 3 s while the last host prints 8 lines stamped with the time (`date "
            "+%s.%N`) 0.25 s "
            "apart; delay: when a tick reached stdout here minus its stamp (this branch only). "
            f"With {args.hosts - 1} flooders, their {3 * (args.hosts - 1)} processes (seq, sed, "
            "tail) share the machine's cores with the runner and the ticking host: a stress case "
            "beyond the goal's one flooding host.",
            "",
            *flood_rows,
            "",
            "Goal (≤ 5 µs of runner CPU per echoed line): " + "; ".join(verdicts) + ".",
            end,
        ]
    )
    print(text)
    if not args.no_write:
        write_section(name, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
