"""Real-shaped TPU API v2 Node dicts, as `gcloud compute tpus tpu-vm list --format=json` prints.

`python tests/gcloud_fixtures.py` rewrites tests/fixtures/gcloud/*.json from FIXTURES.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FIXTURE_DIR = Path(__file__).parent / "fixtures" / "gcloud"
FAKE_GCLOUD_DIR = Path(__file__).parent / "fake_gcloud"

# acceleratorType -> (acceleratorConfig.type, topology, runtimeVersion)
_TYPES = {
    "v4-8": ("V4", "2x2x1", "tpu-ubuntu2204-base"),
    "v4-16": ("V4", "2x2x2", "tpu-ubuntu2204-base"),
    "v4-32": ("V4", "2x2x4", "tpu-ubuntu2204-base"),
    "v5litepod-8": ("V5LITE_POD", "2x4", "v2-alpha-tpuv5-lite"),
    "v5litepod-16": ("V5LITE_POD", "4x4", "v2-alpha-tpuv5-lite"),
    "v6e-16": ("V6E", "4x4", "v2-alpha-tpuv6e"),
}


def make_node(
    name: str,
    accelerator_type: str,
    internal_ips: Sequence[str],
    external_ips: Sequence[str | None] | None = None,
    *,
    state: str = "READY",
    health: str | None = "HEALTHY",
    project: str = "my-project",
    zone: str = "us-central2-b",
    queued_resource: str | None = None,
    multislice: bool = False,
) -> dict[str, Any]:
    """One Node; no `networkEndpoints` when `internal_ips` is empty (as while CREATING)."""
    kind, topology, runtime = _TYPES.get(
        accelerator_type, (accelerator_type.split("-")[0].upper(), "", "tpu-ubuntu2204-base")
    )
    externals = list(external_ips) if external_ips is not None else [None] * len(internal_ips)
    region = zone.rsplit("-", 1)[0]
    digest = hashlib.sha256(f"{project}/{zone}/{name}".encode()).hexdigest()
    node: dict[str, Any] = {
        "acceleratorConfig": {"topology": topology, "type": kind} if topology else {"type": kind},
        "acceleratorType": accelerator_type,
        "apiVersion": "V2",
        "cidrBlock": "10.130.0.0/20",
        "createTime": "2025-01-15T09:30:12.345678901Z",
        "id": str(int(digest[:15], 16)),
        "metadata": {"enable-oslogin": "FALSE"},
        "name": f"projects/{project}/locations/{zone}/nodes/{name}",
        "networkConfig": {
            "enableExternalIps": any(externals),
            "network": f"projects/{project}/global/networks/default",
            "subnetwork": f"projects/{project}/regions/{region}/subnetworks/default",
        },
        "runtimeVersion": runtime,
        "schedulingConfig": {},
        "serviceAccount": {
            "email": "123456789012-compute@developer.gserviceaccount.com",
            "scope": ["https://www.googleapis.com/auth/cloud-platform"],
        },
        "shieldedInstanceConfig": {},
        "state": state,
    }
    if health is not None:
        node["health"] = health
    if internal_ips:
        endpoints = []
        for internal, external in zip(internal_ips, externals, strict=True):
            endpoint: dict[str, Any] = {"ipAddress": internal, "port": 8470}
            if external:
                endpoint["accessConfig"] = {"externalIp": external}
            endpoints.append(endpoint)
        node["networkEndpoints"] = endpoints
    if queued_resource:
        node["queuedResource"] = (
            f"projects/{project}/locations/{zone}/queuedResources/{queued_resource}"
        )
    if multislice:
        node["multisliceNode"] = True
    return dict(sorted(node.items()))


def make_nodes(
    prefix: str,
    slices: int | None,
    workers: int,
    accelerator_type: str,
    internal_ips: Sequence[str],
    external_ips: Sequence[str | None] | None = None,
    state: str = "READY",
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Nodes PREFIX-0..slices-1 of one queued resource (slices=None: one node named PREFIX).

    `internal_ips` / `external_ips` list every worker, slice-major; an external entry may be None.
    Extra keyword arguments go to `make_node` (health, project, zone, queued_resource, ...).
    """
    count = 1 if slices is None else slices
    assert len(internal_ips) == count * workers, "one internal ip per worker, slice-major"
    if external_ips is not None:
        assert len(external_ips) == len(internal_ips), "one external entry per worker"
    if slices is not None:
        kwargs.setdefault("queued_resource", prefix)
        kwargs.setdefault("multislice", slices > 1)
    nodes = []
    for s in range(count):
        part = slice(s * workers, (s + 1) * workers)
        nodes.append(
            make_node(
                prefix if slices is None else f"{prefix}-{s}",
                accelerator_type,
                internal_ips[part],
                None if external_ips is None else external_ips[part],
                state=state,
                **kwargs,
            )
        )
    return nodes


