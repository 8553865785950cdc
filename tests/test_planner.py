"""One schema, one planner: the CLI's flags and the API's keywords plan the same run, by the
planner's rules; each setting is one flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from multihost.cli import build_parser, parse, subparser
from multihost.defaults import GOOGLE_KEY
from multihost.errors import SettingError, UsageError
from multihost.keywords import plan_run
from multihost.planner import Settings, plan
from multihost.settings.schema import CONFIGURABLE, SETTINGS, flags_of


def test_flags_and_keywords_make_the_same_plan(home: Path, tmp_path: Path) -> None:
    flags = [
        "run",
        "--local",
        "2",
        "--cmd",
        "true",
        "--run-name",
        "same",
        "--script-dir",
        str(tmp_path),
        "--env",
        "A=1",
        "--exclude",
        "data/",
        "--grace",
        "3",
        "--log-dir",
        str(tmp_path / "logs"),
        "--coordinator-port",
        "40001",
        "--kill-stale",
    ]
    from_cli = plan(vars(parse(flags)))
    from_api = plan_run(
        "true",
        {
            "local": 2,
            "run_name": "same",
            "script_dir": tmp_path,
            "env": {"A": "1"},
            "excludes": ["data/"],
            "grace": 3,
            "log_dir": tmp_path / "logs",
            "coordinator_port": 40001,
            "kill_stale": True,
        },
    )
    assert from_cli == from_api
    assert from_cli.options.stale == "kill"
    assert from_cli.options.ssh.host_keys == "strict"
    assert from_cli.options.ssh.fallback_identity is None


def test_the_rules_are_the_planner_s(home: Path, tmp_path: Path) -> None:
    base = {"local": 1, "script_dir": tmp_path, "cmd": "true"}
    a, b = plan(base), plan(base)
    assert a.job.coordinator_port != 8476  # local workers: a free port each time
    assert a.job.run_name != b.job.run_name
    with pytest.raises(SettingError, match="ssh config nope does not exist"):
        plan({**base, "ssh_config": "nope"})
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        plan({**base, "script_dir": tmp_path / "nope"})
    with pytest.raises(UsageError, match="NAME=VALUE"):
        plan({**base, "env": ["OOPS"]})
    with pytest.raises(SettingError, match="not UTF-8 text"):  # refused before staging
        plan({**base, "cmd": "echo \udcff"})
    with pytest.raises(SettingError, match="not UTF-8 text"):
        plan({**base, "env": {"A": "\udcff"}})
    (tmp_path / "big").write_bytes(b"x" * 2048)
    with pytest.raises(UsageError, match="biggest: big"):
        plan({**base, "max_stage_bytes": 1024})
    assert Settings.of({"grace": None, "command": "run"}) == Settings()  # None: not given
    assert GOOGLE_KEY.endswith("google_compute_engine")


def test_each_setting_is_one_flag_of_the_config_command() -> None:
    parser = subparser(build_parser(), "config")
    longs = [a.option_strings[0] for a in parser._actions]
    assert len(longs) == len(set(longs))
    assert {f"--{k}" for k in SETTINGS} <= set(longs)
    others = {f"--{f.name}" for f in flags_of(CONFIGURABLE) if not f.setting}
    assert set(longs) - {f"--{k}" for k in SETTINGS} == {"-h", "--json", *others}
