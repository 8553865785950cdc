"""The fault matrix runs each case over ``--local`` (no root) and over the real sshd fleet."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.clitools import fleet_run_args


@dataclass(frozen=True)
class Where:
    """Where a fault case runs: its run arguments, the hosts' run dirs, what is left there."""

    kind: str  # "local" or "ssh"
    home: Path  # the local workers' HOME (local) — unused over ssh
    fleet: Any = None

    def args(
        self, code: Path, logs: Path, run: str, cmd: str, *extra: str, n: int = 2
    ) -> list[str]:
        if self.kind == "local":
            return [
                "run",
                "--local",
                str(n),
                "--script-dir",
                str(code),
                "--log-dir",
                str(logs),
                "--run-name",
                run,
                "--grace",
                "2",
                *extra,
                "--cmd",
                cmd,
            ]
        return fleet_run_args(self.fleet, code, logs, run, cmd, n, *extra)

    def run_dir(self, i: int, run: str) -> Path:
        """Host ``i``'s directory of the run (its pid, exit and log files)."""
        if self.kind == "local":
            return self.home / ".cache" / "multihost" / "local" / f"w{i}" / "runs" / run
        return Path(self.fleet.hosts[i].home) / ".multihost" / "runs" / run

    def leftovers(self, run: str, n: int = 2) -> list[int]:
        """Live processes of the run on its hosts, read from /proc (not from the runner): any
        process whose environment names one of the run's directories."""
        marks = [f"MULTIHOST_RUN_DIR={self.run_dir(i, run)}".encode() for i in range(n)]
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and any(m in env for m in marks):
                found.append(int(entry))
        return found


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def where(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Where:
    """Each fault case once over ``--local`` and once over the first hosts of the sshd fleet."""
    if request.param == "local":
        monkeypatch.setenv("HOME", str(tmp_path))
        return Where("local", tmp_path)
    fleet = request.getfixturevalue("ssh_fleet")
    request.getfixturevalue("fresh_runs")
    return Where("ssh", tmp_path, fleet)


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """Mount a 64 KiB tmpfs where asked (a full disk); needs root, like the SSH tier."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must run the full-disk faults, but it is not root")
        pytest.skip("mounting a small tmpfs needs root")
    mounted: list[Path] = []

    def mount(where: Path, size: str = "64k") -> Path:
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True
        )
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)
