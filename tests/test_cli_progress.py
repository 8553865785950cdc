"""Staging a large code dir (and pulling files back) shows bytes, bytes/s and hosts done on a
terminal (a pseudo-terminal here), and nothing of the kind when output is not a terminal."""

from __future__ import annotations

import os
from pathlib import Path

import pexpect
import pytest

from tests.clitools import REPO, cli
from tests.test_cli_terminal import screen, spawn


@pytest.fixture
def workdir(tmp_path: Path, code: Path) -> Path:
    """The test's dir, with a private ``home`` and ``code`` holding 4 MiB that does not
    compress."""
    (tmp_path / "home").mkdir()
    (code / "blob.bin").write_bytes(os.urandom(4 << 20))
    return tmp_path


def test_staging_and_pull_progress_on_a_terminal(workdir: Path) -> None:
    args = [
        "run",
        "--local",
        "2",
        "--script-dir",
        "code",
        "--log-dir",
        "logs",
        "--run-name",
        "big",
        "--cmd",
        "echo ran",
    ]
    child = spawn(args, workdir / "home", workdir)
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    assert "staging code" in raw
    assert "2/2 hosts" in raw  # hosts done
    assert "/8.0 MiB" in raw  # bytes of every host together
    assert "MiB/s" in raw or "KiB/s" in raw or "?" in raw
    shown = screen(raw)
    assert "ran" in shown
    assert not any("staging code" in row for row in shown), shown  # gone once staged

    # Pulling the big file back: the same kind of bar while copying, then the summary.
    child = spawn(["pull", "big", "--log-dir", "logs", "blob.bin"], workdir / "home", workdir)
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    assert "pulling" in raw
    assert "hosts" in raw
    shown = screen(raw)
    assert not any("pulling" in row for row in shown), shown
    assert "pulled 2 file(s), 8.0 MiB from 2 of 2 host(s) into multihost-pull/big" in shown
    got = workdir / "multihost-pull" / "big" / "s0" / "w1" / "blob.bin"
    assert got.read_bytes() == (workdir / "code" / "blob.bin").read_bytes()


def test_run_pull_progress_on_a_terminal(workdir: Path) -> None:
    """``run --pull``: the pull is the run's last step, drawn above its status line, then the
    same lines as ``multihost pull`` after the summary."""
    args = [
        "run",
        "--local",
        "2",
        "--script-dir",
        "code",
        "--log-dir",
        "logs",
        "--run-name",
        "rp",
        "--pull",
        "blob.bin",
        "--cmd",
        "echo ran",
    ]
    child = spawn(args, workdir / "home", workdir)
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    assert "pulling" in raw
    shown = screen(raw)
    assert not any("pulling" in row for row in shown), shown  # gone once pulled
    assert "pulled 2 file(s), 8.0 MiB from 2 of 2 host(s) into multihost-pull/rp" in shown
    got = workdir / "multihost-pull" / "rp" / "s0" / "w0" / "blob.bin"
    assert got.read_bytes() == (workdir / "code" / "blob.bin").read_bytes()


def test_no_progress_when_not_a_terminal(workdir: Path) -> None:
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            "code",
            "--log-dir",
            "logs",
            "--run-name",
            "big",
            "--cmd",
            "echo ran",
        ],
        cwd=workdir,
        HOME=str(workdir / "home"),
        PYTHONPATH=str(REPO),
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ran\n"
    assert "\x1b" not in res.stderr
    assert "staging code" not in res.stderr
