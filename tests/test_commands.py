"""Per-host env and the exact remote command text: pure, checked without SSH."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from multihost.errors import UsageError
from multihost.model import Fleet, Host, Job
from multihost.remote.commands import (
    Paths,
    check_run_name,
    host_env,
    job_script,
    parse_env,
    plan_hosts,
    shell_path,
    watch_command,
)
from multihost.runs.stream import Exit, parse_watch_end
from multihost.sources.inventory import parse_host_list


def test_env_single_slice() -> None:
    fleet = parse_host_list("h0,h1,h2")
    job = Job(command="true", run_name="r1", env={"EXTRA": "a b"}, coordinator_port=9000)
    env = host_env(fleet.hosts[2], fleet, job, {0: "10.0.0.7"})
    assert env["JAX_COORDINATOR_ADDRESS"] == "10.0.0.7:9000"
    assert env["JAX_PROCESS_ID"] == "2"
    assert env["JAX_PROCESS_COUNT"] == "3"
    assert env["MULTIHOST_RUN"] == "r1"
    assert (env["MULTIHOST_SLICE_ID"], env["MULTIHOST_WORKER_ID"]) == ("0", "2")
    assert env["MULTIHOST_NUM_SLICES"] == "1"
    assert env["EXTRA"] == "a b"
    assert not any(k.startswith("MEGASCALE") for k in env)


def test_env_multislice_numbering_and_megascale() -> None:
    fleet = Fleet.from_slices([[Host("a0"), Host("a1")], [Host("b0"), Host("b1")]])
    job = Job(command="true", run_name="r", megascale_port=8081)
    env = host_env(fleet.hosts[3], fleet, job, {0: "10.0.0.2"})
    assert env["JAX_PROCESS_ID"] == "3"  # slice 1 × 2 workers + worker 1
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.2:8081"
    assert env["MEGASCALE_NUM_SLICES"] == "2"
    assert env["MEGASCALE_SLICE_ID"] == "1"
    assert env["MEGASCALE_PORT"] == "8081"


def test_user_env_overrides_last() -> None:
    fleet = parse_host_list("h0")
    env = host_env(fleet.hosts[0], fleet, Job("true", "r", env={"JAX_PROCESS_ID": "9"}), {})
    assert env["JAX_PROCESS_ID"] == "9"


def test_ipv6_coordinator_bracketed() -> None:
    fleet = parse_host_list("h0")
    env = host_env(fleet.hosts[0], fleet, Job("true", "r"), {0: "fd00::2"})
    assert env["JAX_COORDINATOR_ADDRESS"] == "[fd00::2]:8476"


def test_parse_env() -> None:
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("NOEQUALS", "=v", "1A=2", "A B=1"):
        with pytest.raises(UsageError, match="NAME=VALUE"):
            parse_env([bad])


@pytest.mark.parametrize("name", ["20260101-120000", "a.b_c-d", "x" * 100])
def test_good_run_names(name: str) -> None:
    assert check_run_name(name) == name


def test_nested_names_only_for_sweeps() -> None:
    assert check_run_name("sweep/p001", nested=True) == "sweep/p001"
    with pytest.raises(UsageError, match="no '/'"):
        check_run_name("a/b")


@pytest.mark.parametrize(
    "name", ["", "../x", "a/../b", "/abs", "a b", "a;rm", "-x", "a//b", ".hidden", "x" * 101]
)
def test_bad_run_names(name: str) -> None:
    with pytest.raises(UsageError):
        check_run_name(name, nested=True)


@pytest.mark.parametrize("bad", ["A=a\nb", "A=a\0b", "A=a\rb"])
def test_env_values_without_newlines(bad: str) -> None:
    with pytest.raises(UsageError, match="NUL or newline"):
        parse_env([bad])


def test_shell_path_quotes_and_keeps_home() -> None:
    assert shell_path("~/.multihost") == '"$HOME"/.multihost'
    assert shell_path("/tmp/a b") == "'/tmp/a b'"
    assert shell_path("~/x;rm -rf /") == "\"$HOME\"/'x;rm -rf /'"


def test_job_script_runs_command_verbatim(tmp_path: Path) -> None:
    """Quotes, spaces and $ in --cmd and env values mean what they mean in a shell."""
    cmd = """printf '%s|' "$GREETING" 'single $HOME' "a  b"; echo "$((2+3))" """
    env = {"GREETING": 'it\'s a "test" $HOME `x`'}
    paths = Paths(str(tmp_path), str(tmp_path), str(tmp_path / "run"))
    out = subprocess.run(
        ["sh", "-c", job_script(paths, env, cmd)], capture_output=True, text=True, check=True
    ).stdout
    assert out == 'it\'s a "test" $HOME `x`|single $HOME|a  b|5\n'


def test_plan_launch_script_quotes_everything_added() -> None:
    fleet = parse_host_list("h0,h1")
    job = Job(command="echo hi", run_name="r", env={"X": "$(touch /tmp/pwned)"})
    plans = plan_hosts(fleet, job, "abc123", {0: "10.0.0.1"})
    assert [p.paths.run for p in plans] == ["~/.multihost/runs/r"] * 2
    assert plans[1].env["JAX_PROCESS_ID"] == "1"
    # the env value only ever appears inside single quotes
    assert shlex.quote("$(touch /tmp/pwned)") in plans[0].launch
    assert "export X=" in plans[0].launch


def test_paths_per_host_remote_dir() -> None:
    host = Host("local0", remote_dir="/tmp/w0", local=True)
    paths = Paths.for_host(host, Job("true", "r1"), "h4sh")
    assert paths == Paths("/tmp/w0", "/tmp/w0/code/h4sh", "/tmp/w0/runs/r1")


def test_watch_command_ends_with_exit_and_log_size(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "log").write_bytes(b"one\ntwo\n")
    for name, text in (("exit", "3"), ("started", "1.5"), ("ended", "2.5")):
        (run / name).write_text(text + "\n")
    paths = Paths(str(tmp_path), str(tmp_path / "code"), str(run))
    done = subprocess.run(["sh", "-c", watch_command(paths, 4)], capture_output=True, timeout=20)
    assert done.returncode == 0
    assert b"two\n".startswith(done.stdout)  # tail may be stopped before it caught up
    end = parse_watch_end(done.stderr)
    assert end == (Exit(3, 1.5, 2.5, None), 8)
    assert parse_watch_end(b"") is None
    assert parse_watch_end(b"end - - - - 8\n") is None  # no exit code yet
