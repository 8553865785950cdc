"""The stand-in control plane itself, driven through the real gcloud CLI."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cloud.fixture import BUCKET, ZONE, Cloud
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


def gcloud(cloud: Cloud, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["gcloud", *args], env=cloud.env, capture_output=True, text=True, check=check, timeout=60
    )


SCRIPT = """#!/bin/sh
md() { curl -sf -H 'Metadata-Flavor: Google' \\
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/$1"; }
w=$(md attributes/agent-worker-number)
echo "worker $w home=${HOME:-unset} user=$(id -un)" > /tmp/multihost-cloud-$(id -un)/out
md attributes/tpu-env >> /tmp/multihost-cloud-$(id -un)/out
gcloud storage cp /tmp/multihost-cloud-$(id -un)/out gs://mh-test/standin/$(id -un).txt
sleep 300
"""


def test_queued_resource_lifecycle(cloud: Cloud, tmp_path) -> None:
    script = tmp_path / "startup.sh"
    script.write_text(SCRIPT)
    gcloud(
        cloud,
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "qr1",
        "--zone",
        ZONE,
        "--accelerator-type",
        "v4-16",
        "--runtime-version",
        "tpu-ubuntu2204-base",
        "--node-count",
        "2",
        "--spot",
        "--async",
        "--metadata-from-file",
        f"startup-script={script}",
    )
    post = next(r for r in cloud.tpu.requests if r.method == "POST")
    assert post.path == f"/v2/projects/p/locations/{ZONE}/queuedResources"
    assert post.query["queuedResourceId"] == ["qr1"]
    assert post.body is not None
    assert "spot" in post.body
    spec = post.body["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"]["nodeCount"] == 2
    assert spec["node"]["metadata"]["startup-script"] == SCRIPT
    qr = cloud.tpu.wait_state("qr1", "ACTIVE", 30)
    hosts = [w.host for w in qr.workers]
    wait_for(lambda: len(cloud.objects("standin/")) >= 4, 60, "every worker's startup script")
    texts = [cloud.read(f"standin/{cloud.fleet.hosts[h].user}.txt") for h in hosts]
    assert all("home=unset" in t for t in texts)
    assert [t.split()[1] for t in texts] == ["0", "1", "0", "1"]
    assert "MEGASCALE_SLICE_ID: '1'" in texts[3]
    out = gcloud(
        cloud,
        "compute",
        "tpus",
        "queued-resources",
        "describe",
        "qr1",
        "--zone",
        ZONE,
        "--format",
        "json",
    )
    assert json.loads(out.stdout)["state"]["state"] == "ACTIVE"
    assert all(cloud.fleet.user_processes(h) for h in hosts)
    cloud.preempt("qr1")
    assert cloud.tpu.resources["qr1"].state == "SUSPENDED"
    assert not any(cloud.fleet.user_processes(h) for h in hosts)
    gcloud(
        cloud,
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "qr1",
        "--zone",
        ZONE,
        "--force",
        "--async",
        "--quiet",
    )
    wait_for(lambda: "qr1" not in cloud.tpu.resources, 10, "qr1 to be deleted")
    gone = gcloud(
        cloud, "compute", "tpus", "queued-resources", "describe", "qr1", "--zone", ZONE, check=False
    )
    assert gone.returncode != 0
    assert "NOT_FOUND" in gone.stderr


def test_storage_round_trip(cloud: Cloud, tmp_path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("hello\n")
    gcloud(cloud, "storage", "cp", str(src), f"gs://{BUCKET}/x/a.txt")
    assert gcloud(cloud, "storage", "cat", f"gs://{BUCKET}/x/a.txt").stdout == "hello\n"
    missing = gcloud(cloud, "storage", "ls", f"gs://{BUCKET}/nothing/", check=False)
    assert missing.returncode == 1


def test_unknown_types_and_zones_are_refused_as_the_service_does(cloud: Cloud) -> None:
    """A made-up accelerator type is INVALID_ARGUMENT, a zone the service does not have is
    PERMISSION_DENIED (its location not found); neither is created."""
    qr = ("compute", "tpus", "queued-resources")
    made = gcloud(
        cloud, *qr, "create", "bad", "--zone", ZONE, "--accelerator-type", "v4-61",
        "--runtime-version", "v", "--node-id", "bad", "--async", check=False,
    )  # fmt: skip
    assert made.returncode != 0
    assert "INVALID_ARGUMENT" in made.stderr
    assert f'Accelerator type "v4-61" not found in zone "{ZONE}"' in made.stderr
    nowhere = gcloud(
        cloud, *qr, "create", "bad", "--zone", "us-central2-z", "--accelerator-type", "v4-8",
        "--runtime-version", "v", "--node-id", "bad", "--async", check=False,
    )  # fmt: skip
    assert nowhere.returncode != 0
    assert "PERMISSION_DENIED" in nowhere.stderr
    assert "Location us-central2-z is not found or access is unauthorized" in nowhere.stderr
    listed = gcloud(cloud, "compute", "tpus", "tpu-vm", "list", "--zone", "us-central2-z",
                    check=False)  # fmt: skip
    assert listed.returncode != 0
    assert cloud.tpu.resources == {}
