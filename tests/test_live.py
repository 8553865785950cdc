"""``multihost top`` and ``plot`` without a run: what a host's script says, read as records
(captured text of the real tools: nvidia-smi, tpu-info's lines, /proc through top.sh), the
verdicts (straggler, stuck), the rows drawn, the steps binned and the picture drawn; and the
host scripts themselves, run here on a run directory made by hand."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.live.figures import (
    Accelerator,
    HostSample,
    Reader,
    parse_gpu,
    parse_tpu,
    parse_watch,
)
from multihost.live.plot import slowest, write_png
from multihost.live.snapshot import HostRow, host_row, unreachable, verdicts
from multihost.live.steplog import HostSteps, StepBin, parse_steps, steps_command, table
from multihost.live.watcher import top_command
from multihost.model import Host

HOSTS = [Host(f"h{i}", slice_id=i // 4, worker_id=i % 4, process_id=i) for i in range(8)]

# nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
#   --format=csv,noheader,nounits, as an 8-GPU host prints it (one busy, one without figures)
NVIDIA_SMI = """\
0, 97, 71234, 81559
1, 95, 71100, 81559
2, 0, 3, 81559
3, [N/A], [N/A], 81559
"""


def _watch(steps: int, at: float, last: float, own: float, step: float = 0.2, **kw: object) -> str:
    data = {
        "v": 1,
        "pid": 10,
        "at": at,
        "steps": steps,
        "first": last - steps * step,
        "last": last,
        "recent": [step] * min(steps, 32),
        "own": [own] * min(steps, 32),
        "waiting": 0.0,
        "site": "train.py:42",
        **kw,
    }
    return json.dumps(data, separators=(",", ":"))


def _sample(
    host: Host,
    uptime: float,
    watch: str | None,
    *,
    state: str = "S",
    ticks: int = 100,
    run: str = "running",
) -> HostSample:
    lines = [
        "top 100 4096 8",
        "acc none",
        f"tick {uptime}",
        f"run {run}",
        "mem 16000000 12000000",
        f"p 10 {state} {ticks} 5000 {watch or '-'}",
        "last step 7 loss 2.31",
        "end",
    ]
    reader = Reader(host)
    got = reader.feed("\n".join(lines).encode() + b"\n", bytearray())
    assert len(got) == 1
    return got[0]


def test_a_hooks_watch_line_is_read_and_anything_else_is_none() -> None:
    w = parse_watch(_watch(40, 100.0, 99.5, 0.01))
    assert w is not None
    assert (w.steps, w.at, w.last, w.site) == (40, 100.0, 99.5, "train.py:42")
    assert w.recent == (0.2,) * 32
    assert w.own == (0.01,) * 32
    for bad in ("", "-", "{", "[1]", '{"v":2,"at":1}', '{"v":1}', '{"v":1,"at":"x"}'):
        assert parse_watch(bad) is None, bad
    odd = parse_watch('{"v":1,"at":5,"recent":[1,"x",NaN,2],"first":0}')
    assert odd is not None
    assert odd.recent == (1.0, 2.0)
    assert odd.first is None


def test_nvidia_smi_lines_are_read_and_summed() -> None:
    rows = [parse_gpu(line) for line in NVIDIA_SMI.splitlines()]
    assert rows[0] == (0, 97.0, 71234 << 20, 81559 << 20)
    assert rows[3] == (3, None, None, 81559 << 20)
    assert parse_gpu("index, utilization.gpu [%], memory.used [MiB]") is None
    assert parse_gpu("NVIDIA-SMI has failed because it couldn't communicate") is None
    reader = Reader(HOSTS[0])
    # nvidia-smi's lines as it prints them, between (and amid) the script's own looks
    lines = NVIDIA_SMI.splitlines()
    text = "top 100 4096 8\nacc gpu\n" + "\n".join([lines[0], "tick 5", lines[1], "run running"])
    text += "\n" + "\n".join([*lines[2:], "end", ""])
    assert len(reader.feed(text.encode(), bytearray())) == 1
    acc = reader.accelerator()
    assert acc == Accelerator(
        "gpu",
        4,
        memory_used=(71234 + 71100 + 3) << 20,
        memory_total=4 * 81559 << 20,
        busy_pct=(97 + 95 + 0) / 3,
    )


def test_tpu_lines_are_read_and_a_missing_metrics_server_said() -> None:
    assert parse_tpu("0 1073741824 34359738368 87.5") == (0, 1 << 30, 32 << 30, 87.5)
    assert parse_tpu("nometrics _InactiveRpcError") == "nometrics _InactiveRpcError"
    assert parse_tpu("none no tpu-info (ModuleNotFoundError)").startswith("none")
    assert parse_tpu("0 1 2") is None
    assert parse_tpu("0 a 2 3") is None
    reader = Reader(HOSTS[0])
    reader.feed(b"acc tpu\ntpu nometrics _InactiveRpcError\n", bytearray())
    acc = reader.accelerator()
    assert acc is not None
    assert acc.kind == "tpu"
    assert "nometrics" in acc.error
    reader.feed(b"tpu 0 100 200 50.0\ntpu 1 300 200 70.0\n", bytearray())
    assert reader.accelerator() == Accelerator("tpu", 2, 400, 400, 60.0)


def test_the_stream_is_read_across_chunks_and_garbage_is_left_out() -> None:
    text = (
        b"top 100 4096 2\nacc none\nnoise before any look\ntick 12.5\nrun running\n"
        b"mem 1000 500\np 7 R 250 100 -\np bad line\np 8 T 10 x -\nlast hello world\nend\n"
    )
    reader, rest, samples = Reader(HOSTS[1]), bytearray(), []
    for i in range(0, len(text), 7):  # as a host's bytes come: any chunking
        samples += reader.feed(text[i : i + 7], rest)
    (sample,) = samples
    assert sample.uptime == 12.5
    assert sample.hz == 100
    assert sample.cpus == 2
    assert (sample.mem_total, sample.mem_available) == (1000 * 1024, 500 * 1024)
    assert [(p.pid, p.state, p.cpu_ticks, p.rss_bytes) for p in sample.processes] == [
        (7, "R", 250, 100 * 4096),
        (8, "T", 10, 0),
    ]
    assert sample.last_line == "hello world"
    assert sample.accelerator is None
    huge = Reader(HOSTS[1])
    rest = bytearray()
    huge.feed(b"x" * 100_000, rest)
    assert len(rest) <= 4096  # a line without end is never held whole


def test_a_stepping_host_row_and_its_cpu() -> None:
    before = _sample(HOSTS[0], 100.0, _watch(40, 99.8, 99.7, 0.01), ticks=100)
    now = _sample(HOSTS[0], 102.0, _watch(50, 101.8, 101.7, 0.01), ticks=300)
    row = host_row(now, before)
    assert row.state == "stepping"
    assert row.steps == 50
    assert row.median_step_s == pytest.approx(0.2)
    assert row.own_s == pytest.approx(0.01)
    assert row.cpu_pct == pytest.approx(100.0)  # 200 ticks at 100 Hz over 2 s
    assert row.since_step_s == pytest.approx(0.1)  # as the hook wrote: it is alive
    assert row.rss_bytes == 5000 * 4096
    assert row.mem_available == 12000000 * 1024
    assert row.last_line == "step 7 loss 2.31"
    assert row.site == "train.py:42"


def test_rows_of_hosts_not_stepping() -> None:
    assert host_row(_sample(HOSTS[0], 5.0, None, run="missing"), None).state == "missing"
    done = host_row(_sample(HOSTS[0], 5.0, None, run="exit 0"), None)
    failed = host_row(_sample(HOSTS[0], 5.0, None, run="exit 3"), None)
    assert (done.state, failed.state, failed.detail) == ("done", "failed", "exit 3")
    assert host_row(_sample(HOSTS[0], 5.0, None), None).state == "running"
    starting = host_row(_sample(HOSTS[0], 5.0, _watch(0, 4.9, 0.0, 0.0, waiting=3.0)), None)
    assert (starting.state, starting.detail) == ("starting", "waiting for results 3 s")
    stopped = host_row(_sample(HOSTS[0], 50.0, _watch(9, 10.0, 9.9, 0.01), state="T"), None)
    assert stopped.state == "stopped"
    assert "SIGSTOP" in stopped.detail
    assert stopped.since_step_s == pytest.approx(40.1)  # its hook is silent: up to now


def _rows(owns: list[float], *, since: float = 0.1, waiting: float = 0.0) -> list[HostRow]:
    return [
        HostRow(
            HOSTS[i],
            "stepping",
            steps=50,
            median_step_s=0.2,
            own_s=own,
            since_step_s=since,
            waiting_s=waiting,
        )
        for i, own in enumerate(owns)
    ]


def test_the_host_that_waits_least_is_the_straggler() -> None:
    snap = verdicts("r", _rows([0.001, 0.002, 0.201, 0.001, 0.0015, 0.001, 0.002, 0.001]), 0.0)
    assert snap.straggler == HOSTS[2]
    assert [r.host for r in snap.rows if r.slow] == [HOSTS[2]]
    assert snap.to_json()["straggler"] == "s0/w2"
    two = verdicts("r", _rows([0.0003, 0.2004]), 0.0)  # two hosts: each against the other
    assert two.straggler == HOSTS[1]
    even = verdicts("r", _rows([0.05, 0.052, 0.049, 0.051]), 0.0)  # within 20% of a step
    assert even.straggler is None
    assert not any(r.slow for r in even.rows)
    alone = verdicts("r", _rows([0.2]), 0.0)
    assert alone.straggler is None


def test_hosts_without_a_step_for_several_step_times_are_stuck() -> None:
    rows = _rows([0.001, 0.001, 0.2], since=6.0, waiting=5.5)
    rows[2] = HostRow(
        HOSTS[2],
        "stopped",
        steps=48,
        median_step_s=0.2,
        own_s=0.2,
        since_step_s=7.0,
        detail="stopped (SIGSTOP or SIGTSTP): process 10",
    )
    snap = verdicts("r", rows, 0.0)
    assert snap.stuck == tuple(HOSTS[:3])
    assert [r.state for r in snap.rows] == ["stuck", "stuck", "stopped"]
    assert "waiting for results" in snap.rows[0].detail
    assert "SIGSTOP" in snap.rows[2].detail
    assert any("multihost stack r" in n for n in snap.notes)
    assert snap.to_json()["stuck"] == ["s0/w0", "s0/w1", "s0/w2"]
    # 5 median steps of 0.2 s is 1 s, but the hook writes once a second: 5 s at least
    assert not verdicts("r", _rows([0.001, 0.001], since=4.0), 0.0).stuck


def test_the_json_has_every_field_for_scripts() -> None:
    now = _sample(HOSTS[0], 102.0, _watch(50, 101.8, 101.7, 0.01))
    snap = verdicts("r", [host_row(now, None), unreachable(HOSTS[1], "connection refused")], 7.0)
    data = json.loads(json.dumps(snap.to_json()))
    assert set(data) == {
        "run",
        "at",
        "hosts",
        "straggler",
        "stuck",
        "median_step_s",
        "median_own_s",
        "notes",
    }
    first, second = data["hosts"]
    for key in (
        "host",
        "state",
        "steps",
        "last_step_s",
        "median_step_s",
        "own_s",
        "cpu_pct",
        "rss_bytes",
        "mem_available_bytes",
        "accelerator",
        "last_line",
        "slow",
        "stuck",
    ):
        assert key in first, key
    assert second["state"] == "unreachable"
    assert second["detail"] == "connection refused"
    assert data["notes"] == ["no accelerator figures on CPU hosts"]  # said once, not per host


def test_many_hosts_are_slices_and_outliers() -> None:
    hosts = [Host(f"h{i}", slice_id=i // 64, worker_id=i % 64, process_id=i) for i in range(256)]
    rows = [HostRow(h, "stepping", steps=100, median_step_s=0.2, own_s=0.001) for h in hosts]
    rows[77] = HostRow(hosts[77], "stepping", steps=100, median_step_s=0.2, own_s=0.15)
    rows[200] = unreachable(hosts[200], "timed out")
    snap = verdicts("big", rows, 0.0)
    slices = snap.slices()
    assert [s.hosts for s in slices] == [64] * 4
    assert slices[1].slowest == hosts[77]
    worst = snap.outliers(3)
    assert [r.host for r in worst[:2]] == [hosts[200], hosts[77]]
    from rich.console import Console

    from multihost.cli.live import render

    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render(snap, width=160, height=40))
    shown = console.export_text()
    assert "slices" in shown
    assert "outliers" in shown
    assert "s1/w13" in shown
    assert shown.count("\n") < 60  # not a wall of 256 rows
    assert "straggler: s1/w13" in shown


def test_a_sixteen_host_view_fits_a_terminal() -> None:
    hosts = [Host(f"h{i}", slice_id=i // 8, worker_id=i % 8, process_id=i) for i in range(16)]
    rows = [
        HostRow(
            h,
            "stepping",
            steps=300,
            last_step_s=0.2,
            median_step_s=0.2,
            own_s=0.001,
            cpu_pct=99.0,
            rss_bytes=3 << 30,
            mem_available=100 << 30,
            last_line="x" * 300,
        )
        for h in hosts
    ]
    from rich.console import Console

    from multihost.cli.live import render

    console = Console(record=True, width=120, file=io.StringIO())
    console.print(render(verdicts("r", rows, 0.0), width=120, height=40))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 120 for line in lines)
    assert sum(line.startswith("s") and "stepping" in line for line in lines) == 16


def test_steps_are_binned_per_host_and_put_on_one_grid() -> None:
    text = "steps 123.steps 10 10 3\nb 1 3 0.2 0.21 0.01 0.02 100.0\nb 4 3 0.4 0.5 0.3 0.4 101\n"
    text += "b x 1 1 1 1 1 1\nb 7 3 nan 1 1 1 1\n"
    got = parse_steps(HOSTS[0], text)
    assert got.last_step == 10
    assert got.bins == (
        StepBin(1, 3, 0.2, 0.21, 0.01, 0.02),
        StepBin(4, 3, 0.4, 0.5, 0.3, 0.4),
    )
    assert parse_steps(HOSTS[0], "none\n").error
    assert "gone" in (parse_steps(HOSTS[0], "missing\n").error or "")
    other = HostSteps(
        HOSTS[1], (StepBin(1, 6, 0.2, 0.2, 0.2, 0.2), StepBin(7, 6, 0.2, 0.2, 0.2, 0.2)), 12
    )
    grid = table([got, other, HostSteps(HOSTS[2], error="none")], bins=2)
    assert grid is not None
    assert grid.hosts == (HOSTS[0], HOSTS[1])
    assert grid.width == 6
    assert grid.columns == 2
    assert grid.step_s[0] == (pytest.approx(0.3), None)  # steps 1-6 of host 0: its two bins
    assert slowest(grid) is not None
    assert slowest(grid)[0] == 1
    assert table([HostSteps(HOSTS[0], error="none")]) is None


def test_the_picture_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        HostSteps(
            h,
            tuple(
                StepBin(1 + 10 * k, 10, 0.2, 0.25, 0.2 if h.process_id == 5 else 0.001, 0.2)
                for k in range(30)
            ),
            300,
        )
        for h in HOSTS
    ]
    grid = table(rows, bins=100)
    assert grid is not None
    out = tmp_path / "steps.png"
    assert write_png(out, grid, "r") is None
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "could not write" in (write_png(tmp_path / "no" / "x.png", grid, "r") or "")


def _fake_run(tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "runs" / "r"
    (run / "hook").mkdir(parents=True)
    (run / "log").write_text("first\nlast line of the log\n")
    return run, run / "hook"


def test_the_host_script_reads_the_runs_own_processes(tmp_path: Path) -> None:
    run, hook = _fake_run(tmp_path)
    code = "import time\nwhile True: time.sleep(0.05)"
    mine = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "MULTIHOST_STACK_DIR": str(hook)}
    )
    other = subprocess.Popen([sys.executable, "-c", code])  # not the run's: left out
    try:
        for p in (mine, other):
            (hook / f"{p.pid}.ready").write_text("python\n")
        (hook / f"{mine.pid}.watch").write_text(_watch(3, 1.0, 0.9, 0.01) + "\n")
        (hook / "12345678.ready").write_text("gone\n")  # no such process
        res = subprocess.run(
            top_command(str(run), 0.2, 2), shell=True, capture_output=True, timeout=30
        )
        assert res.returncode == 0, res.stderr
        reader = Reader(HOSTS[0])
        samples = reader.feed(res.stdout, bytearray())
        assert len(samples) == 2
        assert reader.kind in ("none", "gpu", "tpu")
        last = samples[-1]
        assert [p.pid for p in last.processes] == [mine.pid]
        assert last.processes[0].watch is not None
        assert last.processes[0].watch.steps == 3
        assert last.processes[0].rss_bytes > 0
        assert last.run_state == "running"
        assert last.last_line == "last line of the log"
        assert last.mem_total
        assert last.mem_available
        assert last.uptime > 0
        (run / "exit").write_text("0\n")
        res = subprocess.run(top_command(str(run), 0.2, 1), shell=True, capture_output=True)
        assert Reader(HOSTS[0]).feed(res.stdout, bytearray())[0].run_state == "exit 0"
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
    gone = subprocess.run(
        top_command(str(tmp_path / "nope"), 0.2, 1), shell=True, capture_output=True
    )
    assert Reader(HOSTS[0]).feed(gone.stdout, bytearray())[0].run_state == "missing"


def test_the_host_script_ends_when_nobody_reads_it(tmp_path: Path) -> None:
    run, _ = _fake_run(tmp_path)
    proc = subprocess.Popen(
        top_command(str(run), 0.1, 0), shell=True, stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"top ")
    proc.stdout.close()  # the runner went away: the next look's write fails
    try:
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode is not None


def test_the_steps_script_bins_the_longest_log(tmp_path: Path) -> None:
    run, hook = _fake_run(tmp_path)
    (hook / "1.steps").write_text("".join(f"{i} {i}.0 0.2 0.01\n" for i in range(1, 11)))
    (hook / "2.steps").write_text("1 1.0 0.5 0.5\n")
    res = subprocess.run(steps_command(str(run), 4), shell=True, capture_output=True, text=True)
    got = parse_steps(HOSTS[0], res.stdout)
    assert got.error is None
    assert got.last_step == 10
    assert [(b.first, b.count) for b in got.bins] == [(1, 3), (4, 3), (7, 3), (10, 1)]
    assert got.bins[0].mean_s == pytest.approx(0.2)
    assert got.bins[0].mean_own_s == pytest.approx(0.01)
    (hook / "1.steps").unlink()
    (hook / "2.steps").unlink()
    res = subprocess.run(steps_command(str(run), 4), shell=True, capture_output=True, text=True)
    assert res.stdout.strip() == "none"


FAKE_NVIDIA_SMI = f"""#!/bin/sh
# a stand-in for nvidia-smi: the captured answer, once or every -l N seconds
every=
while [ $# -gt 0 ]; do [ "$1" = -l ] && every=$2; shift; done
while :; do
  printf '%s' '{NVIDIA_SMI}'
  [ -n "$every" ] || exit 0
  sleep "$every"
done
"""


@pytest.mark.parametrize("looks", [1, 3])
def test_a_gpu_hosts_figures_come_from_nvidia_smi(tmp_path: Path, looks: int) -> None:
    run, _ = _fake_run(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(
        top_command(str(run), 1, looks), shell=True, capture_output=True, env=env, timeout=30
    )
    reader = Reader(HOSTS[0])
    samples = reader.feed(res.stdout, bytearray())
    assert reader.kind == "gpu"
    assert len(samples) == looks
    acc = reader.accelerator()
    assert acc is not None
    assert (acc.devices, acc.busy_pct) == (4, pytest.approx(64.0))
    assert acc.memory_total == 4 * 81559 << 20
    left = subprocess.run(["pgrep", "-f", str(smi)], capture_output=True, text=True)
    assert left.stdout == ""  # the background nvidia-smi went with the script


def test_a_tpu_hosts_figures_come_from_tpu_info(tmp_path: Path) -> None:
    """tpu_watch.py against a stand-in of tpu-info's library (the one on a TPU VM reads
    libtpu's metrics server; its API: device.get_local_chips, metrics.get_chip_usage)."""
    from multihost.live.watcher import tpu_source

    site = tmp_path / "site" / "tpu_info"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "device.py").write_text(
        "import enum\nclass TpuChip(enum.Enum):\n    V5E = 'v5e'\n"
        "def get_local_chips():\n    return TpuChip.V5E, 2\n"
    )
    (site / "metrics.py").write_text(
        "import collections\n"
        "Usage = collections.namedtuple('Usage', 'device_id memory_usage total_memory "
        "duty_cycle_pct')\n"
        "def get_chip_usage(chip):\n"
        "    return [Usage(0, 1 << 30, 16 << 30, 87.5), Usage(1, 2 << 30, 16 << 30, 12.5)]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    got = subprocess.run(
        [sys.executable, "-c", tpu_source(), "0.1", "2"], capture_output=True, text=True, env=env
    )
    assert (
        got.stdout.splitlines()
        == [
            f"tpu 0 {1 << 30} {16 << 30} 87.5",
            f"tpu 1 {2 << 30} {16 << 30} 12.5",
        ]
        * 2
    )
    reader = Reader(HOSTS[0], kind="tpu")
    reader.feed(got.stdout.encode(), bytearray())
    assert reader.accelerator() == Accelerator("tpu", 2, 3 << 30, 32 << 30, 50.0)
    (site / "metrics.py").write_text(
        "def get_chip_usage(chip):\n    raise ConnectionError('no metrics server')\n"
    )
    silent = subprocess.run(
        [sys.executable, "-c", tpu_source(), "0.1", "1"], capture_output=True, text=True, env=env
    )
    assert silent.stdout == "tpu nometrics ConnectionError\n"
    none = subprocess.run(
        [sys.executable, "-I", "-c", tpu_source(), "0.1", "1"], capture_output=True, text=True
    )
    assert none.stdout.startswith("tpu none no tpu-info")
