"""The pytest plugin of benchmarks/suite_cpu.py (``-p suite_cpu_plugin``): one JSON line per
test with the CPU it cost, everything it started counted, and its runs of gcloud.

Per test it sums utime+stime+cutime+cstime of every live process under the driver (zombies
included, and the driver's own cutime+cstime: the orphans it reaped) before and after the test's
setup, call and teardown; a process that exits in between lands in its parent's cutime, so
nothing is lost or counted twice (module and session fixtures count on the first test that asks
for them). What the measuring costs this process (those /proc walks, about 10 ms a test) is
taken off. gcloud runs are counted by their log files (one each) in the config dirs the test's
gcloud calls use: the stand-in cloud's, the fleet hosts', any under the test's tmp_path.

Self-contained (it changes no import path): the driver puts benchmarks/ last on PYTHONPATH, so
a run of another checkout's tests imports that checkout's multihost and tests, not this one's.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

ENV_TOP = "MULTIHOST_SUITE_CPU_TOP"  # the driver's pid: the plugin sums the tree under it
ENV_LOG = "MULTIHOST_SUITE_CPU_LOG"  # where the plugin appends one JSON line per test
_TICK = os.sysconf("SC_CLK_TCK")


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
    top = int(os.environ.get(ENV_TOP, "0"))
    log = os.environ.get(ENV_LOG)
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
