"""One schema, one planner: the CLI's flags and the API's keywords plan the same run, by the
planner's rules; each setting is one flag."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from multihost.api.keywords import ACCEPTED, plan_run
from multihost.cli import build_parser, parse, subparser
from multihost.defaults import GOOGLE_KEY
from multihost.errors import SettingError, UsageError
from multihost.options import RunOptions
from multihost.planner import DERIVED, Settings, plan
from multihost.settings.flag import Flag
from multihost.settings.schema import CONFIGURABLE, KEYWORDS, RUN_COMMAND, SETTINGS, flags_of


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
    # a pick's switches: --spot is --capacity spot
    picks = {f"--{c}" for f in flags_of(CONFIGURABLE) if f.kind == "pick" for c in f.choices or ()}
    assert set(longs) - {f"--{k}" for k in SETTINGS} == {"-h", "--json", *others, *picks}


RUN_FLAGS = {f.dest: f for f in flags_of(RUN_COMMAND)}
# read by name, but not by the planner: the events' keyword, --payload's interpreter (the
# CLI's), the config profile (layered under the settings before they reach the planner)
ELSEWHERE = {"stream", "python", "profile"}


def test_every_setting_of_the_schema_is_planned_and_a_keyword() -> None:
    planned = Settings.names()
    for dest in RUN_FLAGS.keys() - ELSEWHERE:
        assert dest in planned, f"--{RUN_FLAGS[dest].name}: no record of the planner reads it"
        assert dest in ACCEPTED or dest == "cmd", f"{dest}: not an API keyword"
    for name in KEYWORDS:
        assert name in planned, f"{name}: declared but not planned"
        assert name in ACCEPTED, f"{name}: declared but not a keyword"
    undeclared = planned - RUN_FLAGS.keys() - KEYWORDS.keys()
    assert not undeclared, f"read by the planner but not in the schema: {sorted(undeclared)}"


def _not_default(flag: Flag) -> list[str]:
    """``flag`` given a value other than its default, as typed."""
    if flag.kind in ("switch", "bool"):
        return [f"--no-{flag.name}" if flag.default else flag.option]
    if flag.choices:
        return [flag.option, next(c for c in flag.choices if c != flag.default)]
    return [flag.option, "true" if flag.name == "setup" else "7"]


def test_a_run_option_is_a_setting_of_its_own_name_or_derived(home: Path, tmp_path: Path) -> None:
    """Schema + one place: a new setting that a run reads is a flag (or a keyword) in the
    schema and a field of RunOptions, filled by its name; only the few DERIVED are worked out
    by the planner."""
    assert len(DERIVED) <= 12
    assert set(DERIVED) <= {f.name for f in fields(RunOptions)}
    base = ["run", "--local", "1", "--cmd", "true", "--script-dir", str(tmp_path)]
    defaults = plan(vars(parse(base))).options
    keyword_defaults = plan_run("true", {"local": 1, "script_dir": tmp_path}).options
    assert defaults == keyword_defaults  # the flags' defaults are the records' own
    for field in fields(RunOptions):
        if field.name in DERIVED:
            continue
        assert field.name in RUN_FLAGS or field.name in KEYWORDS, f"{field.name}: no setting"
        if field.name not in RUN_FLAGS:  # a keyword only (stage_timeout=, launch_timeout=)
            given: Any = {"local": 1, "script_dir": tmp_path, field.name: 7.0}
            assert getattr(plan_run("true", given).options, field.name) == 7.0, field.name
            continue
        flag = RUN_FLAGS[field.name]
        assert getattr(defaults, field.name) == getattr(keyword_defaults, field.name), flag.option
        options = plan(vars(parse([*base, *_not_default(flag)]))).options
        changed = getattr(options, field.name)
        assert changed != getattr(defaults, field.name), f"{flag.option} did not reach the run"
        by_keyword = plan_run("true", {"local": 1, "script_dir": tmp_path, field.name: changed})
        assert getattr(by_keyword.options, field.name) == changed, f"{field.name}= did not"


def test_a_flag_s_default_is_read_from_defaults_by_its_dest() -> None:
    """One source of defaults: a flag whose dest names a field of DEFAULTS shows that value,
    written nowhere else; the one that says ``default=None`` leaves it to the planner."""
    from multihost.defaults import DEFAULTS

    own = {f.name for f in fields(DEFAULTS)}
    for dest, flag in RUN_FLAGS.items():
        if dest in own and dest != "coordinator_port":  # the planner's: a free one with --local
            assert flag.default == getattr(DEFAULTS, dest), flag.option
    assert RUN_FLAGS["coordinator_port"].default is None
    assert Flag("grace", help=None).default == DEFAULTS.grace
    assert Flag("no-such-default", help=None).default is None
