"""Gathering output across hosts (``logs --gather``): identical output once with its hosts,
shared lines once and each difference per host group; bounded by the last N lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import multihost
from multihost.model import Host, host_ranges
from multihost.runs.gather import LiveGather, Output, Segment, gather, read_tail, render
from tests.clitools import REPO, cli


def _host(s: int, w: int) -> Host:
    return Host(address=f"h{s}-{w}", slice_id=s, worker_id=w, process_id=s * 4 + w)


HOSTS = [_host(s, w) for s in range(2) for w in range(4)]


def _out(host: Host, *lines: str) -> Output:
    return Output(host, lines, len(lines))


def test_identical_outputs_are_one_group() -> None:
    segments = gather([_out(h, "start", "done") for h in HOSTS])
    assert segments == [Segment(tuple(HOSTS), ("start", "done"), 0)]
    assert render(segments) == ["[s0/w0-3,s1/w0-3] ×8", "  start", "  done"]


def test_shared_lines_once_then_each_branch_per_host_group() -> None:
    outputs = [_out(h, "start", "init", f"rank {h.process_id % 2}", "end") for h in HOSTS]
    outputs[5] = _out(HOSTS[5])  # no output at all
    outputs[6] = _out(HOSTS[6], "start", "init")  # stopped early
    segments = gather(outputs)
    assert [(host_ranges(s.hosts), s.lines, s.depth) for s in segments] == [
        ("s1/w1", (), 0),
        ("s0/w0-3,s1/w0,s1/w2-3", ("start", "init"), 0),
        ("s0/w0,s0/w2,s1/w0", ("rank 0", "end"), 1),
        ("s0/w1,s0/w3,s1/w3", ("rank 1", "end"), 1),
    ]
    shown = render(segments)
    assert shown[0] == "[s1/w1] ×1  (no output)"
    assert shown[3:6] == ["  init", "  [s0/w0,s0/w2,s1/w0] ×3", "    rank 0"]


def test_every_output_different() -> None:
    segments = gather([_out(h, f"only {h.name}") for h in HOSTS[:3]])
    assert [(s.hosts, s.lines, s.depth) for s in segments] == [
        ((h,), (f"only {h.name}",), 0) for h in HOSTS[:3]
    ]


def test_read_tail_keeps_the_last_lines_and_counts_them(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)) + "x" * 100 + "\n")
    out = read_tail(HOSTS[0], log, 3, 40)
    assert out.lines == ("line 9998", "line 9999", "x" * 40)
    assert out.total == 10_001
    assert out.truncated
    odd = read_tail(HOSTS[0], log, 5, 40, lambda line: line.endswith("7"))
    assert odd.lines[-1] == "line 9997"
    assert odd.total == 1000
    assert read_tail(HOSTS[0], tmp_path / "missing", 3, 40) == Output(HOSTS[0], (), 0)


def test_cli_logs_gather(code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    cmd = 'echo start; echo "rank $((JAX_PROCESS_ID % 2))"; echo end'
    result = multihost.run(
        cmd, local=4, script_dir=code, log_dir=tmp_path / "logs", run_name="g", stream="none"
    )
    assert result.ok
    env = {"HOME": str(home), "PYTHONPATH": str(REPO)}
    res = cli(["logs", "g", "--log-dir", str(tmp_path / "logs"), "--gather"], **env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "[s0/w0-3] ×4",
        "  start",
        "  [s0/w0,s0/w2] ×2",
        "    rank 0",
        "    end",
        "  [s0/w1,s0/w3] ×2",
        "    rank 1",
        "    end",
    ]
    res = cli(
        ["logs", "g", "--log-dir", str(tmp_path / "logs"), "--gather", "--json", "--tail", "1"],
        **env,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["truncated"] == {f"s0/w{i}": 3 for i in range(4)}
    assert data["groups"] == [
        {
            "hosts": "s0/w0-3",
            "count": 4,
            "depth": 0,
            "lines": ["end"],
            "host_names": [f"s0/w{i}" for i in range(4)],
        }
    ]
    res = cli(["logs", "g", "--log-dir", str(tmp_path / "logs"), "--gather", "--tail", "1"], **env)
    assert "had more" in res.stderr
    res = cli(
        ["logs", "g", "--log-dir", str(tmp_path / "logs"), "--gather", "--host", "s0/w1"], **env
    )
    assert res.returncode == 2
    assert "--gather" in res.stderr


def test_live_lines_from_every_host_come_out_once() -> None:
    live = LiveGather(HOSTS[:4], window=2.0, pending=100)
    out: list[Segment] = []
    for i, host in enumerate(HOSTS[:4]):
        out += live.add(host, "step 100 loss 2.31", now=0.1 * i)
        assert len(out) == (1 if i == 3 else 0)  # held until the last host printed it
    assert out == [Segment(tuple(HOSTS[:4]), ("step 100 loss 2.31",), 0)]
    assert live.flush() == []


def test_live_a_different_line_comes_out_apart_after_the_window() -> None:
    live = LiveGather(HOSTS[:4], window=2.0, pending=100)
    out: list[Segment] = []
    for host in HOSTS[:4]:
        loss = "2.35" if host is HOSTS[2] else "2.31"
        out += live.add(host, f"step 100 loss {loss}", now=0.0)
    assert out == []  # the odd host's line, first in line, waits for the others
    out += live.due(now=1.9)
    assert out == []
    out += live.due(now=2.0)
    assert [(host_ranges(s.hosts), s.lines) for s in out] == [
        ("s0/w0-1,s0/w3", ("step 100 loss 2.31",)),
        ("s0/w2", ("step 100 loss 2.35",)),
    ]


def test_live_repeated_lines_stay_apart_and_ended_hosts_are_not_waited_for() -> None:
    live = LiveGather(HOSTS[:2], window=5.0, pending=100)
    assert live.add(HOSTS[0], ".", 0.0) == []
    assert live.add(HOSTS[0], ".", 0.1) == []  # its second copy: a group of its own
    first = live.add(HOSTS[1], ".", 0.2)
    assert first == [Segment(tuple(HOSTS[:2]), (".",), 0)]
    assert live.add(HOSTS[0], "bye", 0.3) == []
    live.ended(HOSTS[1])  # it will print no second "." and no "bye"
    assert [s.hosts for s in live.due(0.4)] == [(HOSTS[0],), (HOSTS[0],)]


def test_live_memory_is_bounded_by_the_lines_held() -> None:
    live = LiveGather(HOSTS[:2], window=1e9, pending=10)
    out: list[Segment] = []
    for i in range(1000):  # host 0 alone, every line different: nothing would complete
        out += live.add(HOSTS[0], f"line {i}", float(i))
    assert len(out) == 990
    assert [s.lines[0] for s in out[:2]] == ["line 0", "line 1"]  # the oldest first
    assert len(live.flush()) == 10


def test_run_gather_groups_every_hosts_lines_as_they_come(tmp_path: Path) -> None:
    cmd = (
        'for i in 1 2 3; do echo "step $i loss 2.31"; sleep 0.2; done; '
        '[ "$JAX_PROCESS_ID" = 2 ] && echo "only two"; echo "rank $((JAX_PROCESS_ID % 2))"'
    )
    (tmp_path / "code").mkdir()
    res = cli(
        [
            "run",
            "--local",
            "4",
            "--gather",
            "--script-dir",
            str(tmp_path / "code"),
            "--log-dir",
            str(tmp_path / "logs"),
            "--run-name",
            "g",
            "--cmd",
            cmd,
        ],
        HOME=str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for i in (1, 2, 3):
        assert f"[s0/w0-3] step {i} loss 2.31" in lines, lines
    assert "[s0/w2] only two" in lines
    assert "[s0/w0,s0/w2] rank 0" in lines
    assert "[s0/w1,s0/w3] rank 1" in lines
    assert len(lines) == 6, lines  # each line once, however many hosts printed it
    logs = sorted((tmp_path / "logs" / "g").glob("*.log"))
    assert len(logs) == 4  # the per-host logs stay as they are
    assert logs[2].read_text().splitlines() == [
        "step 1 loss 2.31",
        "step 2 loss 2.31",
        "step 3 loss 2.31",
        "only two",
        "rank 0",
    ]
