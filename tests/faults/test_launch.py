"""A launch that fails on one host: the launch's gate holds every host, so nothing starts
anywhere and no run directory is left on any host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.clitools import cli, manifest


def test_full_disk_at_launch_starts_nothing_anywhere(
    code: Path, tmp_path: Path, small_disk: Any
) -> None:
    home = tmp_path / "home"
    hosts = home / ".cache" / "multihost" / "local"
    small_disk(hosts / "w1" / "runs", "4k")  # the claim fits; the run's files (the hook) do not
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--local",
            "3",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "full",
            "--cmd",
            'echo started > "$HOME"/started.$JAX_PROCESS_ID',
        ],
        HOME=str(home),
    )
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    record = manifest(logs, "full")["hosts"]
    assert record[1]["state"] == "error"
    assert "launch failed" in record[1]["error"]
    why = record[1]["error"]  # the shell's own word: dash's printf says "I/O error"
    assert "I/O error" in why or "No space left" in why, why
    for other in (0, 2):
        assert record[other]["state"] == "error"
        assert record[other]["error"] == "not started: s0/w1 could not be launched"
        assert not (hosts / f"w{other}" / "runs" / "full").exists()
    assert not (hosts / "w1" / "runs" / "full").exists()  # its own launch took it with it
    assert not list(home.glob("started.*"))  # no job ran, not even for a moment
