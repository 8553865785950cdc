"""Filtering an ssh config to the blocks that can apply to one host (pure, no SSH)."""

from __future__ import annotations

import getpass
from pathlib import Path

import asyncssh

from multihost.transport.sshconfig import config_for, expand_path, filtered_text, settings

CONFIG = """\
# global
ServerAliveInterval 5

Host h0
  HostName 127.0.0.2
  User u0
Host h1 h1-alt
  HostName 127.0.0.3
Host h* !h1
  Port 2222
Host *
  IdentitiesOnly yes
"""


def test_keeps_only_blocks_that_match(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(CONFIG)
    text = filtered_text(cfg, "h0")
    assert text is not None
    assert "ServerAliveInterval 5" in text
    assert "127.0.0.2" in text
    assert "127.0.0.3" not in text
    assert "Port 2222" in text
    assert "IdentitiesOnly" in text
    h1 = filtered_text(cfg, "H1")  # host patterns are case-insensitive
    assert h1 is not None
    assert "127.0.0.3" in h1
    assert "Port 2222" not in h1  # negated


def test_filtered_config_resolves_the_same(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(CONFIG)
    for alias in ("h0", "h1", "h1-alt", "h7", "other"):
        whole = asyncssh.SSHClientConnectionOptions(host=alias, config=[str(cfg)])
        cut = asyncssh.SSHClientConnectionOptions(host=alias, config=config_for((cfg,), alias))
        assert (whole.host, whole.port, whole.username) == (cut.host, cut.port, cut.username)
        assert whole.config.get("IdentitiesOnly") == cut.config.get("IdentitiesOnly")


def test_match_or_include_keeps_the_file_whole(tmp_path: Path) -> None:
    for extra in ("Match host h0\n  User x\n", "Include other\n", "CanonicalizeHostname yes\n"):
        cfg = tmp_path / "config"
        cfg.write_text(CONFIG + extra)
        assert filtered_text(cfg, "h0") is None
        assert config_for((cfg,), "h0") == [str(cfg)]


def test_settings_take_the_first_value_that_applies(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(CONFIG + "Host h0\n  Port 9999\n  UserKnownHostsFile ~/kh %d/kh2\n")
    found = settings((cfg,), "h0")
    assert found is not None
    assert found["port"] == "2222"  # from ``Host h* !h1``, read before the later block
    assert found["user"] == "u0"
    assert found["userknownhostsfile"] == "~/kh %d/kh2"
    h1 = settings((cfg,), "h1")
    assert h1 is not None
    assert "port" not in h1
    cfg.write_text(CONFIG + "Include other\n")
    assert settings((cfg,), "h0") is None  # asyncssh's own parse decides then


def test_expand_path_tokens() -> None:
    home = str(Path.home())
    assert expand_path("~/a") == f"{home}/a"
    assert expand_path("%d/b%%c") == f"{home}/b%c"
    assert expand_path("/x/%u") == f"/x/{getpass.getuser()}"
    assert expand_path("/x/%h") is None  # only asyncssh knows the host name it resolves


def test_proxy_jump_keeps_the_file_whole(tmp_path: Path) -> None:
    # asyncssh looks the jump host up in the same config, so its block must stay.
    cfg = tmp_path / "config"
    cfg.write_text(CONFIG + "Host far\n  ProxyJump h1\n")
    assert filtered_text(cfg, "far") is None
    assert filtered_text(cfg, "h0") is not None
