"""Every bad input is one line ``multihost: error: ...``, exit 2, no traceback, nothing started
and no log dir created; and the help says what each option defaults to."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from multihost.cli import main
from tests.clitools import cli


@pytest.fixture
def work(tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's dir, with ``code`` and a private ``home``, as the working directory."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def refused(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., str]:
    """``main(args)`` in this process (fast): exit 2, one line, no log dir, nothing started."""

    def check(args: list[str], cwd: Path | None = None) -> str:
        monkeypatch.chdir(cwd or work)
        with pytest.raises(SystemExit) as info:
            main(args)
        err = capsys.readouterr().err
        assert info.value.code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("multihost: error: "), err
        assert not (work / "logs").exists(), "a refused run must not create its log dir"
        assert not (work / "home" / ".cache").exists(), "a refused run must start nothing"
        return lines[0]

    return check


def _run(*extra: str, cmd: str = "true") -> list[str]:
    return [
        "run",
        "--local",
        "1",
        "--script-dir",
        "code",
        "--log-dir",
        "logs",
        *extra,
        "--cmd",
        cmd,
    ]


@pytest.mark.parametrize(
    ("extra", "cmd", "says"),
    [
        (["--coordinator-port", "99999"], "true", "not a port"),
        (["--coordinator-port", "0"], "true", "not a port"),
        (["--megascale-port", "70000"], "true", "not a port"),
        (["--reconnect-timeout", "-5"], "true", "must be positive"),
        (["--timeout", "0"], "true", "must be positive"),
        (["--grace", "-1"], "true", "must be positive"),
        (["--connect-timeout", "0"], "true", "must be positive"),
        ([], "", "command is empty"),
        (["--env", "1A=x"], "true", "shell identifier"),
        (["--env", "A=a\nb"], "true", "NUL or newline"),
        (["--run-name", "a/b"], "true", "no '/'"),
        (["--run-name=-x"], "true", "bad run name"),
        (["--run-name", ".x"], "true", "bad run name"),
        (["--run-name", "x" * 300], "true", "too long"),
        (["--lcoal", "2"], "true", "unknown option --lcoal (did you mean --local?)"),
        (["--bogus"], "true", "see multihost run --help"),
        (["--max-stage-bytes", "1"], "true", "over 1 B"),
        (["--exclude", "x.txt", "--max-stage-bytes", "nope"], "true", "not a size"),
    ],
)
def test_bad_input_is_one_line(
    refused: Callable[..., str], work: Path, extra: list[str], cmd: str, says: str
) -> None:
    assert says in refused(_run(*extra, cmd=cmd))


def test_host_list_with_an_empty_entry(refused: Callable[..., str], work: Path) -> None:
    line = refused(["run", "--hosts", "a,,b", "--log-dir", "logs", "--cmd", "true"])
    assert "empty entry" in line


def test_duplicate_host_names_both_positions(refused: Callable[..., str], work: Path) -> None:
    line = refused(["run", "--hosts", "h0,h1,h2,h1", "--log-dir", "logs", "--cmd", "true"])
    assert "host h1 appears twice: s0/w1 and s0/w3" in line


def test_log_dir_that_is_a_file_or_unwritable(refused: Callable[..., str], work: Path) -> None:
    (work / "afile").write_text("")
    args = ["run", "--local", "1", "--script-dir", "code", "--cmd", "true", "--log-dir"]
    assert "not a directory" in refused([*args, "afile/logs"])
    if os.geteuid() != 0:  # root writes anywhere
        ro = work / "ro"
        ro.mkdir(mode=0o500)
        assert "not writable" in refused([*args, "ro/logs"])


def test_refuses_to_stage_root_or_home(refused: Callable[..., str], work: Path) -> None:
    line = refused(
        ["run", "--local", "1", "--log-dir", str(work / "logs"), "--cmd", "true"], cwd=Path("/")
    )
    assert "refusing to stage /" in line
    line = refused(
        ["run", "--local", "1", "--log-dir", str(work / "logs"), "--cmd", "true"], cwd=work / "home"
    )
    assert "home directory" in line


def test_stage_size_limit_names_the_biggest(refused: Callable[..., str], work: Path) -> None:
    (work / "code" / "big").mkdir()
    (work / "code" / "big" / "blob.bin").write_bytes(b"\0" * 4096)
    line = refused(_run("--max-stage-bytes", "2K"))
    assert "over 2.0 KiB" in line
    assert "big (4.0 KiB)" in line
    assert "--max-stage-bytes" in line


def test_busy_coordinator_port_with_local(refused: Callable[..., str], work: Path) -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        line = refused(_run("--coordinator-port", str(port)))
    assert f"coordinator port {port} is busy" in line


def test_help_shows_defaults_version_and_examples(capfd: pytest.CaptureFixture[str]) -> None:
    top = cli(["--help"])
    assert "examples:" in top.stdout
    assert "multihost run --local 4" in top.stdout
    version = cli(["--version"])
    assert version.returncode == 0
    assert re.match(r"multihost \S+", version.stdout)
    for command in ("run", "sweep", "attach", "logs", "kill", "hosts"):
        # each command's help in this process (the real process's help is read just above)
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        text = capfd.readouterr().out
        options = re.split(r"\n  (?=-)", text.split("options:", 1)[1])[1:]
        for option in options:
            name = option.split()[0]
            if name in ("-h,", "--hosts", "--local", "--prefix", "--cmd", "--payload"):
                continue  # required: no default
            takes_value = option.split()[1][:1].isupper() or option.split()[1].startswith("{")
            if takes_value:
                assert "default" in option, f"{command} {name}: {option}"


def test_dry_run_into_a_closed_pipe_is_quiet(work: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # like `| head -1` after its first line: every write is EPIPE
    proc = subprocess.run(
        [sys.executable, "-m", "multihost", *_run("--dry-run")],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        timeout=30,
        env={**os.environ, "HOME": str(work / "home")},
    )
    os.close(write)
    assert proc.returncode == 0
    assert proc.stderr == ""


@pytest.mark.parametrize("age", ["-5d", "nan", "xd"])
def test_clean_refuses_a_bad_age(work: Path, refused: Callable[..., str], age: str) -> None:
    assert "not an age" in refused(["clean", f"--older-than={age}", "--log-dir", "logs"])


def test_logs_follow_takes_no_filters(refused: Callable[..., str]) -> None:
    line = refused(["logs", "any", "--follow", "--tail", "3", "--log-dir", "logs"])
    assert "--follow shows every host's new lines" in line


def test_a_real_process_prints_one_line_too(work: Path) -> None:
    res = cli(_run("--coordinator-port", "99999"), cwd=work)
    assert res.returncode == 2
    assert res.stderr.startswith("multihost: error: argument --coordinator-port: not a port")
    assert len(res.stderr.splitlines()) == 1
