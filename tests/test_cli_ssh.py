"""Everyday-interface checks that need real OpenSSH hosts: a busy coordinator port on host 0."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.clitools import cli, fleet_run_args

pytestmark = pytest.mark.usefixtures("fresh_runs")


@pytest.mark.parametrize("via", ["direct", "peer"])
def test_busy_coordinator_port_on_host0_is_refused(
    ssh_fleet, code: Path, tmp_path: Path, via: str
) -> None:  # type: ignore[no-untyped-def]
    """Checked on host 0 while the hosts are prepared (no round trip before the run); nothing
    starts, no claim is left on any host (the same name runs next), no local log dir."""
    logs = tmp_path / "logs"
    args = fleet_run_args(ssh_fleet, code, logs, "busy", "true", 3, "--stage-via", via)
    with socket.socket() as s:  # the loopback hosts share this machine's ports
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        res = cli([*args, "--coordinator-port", str(port)])
    assert res.returncode == 2, res.stderr
    assert f"coordinator port {port} is busy on host 0 (s0/w0" in res.stderr
    assert "Traceback" not in res.stderr
    assert not logs.exists()
    free = cli(args)
    assert free.returncode == 0, free.stderr
