"""What the TPU API stand-in keeps: a queued resource, its workers, the requests it received,
and what every TPU VM's metadata server serves besides the TPU attributes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from multihost.sandbox.standin.metadata_server import MetadataServer, worker_values
from multihost.sandbox.standin.zones import PROJECT_NUMBER


@dataclass
class Worker:
    """One TPU VM worker: the fleet host standing in for it and its metadata server."""

    host: int
    slice_id: int
    worker: int
    metadata: MetadataServer


@dataclass
class QueuedResource:
    """One queued resource as the server keeps it."""

    name: str
    project: str
    zone: str
    body: dict[str, Any]
    state: str = "ACCEPTED"
    workers: list[Worker] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)  # hosts taken while provisioning, no VM yet
    created: float = field(default_factory=time.time)
    history: list[str] = field(default_factory=lambda: ["ACCEPTED"])
    internal_only: bool = False  # its workers' addresses: 127.1.x.y, where nothing listens
    reason: dict[str, Any] = field(default_factory=dict)  # e.g. {"failedData": {"error": ...}}
    metadata: dict[int, dict[str, str]] = field(default_factory=dict)  # slice -> node metadata

    def node_metadata(self, slice_id: int) -> dict[str, str]:
        """The node's metadata map (from the create request, then as PATCHed)."""
        if slice_id not in self.metadata:
            self.metadata[slice_id] = dict(self.node_spec["node"].get("metadata", {}))
        return self.metadata[slice_id]

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.name}"

    @property
    def node_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.body["tpu"]["nodeSpec"][0]
        return spec

    @property
    def num_slices(self) -> int:
        return int(self.node_spec.get("multisliceParams", {}).get("nodeCount", 1))

    @property
    def accelerator_type(self) -> str:
        return str(self.node_spec["node"]["acceleratorType"])

    @property
    def startup_script(self) -> str:
        return str(self.node_spec["node"].get("metadata", {}).get("startup-script", ""))

    def node_names(self) -> list[str]:
        if self.num_slices == 1:
            return [str(self.node_spec.get("nodeId", self.name))]
        prefix = self.node_spec.get("multisliceParams", {}).get("nodeIdPrefix") or self.name
        return [f"{prefix}-{i}" for i in range(self.num_slices)]

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k != "tpu"}
        return out | {
            "name": self.path,
            "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
            "state": {"state": self.state, **self.reason},
            "tpu": self.body["tpu"],
        }


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: dict[str, Any] | None
    auth: str = ""  # the Authorization header: "" from the runner's gcloud, a worker's token

    @property
    def name(self) -> str:
        """The queued resource's name, for a request about one."""
        return self.path.rsplit("/", 1)[-1] if "/queuedResources/" in self.path else ""


def worker_token(qr: QueuedResource, slice_id: int, worker: int) -> str:
    """The access token a worker's metadata server hands out (its service account's)."""
    return f"ya29.vm-{qr.name}-s{slice_id}-w{worker}"


def vm_values(qr: QueuedResource, slice_id: int, worker: int) -> dict[str, str]:
    """What every TPU VM's metadata server serves besides the TPU attributes."""
    token = worker_token(qr, slice_id, worker)
    return {
        "instance/attributes/queued-resource-name": (
            f"projects/{PROJECT_NUMBER}/locations/{qr.zone}/queuedResources/{qr.name}"
        ),
        "instance/zone": f"projects/{PROJECT_NUMBER}/zones/{qr.zone}",
        "project/project-id": qr.project,
        "project/numeric-project-id": PROJECT_NUMBER,
        "instance/service-accounts/default/token": json.dumps(
            {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
        ),
    }


def operation(name: str) -> dict[str, Any]:
    return {"name": name, "done": True, "response": {}}


def error(code: int, message: str, status: str = "INVALID_ARGUMENT") -> tuple[int, dict[str, Any]]:
    return code, {"error": {"code": code, "message": message, "status": status}}


def make_workers(qr: QueuedResource, hosts: list[int]) -> list[Worker]:
    """The resource's VMs on these fleet hosts, slice by slice: each with its metadata server."""
    per_slice = len(hosts) // qr.num_slices
    ips = [f"127.0.0.{2 + h}" for h in hosts]
    nodes = qr.node_names()
    workers = []
    for k, h in enumerate(hosts):
        s, w = divmod(k, per_slice)
        values = worker_values(
            worker=w,
            slice_id=s,
            num_slices=qr.num_slices,
            node=nodes[s],
            accelerator_type=qr.accelerator_type,
            slice_ips=ips[s * per_slice : (s + 1) * per_slice],
            coordinator_ip=ips[0],
        )
        values |= vm_values(qr, s, w)
        workers.append(Worker(h, s, w, MetadataServer(values)))
    return workers
