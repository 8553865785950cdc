"""A changed host key is refused, and the message gives a command that really fixes it."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.clitools import cli

pytestmark = pytest.mark.usefixtures("fresh_runs")


def _config(fleet, tmp_path: Path, known: Path) -> Path:  # type: ignore[no-untyped-def]
    h0 = fleet.hosts[0]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host tofu\n  HostName {h0.address}\n  Port {h0.port}\n  User {h0.user}\n"
        f"  IdentityFile {fleet.key}\n  UserKnownHostsFile {known}\n"
    )
    return config


def _advice(stderr: str) -> list[str]:
    """The command the error message proposes (after 'with: ')."""
    return shlex.split(stderr.split("with: ", 1)[1].splitlines()[0])


def test_changed_key_in_trust_file_advice_works(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config(ssh_fleet, tmp_path, tmp_path / "empty_known")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    base = [
        "run",
        "--hosts",
        "tofu",
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--host-keys",
        "accept-new",
        "--cmd",
        "true",
    ]
    assert cli([*base, "--run-name", "a1"], **env).returncode == 0
    trust = tmp_path / "state" / "multihost" / "known_hosts"
    wrong = " ".join((ssh_fleet.dir / "wrong_key.pub").read_text().split()[:2])
    names = trust.read_text().split()[0]
    trust.write_text(f"{names} {wrong}\n")
    changed = cli([*base, "--run-name", "a2"], **env)
    assert changed.returncode == 1
    advice = _advice(changed.stderr)
    assert advice[:4] == ["multihost", "forget", "--hosts", "tofu"]
    fixed = cli(advice[1:], **env)
    assert fixed.returncode == 0, fixed.stderr
    assert "forgot 1 key(s)" in fixed.stdout
    assert cli([*base, "--run-name", "a3"], **env).returncode == 0


def test_changed_key_in_users_known_hosts_advice_works(
    ssh_fleet, code: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    h0 = ssh_fleet.hosts[0]
    known = tmp_path / "known_hosts"
    wrong = " ".join((ssh_fleet.dir / "wrong_key.pub").read_text().split()[:2])
    known.write_text(f"[{h0.address}]:{h0.port} {wrong}\n")
    config = _config(ssh_fleet, tmp_path, known)
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    base = [
        "run",
        "--hosts",
        "tofu",
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--host-keys",
        "accept-new",
        "--cmd",
        "true",
    ]
    changed = cli([*base, "--run-name", "u1"], **env)
    assert changed.returncode == 1
    advice = _advice(changed.stderr)
    assert advice[:2] == ["ssh-keygen", "-R"]
    assert advice[-2:] == ["-f", str(known)]
    subprocess.run(advice, check=True, capture_output=True)
    again = cli([*base, "--run-name", "u2"], **env)
    assert again.returncode == 0, again.stderr
