"""Everyday commands over ``--local`` (no root): attach and Ctrl-C, logs, ls, default names,
two local runs at once. Each test has its own HOME and log dir."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clitools import cli, host_logs, manifest
from tests.helpers import wait_for


def _run(code: Path, logs: Path, *extra: str, n: int = 2) -> list[str]:
    return [
        "run",
        "--local",
        str(n),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--grace",
        "2",
        *extra,
    ]


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    """The CLI started from Python, no shell: SIGINT is not ignored (see REFERENCE.md)."""
    return subprocess.Popen(
        [sys.executable, "-m", "multihost", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _states(logs: Path, run: str) -> list[str]:
    res = cli(["status", run, "--log-dir", str(logs), "--json", "--refresh"])
    assert res.returncode == 0, res.stderr
    return [r["state"] for r in json.loads(res.stdout)]


@pytest.mark.parametrize("sig", [signal.SIGHUP])
def test_signal_on_attach_detaches_and_the_run_goes_on(
    home: Path, code: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGHUP (the terminal went away) as Ctrl-C; test_cli_terminal types Ctrl-C at a terminal."""
    logs = tmp_path / "logs"
    cmd = 'while :; do echo "tick $JAX_PROCESS_ID"; sleep 0.2; done'
    res = cli([*_run(code, logs, "--detach", "--run-name", "bg"), "--cmd", cmd])
    assert res.returncode == 0, res.stderr
    proc = _spawn(["attach", "bg", "--log-dir", str(logs)])
    wait_for(
        lambda: "tick 0" in host_logs(logs, "bg").get("slice_0000_worker_0000", ""),
        20,
        "attach to stream",
    )
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "multihost kill bg" in err
    assert "stopping" not in err
    assert _states(logs, "bg") == ["running", "running"]
    killed = cli(["kill", "bg", "--log-dir", str(logs), "--grace", "2"])
    assert killed.returncode == 0, killed.stderr
    assert _states(logs, "bg") == ["killed", "killed"]


