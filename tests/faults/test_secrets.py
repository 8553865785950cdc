"""``run --secret KEY=NAME``: the value is read once on the runner (from the Secret Manager
stand-in, through the real gcloud) and reaches each host's job on the launch channel only:
in the job's environment, on no disk of either side, never in run.json."""

from __future__ import annotations

import hashlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from multihost.sandbox.standin.env import gcloud_env
from multihost.sandbox.standin.secrets import SecretManager
from tests.clitools import cli, manifest
from tests.faults.conftest import Where


@pytest.fixture
def secret_manager(tmp_path: Path) -> Iterator[tuple[SecretManager, dict[str, str]]]:
    sm = SecretManager()
    (tmp_path / "gcloud").mkdir()
    dead = "http://127.0.0.1:9/"
    try:
        yield sm, gcloud_env(str(tmp_path / "gcloud"), dead, dead, sm.endpoint)
    finally:
        sm.stop()


def _holding(value: str, roots: list[Path]) -> list[str]:
    roots = [r for r in roots if r.exists()]
    done = subprocess.run(
        ["grep", "-rlsaF", "--", value, *map(str, roots)], capture_output=True, text=True
    )
    return done.stdout.splitlines()


def test_run_secret_reaches_the_job_and_no_disk(
    where: Where, tmp_path: Path, secret_manager: tuple[SecretManager, dict[str, str]]
) -> None:
    sm, env = secret_manager
    value = f"tok-{uuid.uuid4().hex} with spaces 'and' \"quotes\" $HOME"
    sm.values["api-token"] = (value + "\n").encode()
    code = tmp_path / "code"
    code.mkdir()
    logs = tmp_path / "logs"
    cmd = 'printf %s "$API_TOKEN" | sha256sum; env | grep -c "^API_TOKEN=" || :'
    args = where.args(
        code, logs, "sec", cmd, "--secret", "API_TOKEN=api-token", "--env", "PLAIN=plain-value"
    )
    done = cli(args, **env)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(value.encode()).hexdigest()
    for i in range(2):
        text = (logs / "sec" / f"slice_0000_worker_{i:04d}.log").read_text()
        assert f"{digest}  -" in text, text
    assert sm.accessed == ["api-token"]  # read once, on the runner
    record = (logs / "sec" / "run.json").read_text()
    assert "api-token" not in record  # not even the name is needed there
    assert value not in record
    assert manifest(logs, "sec")["hosts"][0]["state"] == "done"
    roots = [tmp_path, Path(env["CLOUDSDK_CONFIG"])]
    if where.kind == "ssh":
        roots += [Path(h.home) for h in where.fleet.hosts[:2]]
    assert _holding(value, roots) == []
    assert _holding("plain-value", roots) != []  # --env is on disk (the grep works)


def test_run_secret_that_cannot_be_read_starts_nothing(
    where: Where, tmp_path: Path, secret_manager: tuple[SecretManager, dict[str, str]]
) -> None:
    _, env = secret_manager
    code = tmp_path / "code"
    code.mkdir()
    logs = tmp_path / "logs"
    done = cli(where.args(code, logs, "nosec", "echo started", "--secret", "K=absent"), **env)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot read secret 'absent' from Secret Manager" in done.stderr
    assert [h["state"] for h in manifest(logs, "nosec")["hosts"]] == ["error", "error"]
    assert not where.run_dir(0, "nosec").exists()


def test_run_secret_refused_with_detach(where: Where, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    done = cli(where.args(code, tmp_path / "logs", "d", "true", "--secret", "K=n", "--detach"))
    assert done.returncode == 2, done.stderr
    assert "--secret" in done.stderr
