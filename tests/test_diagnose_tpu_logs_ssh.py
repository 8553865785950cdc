"""A failed TPU run brings the failing hosts' TPU runtime logs back (real gcloud
against the stand-in, the real fleet; each host's ``~/tpu_logs`` stands for /tmp/tpu_logs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clitools import cli
from tests.cloud.fixture import Cloud
from tests.test_sources_queued_ssh import env, run_args, ssh_config

pytestmark = pytest.mark.usefixtures("fresh_runs")

JOB = (
    "rm -rf ~/tpu_logs && mkdir ~/tpu_logs && "
    "head -c 1500000 /dev/zero > ~/tpu_logs/tpu-runtime.INFO && "
    "echo $MULTIHOST_TEST_HOST > ~/tpu_logs/small.log && "
    '[ "$MULTIHOST_TEST_HOST" = h1 ] && exit 3; sleep 60'
)


def test_failing_hosts_tpu_logs_come_back(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.add("myqr", "v4-16", 1)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = ssh_config(cloud.fleet, tmp_path, {i: f"127.0.0.{2 + i}" for i in (0, 1)})
    args = run_args(config, tmp_path, "tl", "--grace", "2")
    res = cli([*args[:-1], JOB], **env(cloud, tmp_path), MULTIHOST_TPU_LOG_DIR="~/tpu_logs")
    assert res.returncode == 1
    run_dir = tmp_path / "logs" / "tl"
    back = run_dir / "tpu_logs"
    assert [p.name for p in back.iterdir()] == ["slice_0000_worker_0001"]  # the failing one
    got = back / "slice_0000_worker_0001"
    assert (got / "small.log").read_text() == "h1\n"
    assert (got / "tpu-runtime.INFO").stat().st_size == 1 << 20  # its last MiB
    assert (got / "CUT.txt").read_text() == "1500000 tpu-runtime.INFO\n"
    assert f"TPU runtime logs of s0/w1: {back}/ (2 files; 1 cut to their last 1 MiB)" in (
        res.stderr.replace("\n", "")
    )
