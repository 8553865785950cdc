"""Defaults from config files: the user's file (XDG), the project's [tool.multihost], profiles in
either; flags win; bad files are one line and exit 2; ``multihost config`` names each source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multihost.cli import parse
from multihost.config import ConfigError, user_config_path
from multihost.errors import SettingError
from tests.clitools import cli

PYPROJECT = """\
[project]
name = "demo"

[tool.multihost]
grace = 2
remote-dir = "~/project"
exclude = ["data/"]
script-dir = "src"

[tool.multihost.profiles.pod]
grace = 4
prefix = "pod"
zone = "us-west4-a"
env = { XLA_FLAGS = "--xla_dump_to=/tmp/d" }
"""
USER = """\
grace = 1
stream = "all"
connect-timeout = 7

[profiles.pod]
grace = 3
project = "my-project"
quick-auth = false

[profiles.lab]
hosts = "lab.txt"
fail-fast = false
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME and XDG_CONFIG_HOME, and a project with a pyproject as the current dir."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "multihost").mkdir(parents=True)
    (tmp_path / "xdg" / "multihost" / "config.toml").write_text(USER)
    (tmp_path / "xdg" / "multihost" / "lab.txt").write_text("10.0.0.1\n10.0.0.2\n")
    project = tmp_path / "project"
    (project / "src" / "deep").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.chdir(project / "src" / "deep")
    return tmp_path


def _run(*extra: str) -> list[str]:
    return ["run", "--cmd", "true", *extra]


@pytest.mark.usefixtures("home")
def test_precedence_flags_profile_project_user_defaults(home: Path) -> None:
    assert parse(_run("--local", "1", "--profile", "pod", "--grace", "5")).grace == 5  # flag
    assert parse(_run("--local", "1", "--profile", "pod")).grace == 4  # the project's profile
    assert parse(_run("--local", "1")).grace == 2  # the project's table
    assert parse(_run("--local", "1")).stream == "all"  # the user's file
    assert parse(_run("--local", "1")).reconnect_timeout == 300  # defaults.py
    (home / "project" / "pyproject.toml").unlink()
    assert parse(_run("--local", "1", "--profile", "pod")).grace == 3  # the user's profile
    assert parse(_run("--local", "1")).grace == 1


@pytest.mark.usefixtures("home")
def test_values_are_typed_and_paths_are_relative_to_their_file(home: Path) -> None:
    args = parse(_run("--local", "1", "--profile", "pod"))
    assert args.script_dir == home / "project" / "src"
    assert args.exclude == ["data/"]
    assert args.env == ["XLA_FLAGS=--xla_dump_to=/tmp/d"]
    assert args.connect_timeout == 7.0
    assert (args.prefix, args.local) == (None, 1)  # a fleet flag replaces the profile's fleet
    pod = parse(_run("--profile", "pod"))
    assert (pod.prefix, pod.zone, pod.project) == ("pod", "us-west4-a", "my-project")
    assert pod.quick_auth is False  # a switch that is also MULTIHOST_QUICK_AUTH
    assert parse(_run("--profile", "pod", "--quick-auth")).quick_auth is True
    assert parse(_run("--local", "1")).quick_auth is True  # defaults.py
    lab = parse(_run("--profile", "lab"))
    assert lab.hosts == str(home / "xdg" / "multihost" / "lab.txt")
    assert lab.fail_fast is False
    assert parse(_run("--profile", "lab", "--fail-fast")).fail_fast is True  # a flag turns it back
    flags_add = parse(_run("--local", "1", "--exclude", "*.bin"))
    assert flags_add.exclude == ["data/", "*.bin"]


def test_user_file_defaults_to_home_config(tmp_path: Path) -> None:
    assert user_config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == (
        tmp_path / "multihost" / "config.toml"
    )
    assert user_config_path({}) == Path.home() / ".config" / "multihost" / "config.toml"


