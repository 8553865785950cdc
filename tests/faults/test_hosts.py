"""Hosts that hang, vanish or refuse: noticed within bounds, named, and nothing left running."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.clitools import cli, fleet_run_args, host_logs, manifest, no_processes, spawn
from tests.helpers import wait_for

N = 3
pytestmark = pytest.mark.usefixtures("fresh_runs")


def _started(logs: Path, run: str) -> bool:
    texts = host_logs(logs, run).values()
    return len(texts) == N and all("up" in t for t in texts)


def test_frozen_sshd_noticed_within_bounds(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """sshd SIGSTOPped mid-run (a hung host): keepalives notice it within 15 s, reconnecting
    gives up on time (--reconnect-timeout 3), and fail-fast stops the others."""
    logs = tmp_path / "logs"
    args = fleet_run_args(
        ssh_fleet, code, logs, "frozen", "echo up; sleep 120", N, "--reconnect-timeout", "3"
    )
    proc = spawn(args)
    try:
        wait_for(lambda: _started(logs, "frozen"), 60, "every host to start")
        ssh_fleet.freeze_host(1)
        frozen_at = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - frozen_at
    finally:
        proc.kill()
        ssh_fleet.thaw_host(1)
    assert proc.returncode == 1, err
    hosts = manifest(logs, "frozen")["hosts"]
    assert [h["state"] for h in hosts] == ["killed", "lost", "killed"]
    assert "gave up reconnecting" in hosts[1]["error"]
    # 15 s to notice + 3 s of reconnecting + stopping the others (grace 2 s) + slack
    print(f"frozen sshd: the run ended {took:.1f} s after the freeze")
    assert took < 15 + 3 + 2 + 4, f"took {took:.1f} s"
    cli(["kill", "frozen", "--log-dir", str(logs), "--grace", "2"])
    wait_for(lambda: no_processes(ssh_fleet, N), 15, "every host's processes to be gone")


def test_refused_connection_starts_nothing(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    hosts = f"{ssh_fleet.aliases[0]},dead,{ssh_fleet.aliases[2]}"
    started = time.monotonic()
    res = cli(
        [
            "run",
            "--hosts",
            hosts,
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "refused",
            "--cmd",
            "sleep 30",
        ]
    )
    assert res.returncode == 1
    assert time.monotonic() - started < 15
    assert "s0/w1" in res.stderr
    assert "cannot connect" in res.stderr
    assert [h["state"] for h in manifest(logs, "refused")["hosts"]] == ["error"] * 3
    assert no_processes(ssh_fleet, N)


def test_silent_tcp_times_out_and_starts_nothing(code: Path, tmp_path: Path) -> None:
    """A host that accepts TCP but never speaks SSH (a hung sshd, a black-holed port)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    logs = tmp_path / "logs"
    try:
        started = time.monotonic()
        res = cli(
            [
                "run",
                "--hosts",
                f"127.0.0.1:{port}",
                "--connect-timeout",
                "2",
                "--script-dir",
                str(code),
                "--log-dir",
                str(logs),
                "--run-name",
                "silent",
                "--cmd",
                "true",
            ]
        )
        took = time.monotonic() - started
    finally:
        listener.close()
    assert res.returncode == 1
    assert "connect timed out after 2 s" in res.stderr
    assert took < 2 + 10
    assert manifest(logs, "silent")["hosts"][0]["state"] == "error"
