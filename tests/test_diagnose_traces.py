"""``multihost trace``: every JAX process of a running run traces the same seconds, the traces
come back one folder per host, and a table reads them (real multi-process JAX on CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from multihost.diagnose.capture import new_folder, ready_ago, stepping_command, trace_command
from multihost.diagnose.captured import (
    Capture,
    HostCapture,
    ProcessTrace,
    in_words,
    parse_answer,
    rows,
    with_counted,
)
from multihost.diagnose.traces import HostTrace, TraceStats, slowest, stats_of_events
from multihost.errors import UsageError
from multihost.model import Host
from tests.clitools import REPO, cli, fleet_run_args, no_processes
from tests.helpers import free_port, wait_for

STEPPER = """\
import os, time
import jax, jax.numpy as jnp
jax.distributed.initialize()
f = jax.jit(lambda x: jnp.sin(x @ x).sum())
x = jnp.ones((128, 128))
pause = 0.02 * (1 + jax.process_index())
stop = os.path.join(os.environ["STOP_DIR"], "stop")
print("stepping", flush=True)
i = 0
while not os.path.exists(stop) and i < 3000:
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        f(x).block_until_ready()
        time.sleep(pause)
    i += 1
print("steps", i, flush=True)
"""


def _meta(pid: int, name: str, tid: int | None = None) -> dict[str, object]:
    kind = "thread_name" if tid is not None else "process_name"
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}


def _x(pid: int, tid: int, name: str, ts: float, dur: float, **args: object) -> dict[str, object]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


def test_stats_count_steps_and_the_union_of_xla_work() -> None:
    events = [
        _meta(1, "/host:CPU"),
        _meta(1, "python", 10),
        _meta(1, "tf_XLAEigen/1", 11),
        _x(1, 10, "train", 0, 100_000, step_num="0"),
        _x(1, 10, "train", 100_000, 300_000, step_num="1"),
        _x(1, 10, "train", 400_000, 200_000, step_num="2"),
        _x(1, 10, "other", 0, 1000),  # host python work is not XLA work
        _x(1, 11, "fusion", 0, 200_000),
        _x(1, 11, "fusion", 100_000, 200_000),  # overlap
        _x(1, 11, "ThreadpoolListener::Record", 0, 500_000),  # markers do not count
    ]
    stats = stats_of_events(events)
    assert stats.steps == 3
    assert stats.step_name == "train"
    assert stats.median_step_s == pytest.approx(0.2)
    assert stats.span_s == pytest.approx(0.6)
    assert stats.busy == pytest.approx(0.3 / 0.6)


def test_device_planes_count_as_xla_work_and_no_steps_is_none() -> None:
    events = [
        _meta(2, "/device:TPU:0"),
        _meta(2, "XLA Ops", 1),
        _x(2, 1, "dot", 0, 50),
        _x(2, 1, "dot", 50, 50),
    ]
    stats = stats_of_events(events)
    assert stats.steps == 0
    assert stats.median_step_s is None
    assert stats.busy == pytest.approx(1.0)


def _row(host: str, median: float) -> HostTrace:
    return HostTrace(host, TraceStats(1.0, "train", 5, median, None))


def test_slowest_is_named_only_when_it_stands_out() -> None:
    assert slowest([_row("a", 1.0), _row("b", 1.02), _row("c", 1.01)]) is None
    host, gap = slowest([_row("a", 1.0), _row("b", 1.3), _row("c", 1.0)]) or ("", 0.0)
    assert host == "b"
    assert gap == pytest.approx(0.3)
    assert slowest([_row("a", 1.0), HostTrace("b", None, (), "gone")]) is None


def test_answers_of_the_host_script() -> None:
    procs, error = parse_answer("nojax 7 python helper.py\ndone 9 1.0 2.0\ngone 11\nend\n")
    assert error is None
    assert [p.state for p in procs] == ["nojax", "done", "gone"]
    assert parse_answer("finished\n")[1] == "the run has finished on this host: nothing to trace"
    assert parse_answer("none\n")[1] == "no process of the run has imported jax"
    only_plain = parse_answer("nojax 7 python x.py\nnone\n")
    assert only_plain[1] == "no process of the run has imported jax"
    assert "no hook" in (parse_answer("nohook\n")[1] or "")


def test_a_capture_waits_for_every_first_step_to_end() -> None:
    now = "now 100.0\n"
    # first step ended at 97 and 99: ready for 1 s
    assert ready_ago(now + "p 1 90.0 97.0 80.0\np 2 91.0 99.0 80.0\n") == pytest.approx(1.0)
    # a first step still running (compiling) is waited for, however long ago it began
    assert ready_ago(now + "p 1 10.0 - 5.0\np 2 90.0 97.0 80.0\n") is None
    # by default, a program that annotates no step is never ready: a first step may come
    assert ready_ago(now + "p 1 - - 50.0\n") is None
    # --trace-after S: from the first step's beginning, or, annotating none, the backend's
    assert ready_ago(now + "p 1 10.0 - 5.0\np 2 - - 95.0\n", 1.0) == pytest.approx(5.0)
    assert ready_ago(now) is None  # no process has imported jax yet
    assert ready_ago("now 1.0\nfinished\n") == float("inf")


def test_the_hook_counts_the_steps_that_end_in_the_capture() -> None:
    # a step longer than half the capture: the trace shows none that both began and ended in it
    row = HostTrace("h", TraceStats(3.0, None, 0, None, 0.9), ("a.trace.json.gz",))
    done = ProcessTrace(7, "done", "100.0 103.1 full 1 2.35")
    counted = with_counted(row, [done, ProcessTrace(8, "nojax", "python x.py")])
    assert counted.stats is not None
    assert (counted.stats.steps, counted.stats.median_step_s) == (1, 2.35)
    assert done.traced() == (pytest.approx(3.1), False)
    old = ProcessTrace(7, "done", "100.0 103.0")  # a hook that did not count
    assert with_counted(row, [old]) == row
    assert old.traced() == (3.0, False)


def test_a_job_that_ends_during_the_capture_says_how_far_it_got(tmp_path: Path) -> None:
    row = HostTrace("s0/w0", TraceStats(1.2, "train", 4, 0.3, 0.5), ("t",))
    host = HostCapture(Host("h0"), (ProcessTrace(7, "done", "100.0 101.25 exit 4 0.3"),), None, row)
    line, level = in_words(Capture("c", tmp_path, 5.0, (host,)))
    assert level == "warning"
    assert "the job ended 1.2 s into the 5 s capture" in line
    assert "--trace 1.2" in line
    assert rows(Capture("c", tmp_path, 5.0, (host,)))[0]["cut"] is True


def test_a_capture_never_overwrites_an_earlier_one(tmp_path: Path) -> None:
    names = [new_folder(tmp_path, "c")[0] for _ in range(3)]
    assert names == ["c", "c.2", "c.3"]
    with pytest.raises(UsageError):
        new_folder(tmp_path, "../x")


def test_the_host_scripts_take_an_awkward_home_relative_run_dir(tmp_path: Path) -> None:
    """``remote/trace.sh`` and ``remote/stepping.sh`` as sent, run by plain sh (shellcheck
    checks the files in tests/test_remote.py): a run dir with a space, under ``~``."""
    run = tmp_path / "x y"
    run.mkdir()
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def sh(command: str) -> str:
        return subprocess.run(
            ["sh", "-c", command], env=env, capture_output=True, text=True, check=True
        ).stdout

    assert sh(trace_command("~/x y", "c", 1.0, 2.0)) == "nohook\n"
    (run / "hook").mkdir()
    assert sh(trace_command("~/x y", "c", 1.0, 2.0)) == "none\n"
    assert sh(stepping_command("~/x y")).startswith("now ")
    (run / "exit").write_text("0\n")
    assert sh(trace_command("~/x y", "c", 1.0, 2.0)) == "finished\n"
    assert sh(stepping_command("~/x y")).splitlines()[1:] == ["finished"]


@pytest.fixture
def stepper(code: Path) -> Path:
    """The shared code dir plus the stepping JAX program."""
    (code / "stepper.py").write_text(STEPPER)
    return code


def _started(logs: Path, run: str, n: int) -> bool:
    texts = [p.read_text() for p in (logs / run).glob("*.log")]
    return len(texts) == n and all("stepping" in t for t in texts)


@pytest.mark.jax
@pytest.mark.slow
def test_a_detached_local_run_is_traced_and_goes_on(
    stepper: Path, tmp_path: Path, home: Path
) -> None:
    logs, stop = tmp_path / "logs", tmp_path / "stop"
    stop.mkdir()
    started = cli(
        [
            "run",
            "--local",
            "2",
            "--detach",
            "--run-name",
            "tr",
            "--log-dir",
            str(logs),
            "--script-dir",
            str(stepper),
            "--env",
            f"STOP_DIR={stop}",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--cmd",
            "python stepper.py",
        ]
    )
    assert started.returncode == 0, started.stderr
    try:
        wait_for(
            lambda: (
                cli(["logs", "tr", "--log-dir", str(logs)]).returncode == 0
                and _started(logs, "tr", 2)
            ),
            timeout=120,
            what="both hosts stepping",
        )
        first = cli(["trace", "tr", "--log-dir", str(logs), "--seconds", "1", "--json"])
        assert first.returncode == 0, first.stderr
        data = json.loads(first.stdout)
        hosts = {h["host"]: h for h in data["hosts"]}
        assert set(hosts) == {"s0/w0", "s0/w1"}
        assert all(h["ok"] and h["steps"] > 3 and h["median_step_s"] > 0 for h in hosts.values())
        assert hosts["s0/w1"]["median_step_s"] > hosts["s0/w0"]["median_step_s"]
        folder = Path(data["folder"])
        per_host = {p.name: sorted(p.rglob("*.xplane.pb")) for p in folder.iterdir()}
        assert set(per_host) == {"slice_0000_worker_0000", "slice_0000_worker_0001"}
        assert all(len(files) == 1 for files in per_host.values())
        second = cli(
            ["trace", "tr", "--log-dir", str(logs), "--seconds", "1", "--name", data["capture"]]
        )
        assert second.returncode == 0, second.stdout + second.stderr
        assert "slowest: s0/w1" in second.stderr
        assert "xprof" in second.stderr
        assert (folder.parent / f"{data['capture']}.2").is_dir()
        assert folder.is_dir()
    finally:
        (stop / "stop").touch()
    done = cli(["attach", "tr", "--log-dir", str(logs)], timeout=120)
    assert done.returncode == 0, done.stderr  # tracing did not disturb the program
    finished = cli(["trace", "tr", "--log-dir", str(logs)])
    assert finished.returncode == 2
    assert "nothing to trace" in finished.stderr


@pytest.mark.jax
@pytest.mark.slow
def test_a_host_whose_process_is_gone_is_a_row_with_its_reason(
    stepper: Path, tmp_path: Path, home: Path
) -> None:
    logs, stop = tmp_path / "logs", tmp_path / "stop"
    stop.mkdir()
    # host 1 runs no JAX at all and ends at once; host 0 steps until told to stop
    cmd = 'if [ "$JAX_PROCESS_ID" = 1 ]; then echo stepping; else python stepper.py; fi'
    started = cli(
        [
            "run",
            "--local",
            "2",
            "--detach",
            "--no-fail-fast",
            "--run-name",
            "gone",
            "--log-dir",
            str(logs),
            "--script-dir",
            str(stepper),
            "--env",
            f"STOP_DIR={stop}",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--env",
            "JAX_PROCESS_COUNT=1",
            "--cmd",
            cmd,
        ]
    )
    assert started.returncode == 0, started.stderr
    try:
        wait_for(
            lambda: (
                cli(["logs", "gone", "--log-dir", str(logs)]).returncode == 0
                and _started(logs, "gone", 2)
            ),
            timeout=120,
            what="host 0 stepping",
        )
        out = cli(["trace", "gone", "--log-dir", str(logs), "--seconds", "1", "--json"])
        assert out.returncode == 1, out.stderr  # a host without a trace fails the capture
        hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
        assert hosts["s0/w0"]["ok"]
        assert hosts["s0/w0"]["steps"] > 0
        assert not hosts["s0/w1"]["ok"]
        assert "finished" in hosts["s0/w1"]["error"]
    finally:
        (stop / "stop").touch()
    cli(["attach", "gone", "--log-dir", str(logs)], timeout=120)


def _fleet_log_says(fleet, run: str, n: int, word: str) -> bool:  # type: ignore[no-untyped-def]
    logs = [Path(h.home) / ".multihost" / "runs" / run / "log" for h in fleet.hosts[:n]]
    return all(p.is_file() and word in p.read_text() for p in logs)


@pytest.mark.jax
@pytest.mark.usefixtures("fresh_runs")
def test_fleet_hosts_are_traced_into_one_folder_each(  # type: ignore[no-untyped-def]
    ssh_fleet, remote_jax, stepper: Path, tmp_path: Path
) -> None:
    logs, n = tmp_path / "logs", 2
    # the fleet's users look for the stop file in a directory every one of them can read
    stop = Path(tempfile.mkdtemp(prefix="multihost-trace-stop-", dir="/tmp"))
    stop.chmod(0o755)
    port = free_port()
    args = fleet_run_args(
        ssh_fleet,
        stepper,
        logs,
        "ftr",
        f"{remote_jax['PYTHON']} stepper.py",
        n,
        "--detach",
        "--env",
        f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--env",
        f"XLA_FLAGS={remote_jax['XLA_FLAGS']}",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        f"STOP_DIR={stop}",
        "--coordinator-port",
        str(port),
    )
    assert (res := cli(args)).returncode == 0, res.stderr
    try:
        wait_for(lambda: _fleet_log_says(ssh_fleet, "ftr", n, "stepping"), 120, "stepping")
        out = cli(["trace", "ftr", "--log-dir", str(logs), "--seconds", "1", "--json"])
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert [h["host"] for h in data["hosts"] if h["ok"] and h["steps"] > 0] == [
            "s0/w0",
            "s0/w1",
        ]
        folders = sorted(p.name for p in Path(data["folder"]).iterdir())
        assert folders == ["slice_0000_worker_0000", "slice_0000_worker_0001"]
    finally:
        (stop / "stop").touch()
    done = cli(["attach", "ftr", "--log-dir", str(logs)], timeout=120)
    assert done.returncode == 0, done.stderr
    shutil.rmtree(stop, ignore_errors=True)
    wait_for(lambda: no_processes(ssh_fleet, n), 20, "no process left")


@pytest.mark.jax
@pytest.mark.slow
def test_run_trace_captures_once_every_host_steps(
    stepper: Path, tmp_path: Path, home: Path
) -> None:
    logs, stop = tmp_path / "logs", tmp_path / "stop"
    stop.mkdir()
    # the hosts stop by themselves once the capture is in: the stop file is the trace's summary
    cmd = (
        f"(while ! ls {logs}/rt/traces/*/summary.json >/dev/null 2>&1; do sleep 0.2; done; "
        f"touch {stop}/stop) & python stepper.py"
    )
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--run-name",
            "rt",
            "--log-dir",
            str(logs),
            "--script-dir",
            str(stepper),
            "--env",
            f"STOP_DIR={stop}",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--trace",
            "1",
            "--trace-after",
            "1",
            "--cmd",
            cmd,
        ],
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    assert "every JAX process has completed its first step" in res.stderr
    summary = next((logs / "rt" / "traces").glob("*/summary.json"))
    data = json.loads(summary.read_text())
    assert [h["host"] for h in data["hosts"] if h["ok"] and h["steps"] > 0] == ["s0/w0", "s0/w1"]
    assert "median step" in res.stdout  # the table after the run
    assert oct(summary.stat().st_mode & 0o777) == "0o600"


QUICK_START = (
    "python payloads/shardings.py --dcn_data_parallelism 2 --ici_fsdp_parallelism 4 -d 512 -b 128"
)


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.usefixtures("home")
def test_the_quick_start_is_traced_with_its_steps(tmp_path: Path) -> None:
    """The README's quick start with --trace 3: it steps ~5 times after compiling, so a capture
    that waits a fixed time took nothing, and one that counted only the steps the trace shows
    whole said 0 steps for steps over half the window."""
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--local",
            "4",
            "--env",
            "JAX_NUM_CPU_DEVICES=2",
            "--run-name",
            "qs",
            "--log-dir",
            str(logs),
            "--script-dir",
            str(REPO),
            "--trace",
            "3",
            "--cmd",
            QUICK_START,
        ],
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "every JAX process has completed its first step" in res.stderr
    summary = json.loads(next((logs / "qs" / "traces").glob("*/summary.json")).read_text())
    hosts = summary["hosts"]
    assert [h["host"] for h in hosts] == ["s0/w0", "s0/w1", "s0/w2", "s0/w3"]
    for h in hosts:
        assert h["ok"], h
        assert h["steps"] >= 1, h  # at least one ~1-2 s step ends in any 3 s of stepping
        assert h["median_step_s"] > 0.1
        assert h["xla_busy"] > 0.3  # stepping, not compiling


@pytest.mark.jax
@pytest.mark.slow
def test_a_job_that_ends_during_the_capture_keeps_its_trace(
    stepper: Path, tmp_path: Path, home: Path
) -> None:
    logs, stop = tmp_path / "logs", tmp_path / "stop"
    stop.mkdir()
    # the jobs stop 1 s after both processes started tracing: 1 s of a 5 s capture (both: on a
    # loaded machine one may start its capture more than 1 s after the other)
    cmd = (
        f"(until ls $MULTIHOST_STACK_DIR/*.started >/dev/null 2>&1; do sleep 0.1; done; "
        f"touch {stop}/started-$MULTIHOST_WORKER_ID; "
        f"until [ $(ls {stop} | grep -c started-) -ge 2 ]; do sleep 0.1; done; "
        f"sleep 1; touch {stop}/stop) & python stepper.py"
    )
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--run-name",
            "cut",
            "--log-dir",
            str(logs),
            "--script-dir",
            str(stepper),
            "--env",
            f"STOP_DIR={stop}",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--trace",
            "5",
            "--cmd",
            cmd,
        ],
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    assert "into the 5 s capture" in res.stderr, res.stderr + res.stdout
    summary = json.loads(next((logs / "cut" / "traces").glob("*/summary.json")).read_text())
    for h in summary["hosts"]:
        assert h["ok"], h
        assert h["cut"], h
        assert 0 < h["traced_s"] < 5  # cut short of the 5 s asked (on a loaded machine the
        assert h["steps"] >= 1  # job's 1 s may stretch, and few steps fit in it)
        assert h["files"]  # the trace stopped at the program's exit was written
    assert "the job ended" in res.stdout  # the table's note
