"""``multihost pull`` from real OpenSSH hosts (SFTP): per-host files and globs, a missing or
unreadable file and an unreachable host named while the rest arrive, re-runs skip, and names
that would leave the folder refused."""

from __future__ import annotations

from pathlib import Path

import pytest

import multihost
from multihost.errors import UsageError
from tests.clitools import cli, fleet_run_args, manifest, no_processes
from tests.helpers import wait_for

N = 4
# Every host: out/p.txt and a sub dir; all but host 2 a metrics file; host 1 an unreadable one.
WRITE = (
    'mkdir -p out/sub && echo "p $JAX_PROCESS_ID" > out/p.txt && echo deep > out/sub/d.txt && '
    '{ [ "$JAX_PROCESS_ID" = 2 ] || echo "{}" > "m-$JAX_PROCESS_ID.json"; } && '
    '{ [ "$JAX_PROCESS_ID" != 1 ] || { echo secret > out/locked && chmod 000 out/locked; }; }'
)

pytestmark = pytest.mark.usefixtures("fresh_runs")


def test_pull_over_ssh(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    res = cli(fleet_run_args(ssh_fleet, code, logs, "pl", WRITE, N))
    assert res.returncode == 0, res.stderr
    dest = tmp_path / "got"
    results = multihost.pull("pl", ["out", "*.json"], to=dest, log_dir=logs)
    assert [r.ok for r in results] == [True, False, False, True]
    assert any("out/locked: permission denied" in e for e in results[1].errors)
    assert results[2].errors == ("no match for '*.json'",)
    for i in range(N):
        host = dest / "s0" / f"w{i}"
        assert (host / "out" / "p.txt").read_text() == f"p {i}\n"
        assert (host / "out" / "sub" / "d.txt").read_text() == "deep\n"
        assert (host / f"m-{i}.json").exists() == (i != 2)
        assert not (host / "out" / "locked").exists()
    staged = ssh_fleet.hosts[0].home / ".multihost" / "code" / manifest(logs, "pl")["code_hash"]
    local = dest / "s0" / "w0" / "out" / "p.txt"
    assert abs(local.stat().st_mtime - (staged / "out" / "p.txt").stat().st_mtime) < 0.001

    # Again: nothing is copied; with one host unreachable, it is named and the rest still come.
    # A glob that leaves the work dir is refused before any host is asked.
    with pytest.raises(UsageError, match="leaves the run's work dir"):
        multihost.pull("pl", ["out/p.txt", "../*/out/sub"], to=dest, log_dir=logs)
    ssh_fleet.stop_host(3)
    try:
        again = multihost.pull("pl", ["out/p.txt"], to=dest, log_dir=logs)
    finally:
        ssh_fleet.start_host(3)
    assert [(r.files, r.skipped, r.ok) for r in again[:3]] == [(0, 1, True)] * 3
    assert len(again[3].errors) == 1
    assert "cannot connect" in again[3].errors[0]
    assert not list(tmp_path.glob("*/sub"))
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "no process left on the hosts")
