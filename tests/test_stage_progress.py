"""Staging a large code dir shows bytes, bytes/s and hosts done on a terminal (a pseudo-
terminal here), and nothing of the kind when output is not a terminal."""

from __future__ import annotations

import os
from pathlib import Path

import pexpect
import pytest

from tests.clitools import REPO, cli
from tests.test_terminal import screen, spawn


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "blob.bin").write_bytes(os.urandom(4 << 20))  # does not compress
    return tmp_path


def test_staging_progress_on_a_terminal(workdir: Path) -> None:
    args = ["run", "--local", "2", "--script-dir", "code", "--log-dir", "logs", "--run-name",
            "big", "--cmd", "echo ran"]  # fmt: skip
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


def test_no_progress_when_not_a_terminal(workdir: Path) -> None:
    res = cli(["run", "--local", "2", "--script-dir", "code", "--log-dir", "logs",
               "--run-name", "big", "--cmd", "echo ran"], cwd=workdir,
              HOME=str(workdir / "home"), PYTHONPATH=str(REPO))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ran\n"
    assert "\x1b" not in res.stderr
    assert "staging code" not in res.stderr
