"""Ctrl-C where a new user met it: during a huge dry run, a second time on ``run`` (it must say
how to stop what it leaves), and on a sweep before or after a point finished (the results it
names must exist). The CLI is started from Python with no shell, so SIGINT is not ignored
(REFERENCE.md, "Testing Ctrl-C"); the tests wait on states, never on the clock."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tests.clitools import cli, host_logs, manifest
from tests.helpers import wait_for


def _spawn(args: list[str], cwd: Path, stderr: Path) -> subprocess.Popen[str]:
    with stderr.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "multihost", *args],
            cwd=cwd,
            text=True,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )


def test_ctrl_c_stops_the_biggest_dry_run_at_once(home: Path, code: Path, tmp_path: Path) -> None:
    """100000 hosts (the most a host list may name) planned and printed: Ctrl-C ends it."""
    err = tmp_path / "err"
    proc = _spawn(
        ["run", "--hosts", "h[0-99999]", "--dry-run", "--script-dir", str(code), "--cmd", "true"],
        tmp_path,
        err,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("# code ")  # planned; now printing
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)  # drains what was printed before the signal
    assert proc.returncode == 130
    assert "Traceback" not in err.read_text()


def test_a_second_ctrl_c_on_run_says_how_to_stop_the_hosts(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    err = tmp_path / "err"
    cmd = "trap '' TERM; echo up; sleep 60"  # ignores the stop's TERM: the runner waits
    args = ["--script-dir", str(code), "--log-dir", str(logs), "--run-name", "twice"]
    proc = _spawn(["run", "--local", "2", *args, "--grace", "60", "--cmd", cmd], tmp_path, err)
    wait_for(
        lambda: (
            all("up" in t for t in host_logs(logs, "twice").values())
            and len(host_logs(logs, "twice")) == 2
        ),
        30,
        "both hosts running",
    )
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "SIGINT: stopping every host" in err.read_text(), 30, "the first stop")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    said = err.read_text()
    assert proc.returncode == 130, said
    last = said.strip().splitlines()[-1]
    assert last.startswith("multihost: second SIGINT: exiting now; jobs may still be running"), said
    kill_line = last.split("stop them with: ", 1)[1].rstrip(")")
    assert kill_line == f"multihost kill twice --log-dir {logs}"
    killed = cli([*shlex.split(kill_line)[1:], "--grace", "1"], cwd=tmp_path)  # what it says works
    assert killed.returncode == 0, killed.stderr
    assert [h["state"] for h in manifest(logs, "twice")["hosts"]] == ["killed", "killed"]


def _sweep(code: Path, logs: Path, grid: str) -> list[str]:
    return [
        "sweep",
        "--local",
        "1",
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        "sw",
        "--grace",
        "1",
        "--cmd",
        "echo up {x}; sleep {x}",
        "--grid",
        grid,
    ]


def test_ctrl_c_on_a_sweep_before_any_point_finished_names_no_results(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    err = tmp_path / "err"
    proc = _spawn(_sweep(code, logs, "x=60,61"), tmp_path, err)
    wait_for(
        lambda: any("up 60" in p.read_text() for p in logs.rglob("*.log")),
        30,
        "the first point running",
    )
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    said = err.read_text()
    assert proc.returncode == 130, said
    assert f"multihost: no point finished: no results in {logs / 'sw'}" in said
    assert "results:" not in out  # no files named
    assert "┃" not in out  # no empty table
    assert not (logs / "sw" / "results.csv").exists()


def test_ctrl_c_on_a_sweep_writes_what_finished(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    err = tmp_path / "err"
    proc = _spawn(_sweep(code, logs, "x=0,60"), tmp_path, err)
    wait_for(
        lambda: any("up 60" in p.read_text() for p in logs.rglob("*.log")),
        30,
        "the second point running",
    )
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.read_text()
    named = out.split("results: ", 1)[1].split()[:2]
    assert [Path(p.rstrip(",")).is_file() for p in named] == [True, True], out
    assert "\n0," in (logs / "sw" / "results.csv").read_text()  # the point that finished


def test_a_second_ctrl_c_on_a_sweep_says_how_to_stop_its_trials(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    err = tmp_path / "err"
    args = _sweep(code, logs, "x=60")
    args[args.index("--cmd") + 1] = "trap '' TERM; echo up {x}; sleep {x}"
    args[args.index("--grace") + 1] = "60"
    proc = _spawn(args, tmp_path, err)
    wait_for(
        lambda: any("up 60" in p.read_text() for p in logs.rglob("*.log")), 30, "the point running"
    )
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "SIGINT: stopping the sweep" in err.read_text(), 30, "the first stop")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    last = err.read_text().strip().splitlines()[-1]
    assert proc.returncode == 130, last
    assert f"(stop each with: multihost kill RUN --log-dir {logs}; RUN as multihost ls" in last
    listed = cli(["ls", "--log-dir", str(logs), "--json"])
    running = [r["run"] for r in json.loads(listed.stdout) if "running" in r.get("states", "")]
    assert len(running) == 1, listed.stdout
    killed = cli(["kill", running[0], "--log-dir", str(logs), "--grace", "1"])
    assert killed.returncode == 0, killed.stderr