def loopback_nodes(
    prefix: str, slices: int | None, workers: int, **kwargs: Any
) -> list[dict[str, Any]]:
    """Nodes whose workers are the loopback test fleet: 127.0.0.2, 127.0.0.3, ... slice-major."""
    count = (1 if slices is None else slices) * workers
    ips = [f"127.0.0.{k + 2}" for k in range(count)]
    kwargs.setdefault("accelerator_type", "v4-16")
    return make_nodes(prefix, slices, workers, internal_ips=ips, **kwargs)


def _ips(base: str, count: int) -> list[str]:
    head, last = base.rsplit(".", 1)
    return [f"{head}.{int(last) + k}" for k in range(count)]


def _fixtures() -> dict[str, list[dict[str, Any]]]:
    myv4 = make_nodes("myv4", None, 1, "v4-8", ["10.130.0.5"], ["34.66.10.5"])
    myqr = make_nodes("myqr", 2, 2, "v4-16", _ips("10.130.0.10", 4), _ips("35.202.7.10", 4))
    v5e = make_nodes("myv5e", None, 4, "v5litepod-16", _ips("10.164.0.20", 4), zone="us-west4-a")
    creating = [
        *make_nodes("new", 1, 2, "v4-16", _ips("10.130.0.30", 2)),
        make_node("new-1", "v4-16", [], state="CREATING", health=None, queued_resource="new"),
    ]
    gap = [
        *make_nodes("gap", 1, 2, "v4-16", _ips("10.130.0.40", 2)),
        make_node("gap-2", "v4-16", _ips("10.130.0.42", 2), queued_resource="gap"),
    ]
    unhealthy = make_nodes("sick", 2, 2, "v4-16", _ips("10.130.0.50", 4))
    unhealthy[1]["health"] = "UNHEALTHY_MAINTENANCE"
    unhealthy[1]["healthDescription"] = "The TPU had a maintenance event at 2025-01-15T10:00:00Z"
    noise = [
        make_node("myqr-old", "v4-16", _ips("10.130.0.60", 2), ["34.1.2.3", "34.1.2.4"]),
        make_node("myqrx-0", "v4-16", _ips("10.130.0.62", 2), queued_resource="myqrx"),
        make_node("other-0", "v5litepod-8", _ips("10.130.0.64", 2), queued_resource="other"),
    ]
    return {
        "myv4": myv4,
        "myqr": myqr,
        "v5e": v5e,
        "creating": creating,
        "gap": gap,
        "unhealthy": unhealthy,
        "mixed": [noise[0], myqr[1], noise[1], *myv4, noise[2], myqr[0]],
        "empty": [],
    }


FIXTURES = _fixtures()


def dump(nodes: list[dict[str, Any]]) -> str:
    """The JSON text gcloud would print for these nodes."""
    return json.dumps(nodes, indent=2, sort_keys=True) + "\n"


def load(name: str) -> list[dict[str, Any]]:
    """A fixture file's nodes."""
    nodes: list[dict[str, Any]] = json.loads((FIXTURE_DIR / f"{name}.json").read_text())
    return nodes


if __name__ == "__main__":
    FIXTURE_DIR.mkdir(parents=True, exist_ok=True)
    for fixture, fixture_nodes in FIXTURES.items():
        (FIXTURE_DIR / f"{fixture}.json").write_text(dump(fixture_nodes))
        print(f"wrote {FIXTURE_DIR / fixture}.json", file=sys.stderr)
