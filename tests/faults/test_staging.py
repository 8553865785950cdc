"""Staging that fails on a host: the real cause is shown, nothing half-written stays behind."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tests.clitools import cli, manifest


def test_full_disk_while_staging(code: Path, tmp_path: Path, small_disk: Any) -> None:
    home = tmp_path / "home"
    (code / "weights.bin").write_bytes(os.urandom(300_000))  # does not fit in 64 KiB
    worker1 = small_disk(home / ".cache" / "multihost" / "local" / "w1")
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
            "full",
            "--cmd",
            "echo started",
        ],
        HOME=str(home),
    )
    assert res.returncode == 1
    hosts = manifest(logs, "full")["hosts"]
    assert hosts[1]["state"] == "error"
    assert "staging failed" in hosts[1]["error"]
    # tar's own complaint, not only its summary (the kit goes first, then the code)
    assert re.search(r"Wrote only|Cannot write: No space left", hosts[1]["error"])
    assert "free space there: 0 KiB" in hosts[1]["error"]
    assert "s0/w1" in res.stderr
    assert list((worker1 / "code").glob("*")) == []  # no .incoming.* left
    assert list((worker1 / "kit").glob("*.*")) == []  # nor a kit's half-unpacked temp dir
    # both launches went out behind their code (core.prepare): both were held, nothing stays
    for w in ("w0", "w1"):
        assert not (home / ".cache" / "multihost" / "local" / w / "runs" / "full").exists()


def test_staging_counts_only_hosts_whose_staging_finished(
    ssh_fleet: Any, code: Path, tmp_path: Path, fresh_runs: None
) -> None:
    """A host never reached is failed, never "had it": fresh code on h0, h1 and a host where
    nothing listens, then the same code again (h0 and h1 have it now, 'dead' still not)."""
    (code / "fresh.txt").write_text(f"{tmp_path}\n")  # a code hash no host has yet
    logs = tmp_path / "logs"

    def run(name: str) -> dict[str, Any]:
        res = cli(
            [
                "run",
                "--hosts",
                "h0,h1,dead",
                "--ssh-config",
                str(ssh_fleet.ssh_config),
                "--script-dir",
                str(code),
                "--log-dir",
                str(logs),
                "--run-name",
                name,
                "--connect-timeout",
                "3",
                "--cmd",
                "true",
            ]
        )
        assert res.returncode == 1, res.stderr
        assert "had it" not in res.stderr or "2 had it" in res.stderr, res.stderr
        staging: dict[str, Any] = manifest(logs, name)["staging"]
        return staging

    first = run("cnt1")
    assert first["present"] == 0
    second = run("cnt2")
    assert second["present"] == 2
