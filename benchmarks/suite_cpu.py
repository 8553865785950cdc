"""Test-suite CPU: the user+sys CPU seconds a pytest selection costs, everything it starts
counted (the sshd fleet's sessions and the jobs on its hosts, the stand-in cloud's servers, the
real gcloud CLI, multi-process JAX), per selection and per test.

CPU time, not wall time: the machine is shared, and CPU time is what another process's load
changes least. This process makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) and
takes this checkout's test fleet down first, so the session's own fleet (started by the
``ssh_fleet`` fixture) and every process that leaves its parent behind end up reaped here: the
total is ``RUSAGE_CHILDREN`` after the last of them. Per test, a plugin in the pytest process
sums utime+stime+cutime+cstime of every live process under this one (zombies included) before
and after each test's setup, call and teardown; a process that exits in between lands in its
parent's cutime, so nothing is lost or counted twice (module and session fixtures count on the
first test that asks for them). What the measuring costs the pytest process (those /proc walks,
about 10 ms a test) is taken off. The plugin also counts each test's runs of gcloud (one log
file each in the gcloud config dirs the test's gcloud calls use: the stand-in cloud's, the
fleet hosts', any under the test's tmp_path).

Usage: ``python benchmarks/suite_cpu.py [--repeat N] [--top 15] [--write NAME] -- SELECTION``
where SELECTION is pytest's arguments (test files, ``-k``, ``-m``); each ``--sel 'ARGS'`` adds
another selection measured in turn. ``--write NAME`` puts the table in benchmarks/RESULTS.md
under its own section (NAME tells the before and after apart).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import markers, write_section  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36
_TICK = os.sysconf("SC_CLK_TCK")
_ENV_TOP = "MULTIHOST_SUITE_CPU_TOP"  # the subreaper's pid: the plugin sums the tree under it
_ENV_LOG = "MULTIHOST_SUITE_CPU_LOG"  # where the plugin appends one JSON line per test


# ---------------------------------------------------------------- the pytest plugin


def _tree_cpu(top: int) -> float:
    """utime+stime+cutime+cstime (seconds) of every process under ``top``, and ``top``'s
    cutime+cstime: the orphans it reaped (its own CPU is the measuring's, not the tests')."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(name)
        parent[pid] = int(fields[1])
        first = 13 if pid == top else 11  # utime, stime, cutime, cstime; top: the last two
        cpu[pid] = sum(int(x) for x in fields[first:15]) / _TICK
    total = 0.0
    for pid, ticks in cpu.items():
        p = pid
        while p > 1 and p != top:
            p = parent.get(p, 0)
        if p == top:
            total += ticks
    return total


