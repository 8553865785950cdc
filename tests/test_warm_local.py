"""Warm processes over ``--local``, with real multi-process JAX on CPU: a session's calls and
scripts in the same processes (the job joined once, jit caches kept, memory flat), pieces that
raise, exit, end their process or hang, a warm sweep through the CLI, Ctrl-C in its middle and
its runner killed. What is left behind is read from /proc, not from the runner's word."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

import multihost
from tests.clitools import cli, spawn
from tests.helpers import wait_for

pytestmark = pytest.mark.jax
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # local workers cannot import tests

CPU = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}
HELPER = """\
import jax

@jax.jit
def double(x):
    return x * 2
"""
STEP = """\
import json, os, sys
import jax, jax.numpy as jnp
import helper

jax.distributed.initialize()  # the program's own: a no-op in a warm process, joined already
jax.distributed.shutdown()  # a no-op too: the job outlives the piece
kept = jnp.ones((256, 256)) * jax.process_index()  # dropped with the script's namespace
out = helper.double(jnp.arange(4.0))
print("devices", jax.device_count(), "cache", helper.double._cache_size(), "argv", sys.argv[1:])
if "--exit" in sys.argv:
    sys.exit(int(sys.argv[-1]))
if "--raise" in sys.argv:
    raise ValueError("bad point")
if jax.process_index() == 0:
    print("MULTIHOST_RESULT " + json.dumps({"pid": os.getpid(), "sum": float(out.sum())}))
"""


@pytest.fixture
def home(tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    (code / "helper.py").write_text(HELPER)
    (code / "step.py").write_text(STEP)
    return h


def leftovers(home: Path) -> list[str]:
    """Every process but this one started with ``home`` as its HOME (what a local worker, its
    wrapper, its warm process and its channel all inherit), as ``pid: command line``."""
    mark = f"HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def _log(result: multihost.RunResult, pid: int) -> str:
    log = result.hosts[pid].log
    assert log is not None
    return log.read_text()


def _stats() -> tuple[int, int, int]:
    import gc

    import jax

    gc.collect()
    arrays = jax.live_arrays()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return len(arrays), sum(a.nbytes for a in arrays), rss * 1024


def test_a_session_runs_every_piece_in_the_same_processes(home: Path, code: Path) -> None:
    with multihost.session(local=2, script_dir=code, env=CPU, stream="none", grace=2) as s:
        pids = s.call(os.getpid)
        assert len(set(pids)) == 2
        assert s.call(lambda x: x + int(os.environ["JAX_PROCESS_ID"]), 10) == [10, 11]

        first = s.run_script("step.py", "a")
        assert first.ok, first
        assert "devices 4 cache 1 argv ['a']" in _log(first, 1)  # one JAX job of 2 processes
        assert first.result() == {"pid": pids[0], "sum": 12.0}
        again = s.run_script("step.py", "b")
        assert "devices 4 cache 1 argv ['b']" in _log(again, 0)  # compiled once, kept

        code3 = s.run_script("step.py", "--exit", "3")  # SystemExit honoured, per host
        assert [h.exit_code for h in code3.hosts] == [3, 3]
        assert code3.first_failure is not None
        assert code3.first_failure.endswith("exited with code 3")
        raised = s.run_script("step.py", "--raise")  # fails alone, with its traceback
        assert not raised.ok
        assert raised.first_failure is not None
        assert "raised ValueError: bad point" in raised.first_failure
        text = _log(raised, 0)
        assert 'step.py", line 13, in <module>' in text
        assert "ValueError: bad point" in text
        assert "warm_server.py" not in text
        assert "runpy" not in text

        def boom() -> None:
            raise KeyError("no such shard")

        with pytest.raises(multihost.RemoteCallError, match="no such shard") as caught:
            s.call(boom)
        assert "remote traceback (s0/w" in str(caught.value)
        assert s.call(os.getpid) == pids  # still the same processes, warm

        # memory over ten pieces: what a piece dropped is freed, nothing grows
        seen = []
        for i in range(10):
            assert s.run_script("step.py", str(i)).ok
            seen.append(s.call(_stats))
        arrays = {host[0] for step in seen for host in step}
        assert len(arrays) == 1, seen  # the same live arrays after every piece
        rss = [host[2] for host in (seen[2][0], seen[-1][0])]
        assert rss[1] - rss[0] < 64 << 20, seen  # no growth worth a point's arrays
    assert s.closed
    wait_for(lambda: not leftovers(home), 30, "the warm processes to end")
    assert (s.log_dir / "warm-1" / "run.json").is_file()


def test_a_piece_that_ends_its_process_or_hangs_gets_new_ones(home: Path, code: Path) -> None:
    (code / "hang.py").write_text("import time\nprint('hanging', flush=True)\ntime.sleep(600)\n")
    with multihost.session(local=2, script_dir=code, env=CPU, stream="none", grace=2) as s:
        pids = s.call(os.getpid)

        def end_one() -> None:
            if os.environ["JAX_PROCESS_ID"] == "1":
                os._exit(7)
            time.sleep(600)  # its peer: stopped with the set

        with pytest.raises(multihost.RemoteCallError) as caught:
            s.call(end_one)
        assert "exited with code 7 (its warm process ended)" in str(caught.value)
        fresh = s.call(os.getpid)  # new processes, started for this call
        assert not set(fresh) & set(pids)

        hung = s.run_script("hang.py", timeout=3)
        assert hung.timed_out
        assert not hung.ok
        assert hung.first_failure == "timed out after 3 s"
        assert "hanging" in _log(hung, 0)
        third = s.call(os.getpid)
        assert not set(third) & set(fresh)
    wait_for(lambda: not leftovers(home), 30, "the warm processes to end")
    runs = sorted(p.name for p in s.log_dir.iterdir() if p.name.startswith("warm-"))
    assert runs == ["warm-1", "warm-2", "warm-3"]


POINT = """\
import json, os, sys, time
import jax

