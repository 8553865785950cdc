"""Bad input: one line, exit 2, never a traceback. Plus --dry-run and the public API."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import multihost
from tests.clitools import cli


def test_exported_names() -> None:
    assert sorted(multihost.__all__) == [
        "CallResult",
        "ConnectError",
        "ConnectTimeout",
        "DiscoveryError",
        "DryRun",
        "EnvFailed",
        "Fleet",
        "FleetSnapshot",
        "Host",
        "HostError",
        "HostKeyError",
        "HostLost",
        "HostPreview",
        "HostResult",
        "InventoryError",
        "Job",
        "JobHandle",
        "MultihostError",
        "Pod",
        "PullResult",
        "RemoteCallError",
        "RemoteError",
        "RunOptions",
        "RunResult",
        "SSHOptions",
        "Session",
        "StackReport",
        "State",
        "SweepResult",
        "UsageError",
        "WarmError",
        "attach",
        "autodown",
        "call",
        "down",
        "gc",
        "jobs",
        "kill",
        "make_fleet",
        "plot",
        "pod",
        "pods",
        "pull",
        "pull_logs",
        "run",
        "run_async",
        "run_sweep",
        "session",
        "stacks",
        "status",
        "submit_job",
        "top",
        "up",
    ]
    for name in multihost.__all__:
        assert getattr(multihost, name) is not None
    # the function keeps its name beside the subpackage of that name (imported as any is)
    importlib.import_module("multihost.pods.records")
    assert callable(multihost.pods)
    assert multihost.pods.__module__ == "multihost.api.pods"


def _bad(tmp_path: Path, *args: str) -> str:
    res = cli(["run", *args], cwd=tmp_path, timeout=30)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert lines[0].startswith("multihost: error:")
    return lines[0]


def test_missing_script_dir(tmp_path: Path) -> None:
    line = _bad(tmp_path, "--local", "2", "--script-dir", "nope", "--cmd", "true")
    assert "nope" in line


def test_empty_host_list(tmp_path: Path) -> None:
    assert "empty" in _bad(tmp_path, "--hosts", ",", "--cmd", "true")


def test_malformed_inventory(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text("[[slices]]\nhosts = 5\n")
    assert "fleet.toml" in _bad(tmp_path, "--hosts", "fleet.toml", "--cmd", "true")


def test_env_without_equals(tmp_path: Path) -> None:
    assert "NAME=VALUE" in _bad(tmp_path, "--local", "1", "--env", "OOPS", "--cmd", "true")


@pytest.mark.parametrize(
    "args",
    [
        ["--local", "0", "--cmd", "true"],
        ["--local", "2"],
        ["--local", "2", "--hosts", "h0", "--cmd", "true"],
        ["--local", "2", "--cmd", "true", "--run-name", "../etc"],
        ["--local", "2", "--cmd", "true", "--timeout", "-3"],
        ["--hosts", "h0", "--ssh-config", "/nonexistent", "--cmd", "true"],
        ["--local", "2", "--cmd", "true", "--stream", "sideways"],
        ["--local", "2", "--cmd", "true", "--remote-dir", ""],
        ["--local", "2", "--cmd", "true", "--remote-dir", "/"],
    ],
)
def test_other_bad_input(tmp_path: Path, args: list[str]) -> None:
    _bad(tmp_path, *args)


def test_no_command_names_the_commands(tmp_path: Path) -> None:
    """``multihost`` alone, or a group alone (``multihost sandbox``): one line naming what
    could follow, not argparse's dest."""
    for argv, first in (([], "multihost needs a command: run, "), (["sandbox"], "sandbox needs")):
        res = cli(argv, cwd=tmp_path, timeout=30)
        assert res.returncode == 2
        assert res.stderr.startswith(f"multihost: error: {first}"), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


def test_unknown_subcommand(tmp_path: Path) -> None:
    res = cli(["fly"], cwd=tmp_path, timeout=30)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1


def test_dry_run_prints_env_and_commands(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("print(1)\n")
    res = cli(
        [
            "run",
            "--hosts",
            "u@10.9.9.9,h1:2200",
            "--dry-run",
            "--env",
            "K=v w",
            "--cmd",
            'echo "$K"',
            "--run-name",
            "dr",
        ],
        cwd=tmp_path,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "### s0/w0 (u@10.9.9.9) process 0" in out
    assert "### s0/w1 (h1:2200) process 1" in out
    assert "# JAX_COORDINATOR_ADDRESS=10.9.9.9:8476" in out
    assert "export K='v w'" in out
    assert "sh -c 'echo \"$K\"'" in out


def test_import_and_help_stay_light() -> None:
    """``import multihost`` and ``multihost --help`` import neither asyncssh nor rich."""
    for code in ("import multihost", "from multihost.cli import build_parser; build_parser()"):
        res = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            check=True,
        )
        heavy = [ln for ln in res.stderr.splitlines() if "asyncssh" in ln or "rich" in ln]
        assert heavy == [], (code, heavy[:3])