def _own_cpu() -> float:
    """CPU this pytest process used itself, at a finer grain than /proc's clock ticks."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _gcloud_dirs(item: Any) -> list[Path]:
    """The gcloud config dirs a test's gcloud calls log to: the stand-in cloud's (the runner's,
    from the ``cloud`` fixture's env), the fleet's hosts' (tests/cloud/fixture.py) and any
    under the test's own tmp_path."""
    dirs: list[Path] = []
    funcargs = getattr(item, "funcargs", None) or {}
    for value in funcargs.values():
        env = getattr(value, "env", None)
        if isinstance(env, dict) and env.get("CLOUDSDK_CONFIG"):
            dirs.append(Path(env["CLOUDSDK_CONFIG"]))
    prefix = os.environ.get("MULTIHOST_FLEET_USER", "mhw")
    dirs += Path("/tmp").glob(f"multihost-cloud-{prefix}[0-9]*/gcloud*")
    tmp = funcargs.get("tmp_path")
    if isinstance(tmp, Path):
        dirs += [p.parent for p in tmp.rglob("logs") if (p.parent / "active_config").exists()]
    return sorted(set(dirs))  # ``cloud`` and ``cloud_plane`` are one stand-in


def _gcloud_calls(dirs: list[Path], since: float) -> dict[str, int]:
    """gcloud invocations (one log file each) written since ``since``, by command."""
    calls: dict[str, int] = {}
    for d in dirs:
        for path in d.glob("logs/*/*.log"):
            try:
                if path.stat().st_mtime < since:
                    continue
                with open(path, errors="replace") as f:
                    text = f.read(20000)
            except OSError:
                continue
            i = text.find("Running [")
            name = text[i + 9 : text.find("]", i)] if i >= 0 else "?"
            calls[name] = calls.get(name, 0) + 1
    return calls


try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
        top = int(os.environ.get(_ENV_TOP, "0"))
        log = os.environ.get(_ENV_LOG)
        if not top or not log:
            yield
            return
        spent = time.process_time()
        tree0, own0, wall0 = _tree_cpu(top), _own_cpu(), time.monotonic()
        item._suite_cpu_t0 = time.time()
        item._suite_cpu_spent = time.process_time() - spent
        yield
        spent = time.process_time()
        tree1, own1, wall1 = _tree_cpu(top), _own_cpu(), time.monotonic()
        calls: dict[str, int] = getattr(item, "_suite_cpu_gcloud", {})
        # what measuring cost this process, taken off (the /proc walks and the gcloud count)
        overhead = item._suite_cpu_spent + time.process_time() - spent
        with open(log, "a") as f:
            f.write(
                json.dumps(
                    {
                        "test": item.nodeid,
                        "cpu": round(tree1 - tree0 - overhead, 3),
                        "runner": round(own1 - own0 - overhead, 3),
                        "overhead": round(overhead, 4),
                        "wall": round(wall1 - wall0, 3),
                        "gcloud": sum(calls.values()),
                        "gcloud_by_command": calls,
                    }
                )
                + "\n"
            )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item: Any) -> Generator[None, None, None]:
        # counted before the teardown: it drops the fixtures, and the last test of a session
        # takes the stand-in cloud's gcloud config dir with it
        since = getattr(item, "_suite_cpu_t0", None)
        if since is not None:
            spent = time.process_time()
            item._suite_cpu_gcloud = _gcloud_calls(_gcloud_dirs(item), since)
            item._suite_cpu_spent += time.process_time() - spent
        yield

except ImportError:  # the plugin needs pytest; the driver below does not
    pass


# ---------------------------------------------------------------- the driver


def _reap_all(main_pid: int, grace: float) -> tuple[int, list[str]]:
    """Reap every child until none is left; once ``main_pid`` has exited, what is still alive
    after ``grace`` seconds is named and killed. Returns main's exit code and the leftovers."""
    code = -1
    deadline: float | None = None
    leftovers: list[str] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code, leftovers
        if pid == main_pid:
            code = os.waitstatus_to_exitcode(status)
            deadline = time.monotonic() + grace
        if pid:
            continue
        if deadline is not None and time.monotonic() > deadline:
            for child in _children():
                leftovers.append(f"{child}: {_cmdline(child)}")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 60
        time.sleep(0.05)