def test_script_dir_finds_its_project(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(home)
    assert parse(_run("--local", "1")).grace == 1  # no project here: the user's file
    code = str(home / "project" / "src")
    assert parse(_run("--local", "1", "--script-dir", code)).grace == 2


def test_config_command_names_each_source(home: Path) -> None:
    res = cli(
        ["config", "--profile", "pod", "--zone", "z", "--json"],
        cwd=home / "project",
        HOME=str(home / "home"),
        XDG_CONFIG_HOME=str(home / "xdg"),
    )
    assert res.returncode == 0, res.stderr
    rows = {r["key"]: (r["value"], r["source"]) for r in json.loads(res.stdout)["settings"]}
    project = f"{home / 'project' / 'pyproject.toml'} [tool.multihost"
    assert rows["zone"] == ("z", "flag")
    assert rows["grace"] == (4.0, f"{project}.profiles.pod]")
    assert rows["remote-dir"] == ("~/project", f"{project}]")
    assert rows["project"][1] == f"{home / 'xdg' / 'multihost' / 'config.toml'} [profiles.pod]"
    assert rows["connect-timeout"] == (7.0, str(home / "xdg" / "multihost" / "config.toml"))
    assert rows["megascale-port"] == (8081, "default")
    text = cli(
        ["config"], cwd=home / "project", HOME=str(home / "home"), XDG_CONFIG_HOME=str(home / "xdg")
    ).stdout
    assert f'remote-dir = "~/project"  # {project}]' in text.splitlines()


def test_help_shows_the_configured_default(home: Path) -> None:
    text = cli(
        ["run", "--help"],
        cwd=home / "project",
        HOME=str(home / "home"),
        XDG_CONFIG_HOME=str(home / "xdg"),
        COLUMNS="400",
    ).stdout
    assert "(default ~/project, from " in text
    assert "under the remote home (default ~/project" in text  # the flag's own note replaced


def test_a_profile_reaches_the_run(home: Path) -> None:
    """--dry-run prints what each host is sent: the profile's hosts, env and remote dir."""
    project = home / "project"
    with (project / "pyproject.toml").open("a") as f:
        f.write(
            '\n[tool.multihost.profiles.two]\nhosts = "10.9.9.1,10.9.9.2"\nenv = ["STEP=profile"]\n'
        )
    res = cli(
        ["run", "--profile", "two", "--dry-run", "--cmd", "echo $STEP"],
        cwd=project,
        HOME=str(home / "home"),
        XDG_CONFIG_HOME=str(home / "xdg"),
    )
    assert res.returncode == 0, res.stderr
    assert "### s0/w1 (10.9.9.2) process 1" in res.stdout
    assert "export STEP=profile" in res.stdout
    assert 'cd "$HOME"/project/code/' in res.stdout


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("conect-timeout = 3\n", "config.toml conect-timeout", "did you mean connect-timeout?"),
        ('grace = "soon"\n', "config.toml grace", "not a number"),
        ("kill-stale = 1\n", "config.toml kill-stale", "true or false"),
        ("[profiles.x]\nstream = 'everything'\n", "[profiles.x] stream", "one of host0"),
        ("[profiles.x]\nenv = ['no equals']\n", "[profiles.x] env", "NAME=VALUE"),
        ("profiles = 3\n", "[profiles]", "one per profile"),
        ("grace = = 1\n", "config.toml: not a valid TOML file", "line 1"),
    ],
)
@pytest.mark.usefixtures("home")
def test_a_bad_file_names_file_and_key(home: Path, text: str, where: str, says: str) -> None:
    (home / "xdg" / "multihost" / "config.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        parse(_run("--local", "1"))
    assert where in str(caught.value)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_bad_file_is_one_line_and_exit_2(home: Path) -> None:
    (home / "xdg" / "multihost" / "config.toml").write_text("[profiles.x]\ngrace = -1\n")
    logs = home / "logs"
    env = {"HOME": str(home / "home"), "XDG_CONFIG_HOME": str(home / "xdg")}
    res = cli(
        ["run", "--local", "1", "--log-dir", str(logs), "--cmd", "true"],
        cwd=home / "project",
        **env,
    )
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"multihost: error: {home / 'xdg' / 'multihost' / 'config.toml'} [profiles.x] grace: "
        "must be positive: '-1'"
    ]
    assert not logs.exists()  # nothing started
    assert cli(["ls", "--log-dir", str(logs)], **env).returncode == 0  # ls reads no config


@pytest.mark.usefixtures("home")
def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no profile 'nope' .*profiles: lab, pod\)"):
        parse(_run("--profile", "nope"))


def test_the_api_takes_a_profile_too(home: Path) -> None:
    """``multihost.run(..., profile=)`` plans from the same layers; keywords win."""
    from multihost.api.runs import plan_run

    plan = plan_run("true", {"profile": "pod", "local": 1, "env": {"MINE": "1"}, "grace": 9})
    assert plan.fleet.local  # the given fleet replaces the profile's prefix
    assert plan.options.grace == 9  # a keyword over the profile's 4
    assert plan.options.script_dir == home / "project" / "src"
    assert plan.options.excludes == ("data/",)
    assert plan.options.ssh.connect_timeout == 7.0
    assert plan.options.ssh.quick_auth is False  # the profile's, down to the transport
    assert plan_run("true", {"local": 1}).options.ssh.quick_auth is True
    assert plan.options.stale == "off"
    assert plan.job.remote_dir == "~/project"
    assert plan.job.env == {"XLA_FLAGS": "--xla_dump_to=/tmp/d", "MINE": "1"}
    with pytest.raises(ConfigError, match="no profile 'nope'"):
        plan_run("true", {"profile": "nope", "local": 1})


def test_a_relative_remote_dir_is_under_the_remote_users_home(home: Path) -> None:
    """From the config file, a flag (its type) or the API's keyword (the planner): ``work`` is
    ``~/work`` on each host; ``~USER`` is refused in words."""
    from multihost.api.runs import plan_run

    pyproject = home / "project" / "pyproject.toml"
    pyproject.write_text(PYPROJECT.replace('remote-dir = "~/project"', 'remote-dir = "work"'))
    assert plan_run("true", {"profile": "pod", "local": 1}).job.remote_dir == "~/work"
    assert parse(_run("--local", "1", "--remote-dir", "./mh")).remote_dir == "~/mh"
    assert plan_run("true", {"local": 1, "remote_dir": "a b"}).job.remote_dir == "~/a b"
    with pytest.raises(SettingError, match="remote_dir: ~USER is not expanded"):
        plan_run("true", {"local": 1, "remote_dir": "~alice/mh"})
