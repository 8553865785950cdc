"""A real JAX job on the stand-in: payloads/shardings.py as a 2-process ``multihost job`` on the
fleet's CPUs gives the same checksum as ``multihost run --local 2``."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from multihost.stage import pack
from tests.clitools import REPO, cli, host_logs
from tests.cloud.fixture import Cloud
from tests.test_job_cloud import multihost, record, submit_args

pytestmark = [pytest.mark.jax, pytest.mark.slow]
SHARDINGS = "payloads/shardings.py -if 4 -d 256 -b 16 -n 2 --tries 2"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _result(text: str) -> dict[str, object]:
    lines = [ln for ln in text.splitlines() if ln.startswith("MULTIHOST_RESULT ")]
    assert len(lines) == 1, text[-2000:]
    return json.loads(lines[0].split(" ", 1)[1])  # type: ignore[no-any-return]


def test_shardings_job_matches_run(
    cloud: Cloud, remote_jax: dict[str, str], tmp_path: Path
) -> None:
    done = multihost(cloud, *submit_args(
        "jaxjob", REPO, f"{remote_jax['PYTHON']} {SHARDINGS}",
        "--env", "JAX_NUM_CPU_DEVICES=2", "--env", "JAX_PLATFORMS=cpu",
        "--env", f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--coordinator-port", str(_port()), "--watch"), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert record(cloud, "jaxjob")["code_hash"] == pack(REPO).digest  # the hash `run` stages
    job = [_result(cloud.read(f"multihost/jobs/jaxjob/attempt-0/slice-0-worker-{w}.log"))
           for w in (0, 1)]  # fmt: skip
    assert sorted(r["process_index"] for r in job) == [0, 1]  # type: ignore[type-var]
    assert job[0]["num_devices"] == 4
    local = cli(
        ["run", "--local", "2", "--script-dir", str(REPO), "--log-dir", str(tmp_path),
         "--run-name", "loc", "--env", "JAX_NUM_CPU_DEVICES=2", "--env", "JAX_PLATFORMS=cpu",
         "--coordinator-port", str(_port()), "--timeout", "240",
         "--cmd", f"{sys.executable} {SHARDINGS}"],
        timeout=300, HOME=str(tmp_path / "home"),
    )  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    ran = [_result(t) for t in host_logs(tmp_path, "loc").values()]
    assert {r["checksum"] for r in job} == {r["checksum"] for r in ran}
