"""A queued resource not yet ACTIVE, with the real gcloud against the stand-in.

``run --prefix`` on a resource held in PROVISIONING exits 2 naming its state and how many
slices are ready, with nothing started; ``--wait`` waits, says so, and runs once it is ACTIVE.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests.clitools import cli, host_logs, wait_for
from tests.cloud.fixture import ZONE, Cloud

pytestmark = pytest.mark.usefixtures("fresh_runs")


def ssh_config(fleet: loopback.Fleet, tmp_path: Path, addresses: dict[int, str]) -> Path:
    """Host blocks for the workers' addresses (host index -> address), as a user has them."""
    lines = []
    for i, address in addresses.items():
        h = fleet.hosts[i]
        lines += [
            f"Host {address}",
            f"  User {h.user}",
            f"  Port {h.port}",
            f"  IdentityFile {fleet.key}",
            "  IdentitiesOnly yes",
        ]
    path = tmp_path / "ssh_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_args(config: Path, tmp_path: Path, run: str, *extra: str) -> list[str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    return [
        "run",
        "--prefix",
        "myqr",
        "--zone",
        ZONE,
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--run-name",
        run,
        "--no-add-key",
        *extra,
        "--cmd",
        "echo hi from $MULTIHOST_TEST_HOST",
    ]


def env(cloud: Cloud, tmp_path: Path) -> dict[str, str]:
    return cloud.env | {"XDG_STATE_HOME": str(tmp_path / "state"), "MULTIHOST_WAIT_POLL": "1"}


def test_provisioning_is_named_then_wait_runs(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.add("myqr", "v4-16", 2, hold="PROVISIONING")
    cloud.tpu.wait_state("myqr", "PROVISIONING")
    config = ssh_config(cloud.fleet, tmp_path, {i: f"127.0.0.{2 + i}" for i in range(8)})
    e = env(cloud, tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "multihost", *run_args(config, tmp_path, "q1")],
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        "multihost: error: queued resource myqr is PROVISIONING: 0/2 slices ready "
        "(myqr-0 CREATING, myqr-1 CREATING); wait for it with --wait [SECONDS]"
    )
    assert not (tmp_path / "logs" / "q1").exists()  # nothing started anywhere
    # --wait: says where the resource stands, then runs once it is ACTIVE
    err = tmp_path / "wait.err"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multihost", *run_args(config, tmp_path, "q2", "--wait", "120")],
            env=e | {"COLUMNS": "200"},
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
        )
    try:
        wait_for(
            lambda: "s): queued resource myqr is PROVISIONING" in err.read_text(),
            timeout=60,
            what="the waiting line",
        )
        cloud.tpu.release("myqr")
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 0, text
    assert "accepted by 4/4 workers" in text
    logs = host_logs(tmp_path / "logs", "q2")
    assert logs["slice_0001_worker_0001"] == "hi from h3\n"


def test_failed_with_reason_is_final(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.add("myqr", "v4-8", 1, hold="ACCEPTED")
    cloud.tpu.wait_state("myqr", "ACCEPTED")
    e = env(cloud, tmp_path)
    res = cli(["hosts", "--prefix", "myqr", "--zone", ZONE], **e)
    assert res.returncode == 2
    assert "queued resource myqr is ACCEPTED: 0/1 slices ready; wait for it with --wait" in (
        res.stderr
    )
    cloud.tpu.fail("myqr", "Insufficient capacity in zone")
    res = cli(["hosts", "--prefix", "myqr", "--zone", ZONE, "--wait"], **e)
    assert res.returncode == 2  # nothing to wait for: FAILED is final
    assert res.stderr.strip() == (
        "multihost: error: queued resource myqr is FAILED (Insufficient capacity in zone): "
        "0/1 slices ready"
    )
