"""What the runner writes locally is private to the user, and secrets stay out of run.json."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.clitools import cli

SECRET = "hf_s3cr3t-token"


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local workers keep their runs under HOME: the test's own dir."""
    monkeypatch.setenv("HOME", str(tmp_path))


def _run(code: Path, logs: Path, run: str, *extra: str) -> list[str]:
    return [
        "run",
        "--local",
        "2",
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        run,
        "--env",
        f"HF_TOKEN={SECRET}",
        *extra,
        "--cmd",
        'test "${#HF_TOKEN}" = ' + str(len(SECRET)),
    ]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_logs_private_and_env_values_not_recorded(code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = cli(_run(code, logs, "p"))
    assert res.returncode == 0, res.stderr  # the job itself got the value
    assert _mode(logs) == 0o700
    assert _mode(logs / "p") == 0o700
    for f in (logs / "p").iterdir():
        assert _mode(f) == 0o600, f
    text = (logs / "p" / "run.json").read_text()
    assert SECRET not in text
    record = json.loads(text)
    assert record["env_names"] == ["HF_TOKEN"]
    assert "HF_TOKEN" not in record["hosts"][0]["env"]
    assert record["hosts"][0]["env"]["JAX_PROCESS_ID"] == "0"


def test_record_env_keeps_values_when_asked(code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = cli(_run(code, logs, "kept", "--record-env"))
    assert res.returncode == 0, res.stderr
    record = json.loads((logs / "kept" / "run.json").read_text())
    assert record["job"]["env"] == {"HF_TOKEN": SECRET}
    assert record["hosts"][1]["env"]["HF_TOKEN"] == SECRET


def test_symlinked_run_dir_refused(code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (logs / "sym").symlink_to(elsewhere)
    res = cli(_run(code, logs, "sym"))
    assert res.returncode == 2
    assert "symbolic link" in res.stderr
    assert "Traceback" not in res.stderr
    assert list(elsewhere.iterdir()) == []
