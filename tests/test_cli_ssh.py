"""Everyday-interface checks that need real OpenSSH hosts: a busy coordinator port on host 0, a
relative ``--remote-dir``."""

from __future__ import annotations

import secrets
import shutil
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


def test_a_relative_remote_dir_is_under_the_remote_users_home(
    ssh_fleet, code: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """``--remote-dir work/mh`` is ``~/work/mh`` on each host, as scp takes a relative path: the
    job runs in its staged code there (the wrapper and the job cd elsewhere first)."""
    folder = f"mh-rel-{secrets.token_hex(3)}"
    args = fleet_run_args(ssh_fleet, code, tmp_path / "logs", "rel", "cat x.txt; pwd", 2)
    res = cli([*args, "--remote-dir", f"{folder}/base"])
    try:
        assert res.returncode == 0, res.stderr
        for i, host in enumerate(ssh_fleet.hosts[:2]):
            log = (tmp_path / "logs" / "rel").glob(f"*_worker_{i:04d}.log")
            said = next(log).read_text().splitlines()
            assert said[0] == "staged"
            assert Path(said[1]).parent == host.home / folder / "base" / "code"
    finally:
        for host in ssh_fleet.hosts[:2]:
            shutil.rmtree(host.home / folder, ignore_errors=True)
