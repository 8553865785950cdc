"""Everyday-interface checks that need real OpenSSH hosts: a busy coordinator port on host 0."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.clitools import cli, fleet_run_args

pytestmark = pytest.mark.usefixtures("fresh_runs")


def test_busy_coordinator_port_on_host0_is_refused(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.txt").write_text("x\n")
    logs = tmp_path / "logs"
    with socket.socket() as s:  # the loopback hosts share this machine's ports
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        args = fleet_run_args(ssh_fleet, code, logs, "busy", "true", 2)
        res = cli([*args, "--coordinator-port", str(port)])
    assert res.returncode == 2, res.stderr
    assert f"coordinator port {port} is busy on host 0 (s0/w0" in res.stderr
    assert "Traceback" not in res.stderr
    assert not logs.exists()
    free = cli(fleet_run_args(ssh_fleet, code, logs, "free", "true", 2))
    assert free.returncode == 0, free.stderr
