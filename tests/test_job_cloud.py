"""``multihost job`` end to end on the stand-in control plane: the real gcloud CLI, fake GCS,
the TPU API stand-in, and startup scripts running on the real OpenSSH fleet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.model import Fleet, Host, Job
from multihost.plan import host_env
from tests.cloud.fixture import BUCKET, Cloud

pytestmark = pytest.mark.slow

ENV_CMD = "env | grep -E '^(JAX|MULTIHOST|MEGASCALE)_|^EXTRA=' | sort; echo payload-done"


def code_dir(tmp_path: Path, body: str = "print('hello')\n") -> Path:
    d = tmp_path / "code"
    d.mkdir(exist_ok=True)
    (d / "main.py").write_text(body)
    return d


def multihost(cloud: Cloud, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "multihost", "job", *args],
        env=cloud.env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def submit_args(name: str, script_dir: Path, cmd: str, *extra: str) -> list[str]:
    return ["submit", name, "--tpu-type", "v4-16", "--runtime-version", "tpu-ubuntu2204-base",
            "--bucket", f"gs://{BUCKET}", "--script-dir", str(script_dir), "--cmd", cmd,
            "--log-interval", "3", "--poll", "2", *extra]  # fmt: skip


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_two_slices_get_runs_environment(cloud: Cloud, tmp_path: Path) -> None:
    started = time.monotonic()
    done = multihost(cloud, *submit_args(
        "envjob", code_dir(tmp_path), ENV_CMD, "--num-slices", "2", "--spot",
        "--env", "EXTRA=x y", "--coordinator-port", "9123", "--watch"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "s0/w0 | payload-done" in done.stdout
    assert "job envjob succeeded" in done.stderr
    print(f"2x2 env job: {time.monotonic() - started:.1f}s", file=sys.stderr)
    post = next(r for r in cloud.tpu.requests if r.method == "POST")
    assert post.query["queuedResourceId"] == ["envjob-a0"]
    assert "spot" in (post.body or {})
    assert cloud.tpu.resources == {}  # deleted on success
    logs = {
        (s, w): parse_env(cloud.read(f"multihost/jobs/envjob/attempt-0/slice-{s}-worker-{w}.log"))
        for s in (0, 1) for w in (0, 1)
    }  # fmt: skip
    coordinator = logs[0, 0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[0]
    fleet = Fleet.from_slices([[Host(coordinator), Host("b")], [Host("c"), Host("d")]])
    job = Job(ENV_CMD, "envjob", {"EXTRA": "x y"}, coordinator_port=9123)
    for host in fleet:
        expected = host_env(host, fleet, job, {}) | {"MULTIHOST_JOB": "envjob",
                                                     "MULTIHOST_ATTEMPT": "0"}  # fmt: skip
        assert logs[host.slice_id, host.worker_id] == expected
    for s in (0, 1):
        for w in (0, 1):
            assert cloud.read(f"multihost/jobs/envjob/attempt-0/slice-{s}-worker-{w}.exit") == "0\n"
