"""``multihost sandbox``: how long ``up`` and ``down`` take, and the memory it holds while up.

Each trial runs ``multihost sandbox up --hosts N`` (wall time, the CLI's own start included),
reads the private memory (``RssAnon``) of every process of the sandbox (its background
process, fake-gcs-server, each host's init and sshd) from /proc, then ``multihost sandbox
down``. It runs as a user who is not root, as a new user would: ``--user NAME``, or (as root)
a throwaway user made for the run and removed after (``$MULTIHOST_FLEET_USER`` + ``bench``),
with this checkout and the venv's packages on its PYTHONPATH. Writes its section of
benchmarks/RESULTS.md. Usage: ``python benchmarks/sandbox.py [--hosts 1,8,32] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pwd
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402
from multihost.sandbox import procs  # noqa: E402

SECTION = "sandbox"
PARTS = ("background process", "fake-gcs-server", "host inits", "sshds")


@contextmanager
def throwaway_user() -> Iterator[str]:
    name = os.environ.get("MULTIHOST_FLEET_USER", "mhw") + "bench"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "-m", "-p", "*", "-s", "/bin/bash", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)


def shell(user: str, python: str, script: str) -> subprocess.CompletedProcess[str]:
    home = pwd.getpwnam(user).pw_dir
    env = {
        "HOME": home,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": f"{ROOT}:{sysconfig.get_paths()['purelib']}",
    }
    argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-c", f"cd && {script}"]
    if pwd.getpwuid(os.getuid()).pw_name != user:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/")


def python_for(user: str) -> str:
    """A Python of this one's version that ``user`` may run (the venv's may be root's alone)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", "/usr/bin/python3"):
        ran = shell(user, candidate, f"{candidate} -c 'import sys; print(sys.version)'")
        if ran.returncode == 0 and ran.stdout.startswith(version + "."):
            return candidate
    raise SystemExit(f"no Python {version} that {user} may run")


def private_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def memory(user: str) -> dict[str, float]:
    """MB of private memory per part of the sandbox that is up."""
    state = Path(pwd.getpwnam(user).pw_dir) / ".local/state/multihost/sandbox"
    serve = int((state / "pid").read_text())
    parts = dict.fromkeys(PARTS, 0.0)
    for pid in {serve} | procs.below([serve]):
        argv = procs.cmdline(pid)
        kind = (
            "background process"
            if pid == serve
            else "fake-gcs-server"
            if "fake-gcs-server" in " ".join(argv[:1])
            else "host inits"
            if any(a.endswith("vminit.py") for a in argv)
            else "sshds"
        )
        parts[kind] += private_kib(pid) / 1024
    return parts


def trial(user: str, python: str, hosts: int) -> tuple[float, float, dict[str, float]]:
    cli = f"{python} -m multihost sandbox"
    t0 = time.monotonic()
    up = shell(user, python, f"{cli} up --hosts {hosts}")
    t_up = time.monotonic() - t0
    if up.returncode != 0:
        raise SystemExit(up.stderr)
    mem = memory(user)
    t0 = time.monotonic()
    down = shell(user, python, f"{cli} down")
    t_down = time.monotonic() - t0
    if down.returncode != 0:
        raise SystemExit(down.stderr)
    return t_up, t_down, mem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,8,32", help="host counts (default 1,8,32)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--user", help="run as this user (default: a throwaway one, as root)")
    args = parser.parse_args()
    counts = [int(n) for n in args.hosts.split(",")]
    load = [os.getloadavg()[0]]
    with throwaway_user() if args.user is None else _given(args.user) as user:
        python = python_for(user)
        asked = "import platform; print(platform.python_version())"
        version = shell(user, python, f'{python} -c "{asked}"')
        floor = []
        for _ in range(args.repeat):  # the CLI's own start: a command that does nothing
            t0 = time.monotonic()
            shell(user, python, f"{python} -m multihost --version")
            floor.append(time.monotonic() - t0)
        rows = []
        for n in counts:
            ups, downs, mems = [], [], []
            for _ in range(args.repeat):
                t_up, t_down, mem = trial(user, python, n)
                ups.append(t_up)
                downs.append(t_down)
                mems.append(mem)
            mem = {p: statistics.median(m[p] for m in mems) for p in PARTS}
            rows.append((n, ups, downs, mem))
            print(n, f"up {statistics.median(ups):.2f} s", f"down {statistics.median(downs):.2f}")
    load.append(os.getloadavg()[0])
    begin, end = markers(SECTION)
    lines = [
        begin,
        "## The sandbox: `multihost sandbox up` and `down` (benchmarks/sandbox.py)",
        "",
        f"Machine: {os.cpu_count()} cores shared with other work, Python "
        f"{version.stdout.strip()}, {datetime.date.today()}; load average before/after "
        f"{load[0]:.1f} / {load[1]:.1f}. As a user who is not root; wall time of each command, "
        "the CLI's own start included (`multihost --version` takes "
        f"{statistics.median(floor):.2f} s here); private memory (RssAnon) of the sandbox's "
        "processes while up, in MB. Medians of the trials (min–max).",
        "",
        f"Command: `python benchmarks/sandbox.py --hosts {args.hosts} --repeat {args.repeat}`",
        "",
        "| hosts | trials | up (s) | down (s) | memory (MB) | "
        + " | ".join(f"{p} (MB)" for p in PARTS)
        + " |",
        "|---:|---:|---|---|---:|" + "---:|" * len(PARTS),
    ]
    for n, ups, downs, mem in rows:
        spread = f"{statistics.median(ups):.2f} ({min(ups):.2f}–{max(ups):.2f})"
        down = f"{statistics.median(downs):.2f} ({min(downs):.2f}–{max(downs):.2f})"
        parts = " | ".join(f"{mem[p]:.0f}" for p in PARTS)
        lines.append(
            f"| {n} | {len(ups)} | {spread} | {down} | {sum(mem.values()):.0f} | {parts} |"
        )
    lines.append(end)
    block = "\n".join(lines)
    print(block)
    write_section(SECTION, block)
    return 0


@contextmanager
def _given(name: str) -> Iterator[str]:
    yield name


if __name__ == "__main__":
    sys.exit(main())