def test_attach_stop_on_interrupt_stops_every_host(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = cli([*_run(code, logs, "--detach", "--run-name", "st"), "--cmd", "echo up; sleep 30"])
    assert res.returncode == 0, res.stderr
    proc = _spawn(["attach", "st", "--log-dir", str(logs), "--stop-on-interrupt"])
    wait_for(
        lambda: "up" in host_logs(logs, "st").get("slice_0000_worker_0000", ""),
        20,
        "attach to stream",
    )
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopping every host" in err
    assert [h["state"] for h in manifest(logs, "st")["hosts"]] == ["killed", "killed"]


def test_logs_follow_interrupt_says_the_run_goes_on(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = cli([*_run(code, logs, "--detach", "--run-name", "fo"), "--cmd", "echo up; sleep 30"])
    assert res.returncode == 0, res.stderr
    proc = _spawn(["logs", "fo", "--log-dir", str(logs), "--follow"])
    wait_for(
        lambda: "up" in host_logs(logs, "fo").get("slice_0000_worker_0000", ""),
        20,
        "logs to follow",
    )
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopped following; the run goes on" in err
    assert "multihost kill fo" in err
    assert "stopping every host" not in err
    assert _states(logs, "fo") == ["running", "running"]
    cli(["kill", "fo", "--log-dir", str(logs), "--grace", "2"])


def test_logs_prints_host0_or_all_with_tail_and_grep(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    cmd = 'for i in 1 2 3 4 5; do echo "p$JAX_PROCESS_ID n$i"; done'
    assert cli([*_run(code, logs, "--run-name", "lg"), "--cmd", cmd]).returncode == 0
    base = ["logs", "lg", "--log-dir", str(logs)]
    assert cli(base).stdout == "".join(f"p0 n{i}\n" for i in range(1, 6))
    assert cli([*base, "--host", "s0/w1", "--tail", "2"]).stdout == "p1 n4\np1 n5\n"
    every = cli([*base, "--all", "--grep", "n[35]"]).stdout
    assert every == "[s0/w0] p0 n3\n[s0/w0] p0 n5\n[s0/w1] p1 n3\n[s0/w1] p1 n5\n"
    bad = cli([*base, "--grep", "("])
    assert bad.returncode == 2
    assert "not a regular expression" in bad.stderr


def test_default_names_are_unique_and_ls_fits(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    long_cmd = "echo " + "a-rather-long-argument " * 8
    for _ in range(3):
        res = cli([*_run(code, logs, n=1), "--cmd", long_cmd])
        assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in logs.iterdir())
    assert len(names) == 3
    listing = cli(["ls", "--log-dir", str(logs)], COLUMNS="80")
    lines = listing.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), listing.stdout
    assert len(lines) == 3 + 4  # one line per run: commands are cut, not wrapped
    assert "…" in listing.stdout
    rows = json.loads(cli(["ls", "--log-dir", str(logs), "--json"]).stdout)
    assert sorted(r["run"] for r in rows) == names
    assert rows[0]["command"] == long_cmd


def test_two_local_runs_get_their_own_coordinator_ports(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    cmd = 'echo "$JAX_COORDINATOR_ADDRESS"; sleep 1'
    procs = [_spawn([*_run(code, logs, "--run-name", f"r{i}", n=1), "--cmd", cmd]) for i in (1, 2)]
    for p in procs:
        p.communicate(timeout=30)
        assert p.returncode == 0
    addresses = {host_logs(logs, f"r{i}")["slice_0000_worker_0000"] for i in (1, 2)}
    assert len(addresses) == 2
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert "8476" not in "".join(addresses)


def test_rewriting_run_json_keeps_every_recorded_field(
    code: Path, tmp_path: Path, home: Path
) -> None:
    """status --refresh, attach and kill rewrite run.json: every field they do not own stays
    as the run recorded it (script dir, staging, the job and its env, settings)."""
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "rt",
            "--detach",
            "--record-env",
            "--env",
            "A=1",
            "--grace",
            "3",
            "--no-fail-fast",
            "--cmd",
            "sleep 30",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    before = manifest(logs, "rt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args in (["status", "rt", "--refresh"], ["kill", "rt"], ["attach", "rt"]):
        done = cli([*args, "--log-dir", str(logs)], cwd=elsewhere)
        assert "Traceback" not in done.stderr, done.stderr
        after = manifest(logs, "rt")
        owned = {"hosts", "updated", "first_failure", "interrupted"}
        assert {k: v for k, v in after.items() if k not in owned} == {
            k: v for k, v in before.items() if k not in owned
        }, args
        for old, new in zip(before["hosts"], after["hosts"], strict=True):
            for key in ("host", "log", "env", "bytes_sent"):  # state and times are theirs
                assert new[key] == old[key], (args, key)
    assert [h["state"] for h in manifest(logs, "rt")["hosts"]] == ["killed", "killed"]


def test_run_left_out_or_last_is_the_latest_run(home: Path, code: Path, tmp_path: Path) -> None:
    """``status``/``logs`` without RUN, and ``last`` anywhere, name the run written last; kill
    still wants it said; ``last`` is no run name; no runs at all is one line, exit 2."""
    logs = tmp_path / "logs"
    empty = cli(["status", "--log-dir", str(logs)])
    assert empty.returncode == 2
    assert empty.stderr.strip() == f"multihost: error: no runs in {logs} yet"
    for name in ("first", "second"):
        res = cli([*_run(code, logs, "--run-name", name), "--cmd", f"echo I am {name}"])
        assert res.returncode == 0, res.stderr
    status = cli(["status", "--log-dir", str(logs), "--json"])
    assert status.returncode == 0, status.stderr
    assert "the latest run: second" in status.stderr
    assert [r["state"] for r in json.loads(status.stdout)] == ["done", "done"]
    out = cli(["logs", "last", "--log-dir", str(logs)])
    assert out.returncode == 0
    assert "I am second" in out.stdout
    assert "I am first" not in out.stdout
    kill = cli(["kill", "--log-dir", str(logs)])
    assert kill.returncode == 2
    assert "RUN" in kill.stderr
    taken = cli([*_run(code, logs, "--run-name", "last"), "--cmd", "true"])
    assert taken.returncode == 2
    assert "'last' is not a run name" in taken.stderr
    assert not (logs / "last").exists()
