"""The production path from Python, against the stand-in control plane (the real gcloud CLI,
fake GCS, startup scripts on the loopback fleet): ``submit_job`` returns a handle whose
``watch``, ``status``, ``logs`` and ``stop`` return typed values and print nothing; a profile
says what its jobs are made of; ``jobs()`` lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

import multihost
from multihost.errors import UsageError
from tests.cloud.fixture import BUCKET, Cloud
from tests.test_job_cloud import code_dir

pytestmark = pytest.mark.slow


@pytest.fixture
def standin(cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    for key, value in cloud.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return cloud


def test_submit_watch_status_logs_from_python(
    standin: Cloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = code_dir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.multihost.profiles.prod]\n"
        'tpu-type = "v4-16"\n'
        'runtime-version = "tpu-ubuntu2204-base"\n'
        f'bucket = "gs://{BUCKET}"\n'
        "log-interval = 3\n"
    )
    said: list[str] = []
    with pytest.raises(UsageError, match="--bucket is required to submit a job"):
        multihost.submit_job("nob", "true", tpu_type="v4-16", runtime_version="v")
    job = multihost.submit_job(
        "pyjob",
        "echo hi-from-$MULTIHOST_WORKER_ID; echo second line",
        script_dir=code,
        profile="prod",
        env={"EXTRA": "x y"},
        say=said.append,
    )
    assert isinstance(job, multihost.JobHandle)
    assert (job.record.tpu_type, job.record.bucket, job.record.log_interval) == (
        "v4-16",
        f"gs://{BUCKET}",
        3,
    )
    assert job.record.env == (("EXTRA", "x y"),)
    assert any("multihost job watch pyjob" in s for s in said)
    lines: list[tuple[str, str]] = []
    views: list[object] = []
    outcome = job.watch(
        poll=1,
        on_line=lambda h, t: lines.append((h, t)),
        on_hosts=lambda r, s: views.append(s),
        say=said.append,
    )
    assert outcome.exit_code == 0, outcome.message
    assert outcome.record.state is outcome.record.state.SUCCEEDED
    assert ("s0/w0", "second line") in lines
    assert views  # each poll's view of the workers
    status = job.status()
    assert status.record.state.value == "succeeded"
    assert sorted((h.slice_id, h.worker, h.exit_code) for h in status.hosts) == [
        (0, 0, 0),
        (0, 1, 0),
    ]
    assert "hi-from-1" in job.logs("0/1").splitlines()
    assert [h.name for h in multihost.jobs()] == ["pyjob"]
    assert multihost.JobHandle("pyjob").record.state.value == "succeeded"
    out = capsys.readouterr()
    assert out.out == ""  # nothing printed: every line went to a callback
    assert out.err == ""


def test_stop_from_python(standin: Cloud, tmp_path: Path) -> None:
    said: list[str] = []
    job = multihost.submit_job(
        "longjob",
        "sleep 300",
        tpu_type="v4-8",
        runtime_version="tpu-ubuntu2204-base",
        bucket=f"gs://{BUCKET}",
        script_dir=code_dir(tmp_path),
        say=said.append,
    )
    record = job.stop(say=said.append)
    assert record.state.value == "stopped"
    assert said[-1] == "job longjob: stopped; queued resource longjob-a0 deleted"
    assert job.status().record.exit_code == 130