jax.distributed.initialize()  # a script written for a cluster: a no-op when warm
kind = sys.argv[1]
me = jax.process_index()
if kind == "raise":
    raise RuntimeError("this point raised")
if kind == "exit" and me == 1:
    os._exit(9)
if kind == "hang":
    print("hanging", flush=True)
    time.sleep(600)
if me == 0:
    print("MULTIHOST_RESULT " + json.dumps({"score": len(kind), "pid": os.getpid(),
                                            "devices": jax.device_count(),
                                            "mode": os.environ.get("MODE")}))
"""


def _sweep(code: Path, logs: Path, name: str, kinds: str, *extra: str) -> list[str]:
    return [
        "sweep",
        "--local",
        "2",
        "--warm",
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        name,
        "--grace",
        "2",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        "JAX_NUM_CPU_DEVICES=2",
        "--metric",
        "score",
        "--cmd",
        f"{sys.executable} point.py {{kind}}",
        "--grid",
        f"kind={kinds}",
        *extra,
    ]


def test_a_warm_sweep_goes_on_past_every_kind_of_failure(home: Path, code: Path) -> None:
    (code / "point.py").write_text(POINT)
    logs = home.parent / "sweeps"
    kinds = "ok,raise,okay,exit,fine,hang,good"
    res = cli(_sweep(code, logs, "ws", kinds, "--point-timeout", "20"), timeout=600, HOME=str(home))
    assert res.returncode == 1, res.stderr[-3000:]
    results = (logs / "ws" / "results.jsonl").read_text().splitlines()
    rows = {r["kind"]: r for r in map(json.loads, results)}
    assert rows["raise"]["status"].startswith("failed: s0/w")
    assert "raised RuntimeError: this point raised" in rows["raise"]["status"]
    assert rows["exit"]["status"] == "failed: s0/w1 exited with code 9 (its warm process ended)"
    assert rows["hang"]["status"] == "timed out after 20 s"
    ok = ["ok", "okay", "fine", "good"]
    assert all(rows[k]["status"] == "ok" and rows[k]["devices"] == 4 for k in ok)
    # the same processes until one ended, then new ones: three sets in all
    assert rows["ok"]["pid"] == rows["okay"]["pid"] != rows["fine"]["pid"] != rows["good"]["pid"]
    assert sorted(p.name for p in (logs / "ws").glob("warm-*")) == ["warm-1", "warm-2", "warm-3"]
    raised = (logs / "ws" / "kindraise" / "slice_0000_worker_0000.log").read_text()
    assert "RuntimeError: this point raised" in raised
    assert "point.py" in raised
    assert "best: kind=okay  score=4" in res.stdout
    assert "reproduce: multihost run --local 2 --env JAX_PLATFORMS=cpu" in res.stdout
    table = (logs / "ws" / "results.csv").read_text().splitlines()
    assert len(table) == 1 + len(kinds.split(","))
    assert not leftovers(home), leftovers(home)


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_a_warm_sweep_stopped_in_its_middle_leaves_nothing(
    home: Path, code: Path, how: str
) -> None:
    (code / "point.py").write_text(POINT)
    logs = home.parent / "sweeps"
    proc = spawn(_sweep(code, logs, "wc", "ok,hang,good"))  # HOME: this test's
    hang = logs / "wc" / "kindhang" / "slice_0000_worker_0001.log"
    try:
        wait_for(lambda: hang.is_file() and "hanging" in hang.read_text(), 300, "the hang point")
        assert len(leftovers(home)) > 4  # the warm processes, their wrappers, their channels
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, err[-2000:]
            assert "stopping the sweep" in err
            assert "results: " in out
        else:
            proc.kill()  # the runner dies: the warm processes see their channel gone
            proc.communicate(timeout=30)
        wait_for(lambda: not leftovers(home), 60, "every process of the sweep to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    rows = [json.loads(line) for line in (logs / "wc" / "results.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["status"]) for r in rows] == [("ok", "ok")]  # the rest: not run


def test_run_sweep_takes_warm_as_the_flag_does(home: Path, code: Path) -> None:
    """``warm=True`` is ``--warm``: the points in warm processes, a set for each layout (here
    the variable a point's command sets)."""
    (code / "point.py").write_text(POINT)
    seen: list[str] = []
    result = multihost.run_sweep(
        f"MODE={{mode}} {sys.executable} point.py {{kind}}",
        {"mode": ["a", "b"], "kind": ["ok", "fine"]},
        metric="score",
        local=2,
        env=CPU,
        script_dir=code,
        warm=True,
        run_name="api",
        on_record=lambda r: seen.append(r.status),
    )
    assert result.ok, result
    assert seen == ["ok"] * 4
    pids: dict[str, set[int]] = {}
    for r in result.records:
        assert r.result["mode"] == r.values["mode"]
        pids.setdefault(str(r.values["mode"]), set()).add(r.result["pid"])
    assert [len(p) for p in pids.values()] == [1, 1]  # each layout's points in one process 0
    assert pids["a"] != pids["b"]
    assert sorted(p.name for p in result.dir.glob("warm-*")) == ["warm-1", "warm-2"]
    with pytest.raises(multihost.UsageError, match="without a shell"):
        multihost.run_sweep("echo {a}", {"a": [1]}, local=2, script_dir=code, warm=True)
    wait_for(lambda: not leftovers(home), 30, "the warm processes to end")


def test_a_session_whose_runner_dies_leaves_nothing(home: Path, code: Path) -> None:
    """The Python that holds a session is SIGKILLed: no close, no atexit; each warm process
    sees its channel gone and leaves."""
    program = (
        "import sys, time, multihost\n"
        f"s = multihost.session(local=2, script_dir={str(code)!r}, env={CPU!r})\n"
        "s.start()\n"
        "print('warm', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, text=True, cwd=code
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "warm\n"
        assert leftovers(home)
        proc.kill()
        proc.wait(timeout=30)
        wait_for(lambda: not leftovers(home), 60, "the warm processes to leave")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
