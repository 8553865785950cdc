"""``multihost top``, ``run --gather`` and ``plot`` on one real multi-process JAX job (``--local
4``, CPU) in which process 2 sleeps before each of its steps: ``top --once --json`` names it
the straggler; a process stopped with SIGSTOP is marked stuck, and stepping again once it goes
on; ``top`` leaves on ``q`` and on Ctrl-C under a pty without touching the run; the run's own
output comes grouped as it runs; the picture is drawn from the same run; nothing is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest

import multihost
from tests.clitools import REPO, cli
from tests.helpers import free_port, wait_for

pytestmark = [pytest.mark.jax, pytest.mark.slow]
N, SLOW = 4, 2

# The job: every process steps together (a sharded step: its collectives end together);
# process SLOW_PROCESS sleeps 0.2 s before each step. Every 10 steps process 0 says whether
# the stop file is there (one collective decision: no process leaves while the others wait).
SLOWHOST = """\
import os, time
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

slow = int(os.environ["SLOW_PROCESS"])
stop = os.environ["STOP_FILE"]
mesh = Mesh(jax.devices(), ("d",))
rows = 64 * len(jax.devices())
x = jax.make_array_from_callback(
    (rows, 64), NamedSharding(mesh, P("d")), lambda index: jnp.ones((64, 64))
)
step = jax.jit(lambda x: (jnp.tanh(x) * 1.0001, jnp.tanh(x).sum()))
i = 0
while True:
    if i % 10 == 0:
        flag = jnp.array(os.path.exists(stop) if jax.process_index() == 0 else False)
        if bool(multihost_utils.broadcast_one_to_all(flag)):
            break
    if jax.process_index() == slow:
        time.sleep(0.2)  # the straggler's own time, before its step
    x, loss = step(x)
    print(f"step {i} loss {float(loss):.2f}", flush=True)
    i += 1
print("steps done", i, flush=True)
"""


@dataclass
class Job:
    home: Path
    logs: Path
    stop: Path
    proc: subprocess.Popen[str]
    out: Path
    err: Path


def _top(job: Job) -> dict[str, Any]:
    res = cli(["top", "topj", "--log-dir", str(job.logs), "--json"], HOME=str(job.home))
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def _rows(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in data["hosts"]}


@contextlib.contextmanager
def _home(job: Job) -> Iterator[None]:
    """The API in this process, with the job's HOME (where its --local hosts live)."""
    was = os.environ["HOME"]
    os.environ["HOME"] = str(job.home)
    try:
        yield
    finally:
        os.environ["HOME"] = was


def _python_pid(job: Job, worker: int) -> int:
    """Process ``worker``'s JAX process, as its hook names it (its watch file)."""
    hook = job.home / ".cache/multihost/local" / f"w{worker}" / "runs/topj/hook"
    (watch,) = hook.glob("*.watch")
    return int(watch.name.split(".")[0])


def _groups_left(job: Job) -> list[int]:
    alive = []
    for i in range(N):
        pid_file = job.home / ".cache/multihost/local" / f"w{i}" / "runs/topj/pid"
        pgid = int(pid_file.read_text())
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    state, _, group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                except (OSError, IndexError, ValueError):
                    continue
                if int(group) == pgid and state != "Z":
                    alive.append(pgid)
                    break
    return alive


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    base = tmp_path_factory.mktemp("top")
    home, code, logs = base / "home", base / "code", base / "logs"
    home.mkdir()
    code.mkdir()
    (code / "slowhost.py").write_text(SLOWHOST)
    out, err = base / "out", base / "err"
    args = [
        "run",
        "--local",
        str(N),
        "--gather",
        "--run-name",
        "topj",
        "--log-dir",
        str(logs),
        "--script-dir",
        str(code),
        "--coordinator-port",
        str(free_port()),
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        f"SLOW_PROCESS={SLOW}",
        "--env",
        f"STOP_FILE={base / 'stop'}",
        "--cmd",
        "python slowhost.py",
    ]
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multihost", *args],
            stdout=o,
            stderr=e,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "HOME": str(home), "COLUMNS": "200"},
        )
    found = Job(home, logs, base / "stop", proc, out, err)
    try:
        wait_for(lambda: (logs / "topj" / "run.json").is_file(), 60, "the run's record")
        yield found
    finally:
        found.stop.touch()
        try:
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_top_names_the_host_that_waits_least(job: Job) -> None:
    def stepping() -> dict[str, Any] | None:
        data = _top(job)
        rows = _rows(data).values()
        ok = all(r["state"] == "stepping" and (r["steps"] or 0) >= 8 for r in rows)
        return data if ok and len(data["hosts"]) == N else None

    data = wait_for(stepping, 240, "every host stepping")
    rows = _rows(data)
    assert data["straggler"] == f"s0/w{SLOW}", data
    assert data["stuck"] == []
    assert [name for name, r in rows.items() if r["slow"]] == [f"s0/w{SLOW}"]
    slow = rows[f"s0/w{SLOW}"]
    others = [r for name, r in rows.items() if name != f"s0/w{SLOW}"]
    assert slow["own_s"] >= 0.15  # its sleep
    assert all(r["own_s"] < 0.05 for r in others)  # they wait for it
    steps = [r["median_step_s"] for r in rows.values()]
    assert max(steps) - min(steps) < 0.05  # in SPMD every host's step ends together
    assert all(r["rss_bytes"] > 10 << 20 and r["mem_available_bytes"] for r in rows.values())
    assert all(r["cpu_pct"] is not None and r["accelerator"] is None for r in rows.values())
    assert data["notes"][0] == "no accelerator figures on CPU hosts"
    assert all(r["last_line"].startswith("step ") for r in rows.values())
    with _home(job):
        snap = multihost.top("topj", log_dir=job.logs)  # the API: the same, as records
    assert snap.straggler is not None
    assert snap.straggler.name == f"s0/w{SLOW}"


