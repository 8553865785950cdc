"""Start-up CPU benchmark: the user+sys CPU seconds of a fresh process for ``python -c
"import asyncssh"`` (the floor a run cannot go under), ``multihost --version`` and a one-host
``multihost run --cmd true`` (``--local 1``, and over SSH with ``--ssh-config FILE --hosts H``).

CPU time, not wall time: the machine is shared, and CPU time is what another process's load
changes least. Each command runs ``--repeat`` times (interleaved, this checkout first on
``PYTHONPATH``; ``--before DIR``: another checkout too); the table keeps the minimum and the
median. Writes its section of benchmarks/RESULTS.md. Usage:
``python benchmarks/startup_cpu.py [--repeat 9] [--before DIR] [--ssh-config F --hosts H]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402

SECTION = "startup-cpu"


def commands(ssh_config: Path | None, hosts: str | None) -> dict[str, list[str]]:
    cmds = {
        'python -c "import asyncssh"': ["-c", "import asyncssh"],
        "multihost --version": ["-m", "multihost", "--version"],
        "multihost run --local 1 --cmd true": [
            "-m",
            "multihost",
            "run",
            "--local",
            "1",
            "--cmd",
            "true",
        ],
    }
    if ssh_config and hosts:
        cmds[f"multihost run --hosts {hosts} --ssh-config … --cmd true"] = [
            "-m",
            "multihost",
            "run",
            "--hosts",
            hosts,
            "--ssh-config",
            str(ssh_config),
            "--cmd",
            "true",
        ]
    return cmds


def cpu(root: Path, args: Sequence[str], scratch: Path) -> float:
    """User+sys CPU seconds of one fresh ``python ARGS`` (and its children) with ``root``
    first on the path; byte-compiled code is written and used, as an installed package's is.
    It runs in ``scratch/code`` (one small file to stage) with ``scratch/home`` as HOME."""
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else str(root),
        "HOME": str(scratch / "home"),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=env,
        cwd=scratch / "code",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)}: exit {os.waitstatus_to_exitcode(status)}")
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print and record the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--before", type=Path, default=None, help="another checkout to compare")
    p.add_argument("--ssh-config", type=Path, default=None)
    p.add_argument("--hosts", default=None, help="one host of --ssh-config")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    cmds = commands(args.ssh_config, args.hosts)
    versions = {"this checkout": ROOT}
    if args.before:
        versions["before"] = args.before.resolve()
    for root in versions.values():  # compile once, outside the measurement
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(root / "multihost")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    times: dict[tuple[str, str], list[float]] = {(v, c): [] for v in versions for c in cmds}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="multihost-startup-") as tmp:
        scratch = Path(tmp)
        (scratch / "home").mkdir()
        (scratch / "code").mkdir()
        (scratch / "code" / "x.txt").write_text("x\n")
        for _ in range(args.repeat):
            for cmd, cargs in cmds.items():  # interleaved: each command, each version in turn
                for v, root in versions.items():
                    times[(v, cmd)].append(cpu(root, cargs, scratch))
            loads.append(os.getloadavg()[0])
    floor = 'python -c "import asyncssh"'
    rows = [
        "| version | command | CPU (s): min | median | min − import asyncssh (s) |",
        "|---|---|---:|---:|---:|",
    ]
    for v in versions:
        for cmd in cmds:
            ts = times[(v, cmd)]
            extra = min(ts) - min(times[(v, floor)])
            rows.append(
                f"| {v} | `{cmd}` | {min(ts):.3f} | {statistics.median(ts):.3f} | {extra:+.3f} |"
            )
    begin, end = markers(SECTION)
    before = f" --before {args.before}" if args.before else ""
    ssh = " --ssh-config FILE --hosts H" if args.ssh_config else ""
    text = "\n".join(
        [
            begin,
            "## Start-up CPU: a one-host run against `import asyncssh` (benchmarks/startup_cpu.py)",
            "",
            f"Machine: {platform.processor() or platform.machine()}, "
            f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d')}; load average {min(loads):.1f}–{max(loads):.1f} "
            "(the machine is shared). CPU = user+sys of the process and its children "
            "(`os.wait4`), byte-compiled code.",
            "",
            f"Command: `python benchmarks/startup_cpu.py --repeat {args.repeat}{before}{ssh}`",
            "",
            *rows,
            end,
        ]
    )
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