def _children() -> list[int]:
    me = str(os.getpid())
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2 :].split()[1] == me:
                kids.append(int(name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(selection: Sequence[str], scratch: Path) -> dict[str, Any]:
    """One pytest run of ``selection``: total CPU, wall, exit code, and per-test CPU."""
    from tests import fleet

    fleet.down()  # the session starts (and stops) its own fleet, under this subreaper
    log = scratch / f"tests-{time.monotonic_ns()}.jsonl"
    env = {
        **os.environ,
        _ENV_TOP: str(os.getpid()),
        _ENV_LOG: str(log),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    before = _children_cpu()
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "benchmarks.suite_cpu", "-q", *selection],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    tail: list[str] = []

    def read(out: IO[bytes]) -> None:
        for raw in out:
            tail[:] = [*tail[-40:], raw.decode(errors="replace").rstrip()]

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    # Reaped as they exit, not at the end: an orphan left a zombie here would still look
    # alive to a test (or to multihost) that waits for it to be gone.
    code, leftovers = _reap_all(proc.pid, grace=10)
    reader.join(timeout=10)
    proc.returncode = code
    wall = time.monotonic() - start
    tests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    overhead = sum(t.get("overhead", 0.0) for t in tests)
    return {
        "selection": selection,
        "cpu": _children_cpu() - before - overhead,
        "overhead": overhead,
        "wall": wall,
        "code": code,
        "load": max(load0, os.getloadavg()[0]),
        "tests": tests,
        "leftovers": leftovers,
        "tail": tail,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--top", type=int, default=15, help="the costliest tests to list")
    p.add_argument("--sel", action="append", default=[], help="one more selection (quoted)")
    p.add_argument("--write", metavar="NAME", help="record the table in benchmarks/RESULTS.md")
    p.add_argument("--json", type=Path, help="also dump every run's numbers here")
    p.add_argument("selection", nargs="*")
    args = p.parse_args(argv)
    selections = [shlex.split(s) for s in args.sel]
    if args.selection:
        selections.insert(0, args.selection)
    if not selections:
        p.error("nothing to measure: give pytest arguments after --, or --sel")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno() or errno.EPERM))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="multihost-suite-cpu-") as tmp:
        for _ in range(args.repeat):
            for sel in selections:
                run = measure(sel, Path(tmp))
                runs.append(run)
                print(
                    f"{' '.join(sel)}: exit {run['code']}, CPU {run['cpu']:.1f} s "
                    f"(measuring: {run['overhead']:.1f} s more), wall {run['wall']:.1f} s, "
                    f"load {run['load']:.1f}",
                    file=sys.stderr,
                )
                if run["code"] != 0:
                    print("\n".join(run["tail"]), file=sys.stderr)
                for left in run["leftovers"]:
                    print(f"  left running, killed: {left}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    rows = [
        "| selection | CPU (s): median | min | wall (s): median | tests | exit |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for sel in selections:
        mine = [r for r in runs if r["selection"] == sel]
        cpus = [r["cpu"] for r in mine]
        rows.append(
            f"| `{' '.join(sel)}` | {statistics.median(cpus):.1f} | {min(cpus):.1f} | "
            f"{statistics.median(r['wall'] for r in mine):.1f} | {len(mine[0]['tests'])} | "
            f"{','.join(str(r['code']) for r in mine)} |"
        )
    per_test: dict[str, list[float]] = {}
    calls: dict[str, list[int]] = {}
    for r in runs:
        for t in r["tests"]:
            per_test.setdefault(t["test"], []).append(t["cpu"])
            calls.setdefault(t["test"], []).append(t.get("gcloud", 0))
    costly = sorted(per_test.items(), key=lambda kv: -statistics.median(kv[1]))[: args.top]
    rows += [
        "",
        "| test (setup+call+teardown) | CPU (s): median | gcloud calls: median |",
        "|---|---:|---:|",
    ]
    rows += [
        f"| `{name}` | {statistics.median(c):.2f} | {statistics.median(calls[name]):g} |"
        for name, c in costly
    ]
    loads = [r["load"] for r in runs]
    command = "python benchmarks/suite_cpu.py " + " ".join(
        [f"--repeat {args.repeat}"] + [f"--sel {shlex.quote(' '.join(s))}" for s in selections]
    )
    text = "\n".join(
        [
            f"Machine: {platform.processor() or platform.machine()}, "
            f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d')}; load average up to {max(loads):.1f} (shared "
            "machine: wall time is not the measure). CPU = user+sys of pytest and everything "
            "it started, the fleet's sshds and their sessions included.",
            "",
            f"Command: `{command}`",
            "",
            *rows,
        ]
    )
    print(text)
    if args.write:
        begin, end = markers(f"suite-cpu-{args.write}")
        title = f"## Test suite CPU: {args.write} (benchmarks/suite_cpu.py)"
        write_section(f"suite-cpu-{args.write}", "\n".join([begin, title, "", text, end]))
    return 0 if all(r["code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