def _screen(job: Job) -> pexpect.spawn:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "150",
        "LINES": "30",
        "TERM": "xterm-256color",
        "HOME": str(job.home),
    }
    return pexpect.spawn(
        sys.executable,
        ["-m", "multihost", "top", "topj", "--log-dir", str(job.logs), "--interval", "1"],
        env=env,
        dimensions=(30, 150),
        timeout=60,
        encoding="utf-8",
    )


@pytest.mark.parametrize("leave", ["q", "ctrl-c"])
def test_top_leaves_on_q_and_ctrl_c_and_the_run_goes_on(job: Job, leave: str) -> None:
    before = _top(job)
    child = _screen(job)
    child.expect(f"straggler: s0/w{SLOW}")
    child.expect("q: quit")
    if leave == "q":
        child.send("q")
    else:
        child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert "\x1b[?1049l" in (child.before or "")  # the terminal's own screen back
    assert job.proc.poll() is None  # the run goes on

    def further() -> bool:
        now = _rows(_top(job))
        return all(now[h]["steps"] > r["steps"] for h, r in _rows(before).items() if r["steps"])

    wait_for(further, 60, "every host stepping on after top left")


def test_a_stopped_process_is_stuck_and_steps_again(job: Job) -> None:
    pid = _python_pid(job, 1)
    os.kill(pid, signal.SIGSTOP)
    try:

        def stuck() -> dict[str, Any] | None:
            # the others wait for it in their next collective: stuck too, and waiting
            data = _top(job)
            return data if len(data["stuck"]) == N else None

        data = wait_for(stuck, 60, "every host marked stuck")
        rows = _rows(data)
        assert rows["s0/w1"]["state"] == "stopped"
        assert "SIGSTOP" in rows["s0/w1"]["detail"]
        assert all("waiting for results" in rows[f"s0/w{i}"]["detail"] for i in range(N) if i != 1)
        assert any("multihost stack topj" in n for n in data["notes"])
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not _top(job)["stuck"], 60, "every host stepping again")


def test_the_grouped_output_and_the_picture_of_the_same_run(job: Job) -> None:
    job.stop.touch()
    assert job.proc.wait(timeout=120) == 0, job.err.read_text()
    lines = job.out.read_text().splitlines()
    grouped = [line for line in lines if line.startswith("[s0/w0-3] step ")]
    assert len(grouped) >= 20, lines[:40]
    assert not any(line.startswith("[s0/w0] step ") for line in lines), lines[:40]
    assert sum(line.startswith("[s0/w0-3] steps done") for line in lines) == 1
    err = job.err.read_text()
    assert f"all {N} hosts succeeded" in err
    assert f"multihost plot topj --log-dir {job.logs}" in err  # the summary offers the picture
    res = cli(["plot", "topj", "--log-dir", str(job.logs)], HOME=str(job.home))
    assert res.returncode == 0, res.stderr
    png = Path(res.stdout.strip())
    assert png == job.logs / "topj" / "steps.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{N} host(s)" in res.stderr
    with _home(job):
        again = multihost.plot("topj", log_dir=job.logs, out=job.logs / "again.png")
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = _top(job)
    assert {r["state"] for r in done["hosts"]} == {"done"}
    wait_for(lambda: not _groups_left(job), 30, "no process of the run left")
