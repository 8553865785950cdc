"""Bad input: one line, exit 2, never a traceback. Plus --dry-run and the public API."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import multihost
from multihost.cli import main
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


@pytest.fixture
def bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., str]:
    """``bad(*args)``: ``multihost run ARGS`` refused in this process (``main(argv)``, the CLI's
    own entry; a Python per row cost ~0.25 s of CPU each, and the real process is checked
    below and in tests/test_cli_bad_input.py): exit 2, one line, no traceback."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")

    def check(*args: str) -> str:
        with pytest.raises(SystemExit) as info:
            main(["run", *args])
        err = capsys.readouterr().err
        assert info.value.code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "Traceback" not in err
        assert lines[0].startswith("multihost: error:")
        return lines[0]

    return check


def test_missing_script_dir(bad: Callable[..., str]) -> None:
    line = bad("--local", "2", "--script-dir", "nope", "--cmd", "true")
    assert "nope" in line


def test_empty_host_list(bad: Callable[..., str]) -> None:
    assert "empty" in bad("--hosts", ",", "--cmd", "true")


def test_malformed_inventory(tmp_path: Path, bad: Callable[..., str]) -> None:
    (tmp_path / "fleet.toml").write_text("[[slices]]\nhosts = 5\n")
    assert "fleet.toml" in bad("--hosts", "fleet.toml", "--cmd", "true")


def test_env_without_equals(bad: Callable[..., str]) -> None:
    assert "NAME=VALUE" in bad("--local", "1", "--env", "OOPS", "--cmd", "true")


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
def test_other_bad_input(bad: Callable[..., str], args: list[str]) -> None:
    bad(*args)


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
