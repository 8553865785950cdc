"""The TPU API stand-in's nodes (the queued resources' slices: CREATING, no endpoints, while
PROVISIONING; READY with one endpoint per worker once ACTIVE), their guest attributes and
metadata patches (the guest agent installs ``ssh-keys``), and the OS Login API. Internal-only
workers get a 127.1.x.y address where nothing listens (the tests reach them through an IAP
relay stand-in)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from multihost.sandbox.standin.resources import QueuedResource, Worker, error, operation

# a real ed25519 public key that no fleet host has (served as a worker's "wrong" host key)
WRONG_ED25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIKgn1VTkT+8EQ8A/x51qiEooVwZIE5MYAk3dVp/EC14C"


class Nodes:
    """The node half of :class:`multihost.sandbox.standin.tpu_api.TpuApi` (its attributes,
    declared here, are set there)."""

    resources: dict[str, QueuedResource]
    lock: threading.RLock
    guest_agent: Callable[[list[Worker], str], None]
    oslogin_profile: dict[str, Any] | None
    host_key: Callable[[int], str | None]
    wrong_host_keys: set[int]
    no_host_keys: set[str]
    internal_address: Callable[[int], str] | None

    def node_json(self, qr: QueuedResource, slice_id: int) -> dict[str, Any]:
        name = qr.node_names()[slice_id]
        node: dict[str, Any] = {
            "name": f"projects/{qr.project}/locations/{qr.zone}/nodes/{name}",
            "acceleratorType": qr.accelerator_type,
            "runtimeVersion": qr.node_spec["node"].get("runtimeVersion", ""),
            "state": "READY" if qr.state == "ACTIVE" else "CREATING",
            "queuedResource": qr.path,
            "metadata": dict(qr.node_metadata(slice_id)),
            "networkConfig": {"enableExternalIps": False},
        }
        if qr.state == "ACTIVE":
            workers = [w for w in qr.workers if w.slice_id == slice_id]
            node["networkEndpoints"] = [
                {"ipAddress": self.worker_ip(qr, w), "port": 8470} for w in workers
            ]
            node["health"] = "HEALTHY"
        return node

    def worker_ip(self, qr: QueuedResource, w: Worker) -> str:
        if qr.internal_only and self.internal_address is not None:
            return self.internal_address(w.host)
        return f"127.1.0.{2 + w.host}" if qr.internal_only else f"127.0.0.{2 + w.host}"

    @staticmethod
    def instance_name(qr: QueuedResource, w: Worker) -> str:
        """``deviceInfo/hostname``: the worker's instance name, as GCE names TPU VMs."""
        return f"t1v-n-{qr.name}-w-{w.slice_id}-{w.worker}"

    def worker_by_instance(self, instance: str) -> Worker | None:
        """The ACTIVE worker whose instance name is ``instance`` (the IAP relay asks)."""
        with self.lock:
            for qr in self.resources.values():
                for w in qr.workers if qr.state == "ACTIVE" else ():
                    if self.instance_name(qr, w) == instance:
                        return w
        return None

    def guest_attributes(self, qr: QueuedResource, w: Worker) -> list[dict[str, str]]:
        """What the guest agent publishes for one worker (items of ``queryValue``)."""
        items = [{"namespace": "deviceInfo", "key": "hostname", "value": self.instance_name(qr, w)}]
        key = None if qr.name in self.no_host_keys else self.host_key(w.host)
        if key is not None:
            kind, b64 = key.split()[:2]
            if w.host in self.wrong_host_keys:
                b64 = WRONG_ED25519 if kind == "ssh-ed25519" else b64[:-8] + "AAAAAAAA"
            items.append({"namespace": "hostkeys", "key": kind, "value": b64})
        return items

    def _nodes(
        self,
        method: str,
        project: str,
        zone: str,
        name: str | None,
        verb: str | None,
        body: dict[str, Any] | None,
        query: dict[str, list[str]] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        found = [
            (qr, s)
            for qr in self.resources.values()
            if qr.project == project and qr.zone == zone and qr.state in ("PROVISIONING", "ACTIVE")
            for s in range(qr.num_slices)
        ]
        if name is None:
            return 200, {"nodes": [self.node_json(qr, s) for qr, s in found]}
        picked = [(qr, s) for qr, s in found if qr.node_names()[s] == name]
        if not picked:
            return error(404, f"node {name} not found", "NOT_FOUND")
        qr, s = picked[0]
        if method == "GET" and verb is None:
            return 200, self.node_json(qr, s)
        if method == "PATCH" and verb is None:
            return self._patch(qr, s, body or {}, (query or {}).get("updateMask", [""])[0])
        if method == "POST" and verb == ":getGuestAttributes":
            workers = [w for w in qr.workers if w.slice_id == s] if qr.state == "ACTIVE" else []
            return 200, {
                "guestAttributes": [
                    {
                        "queryPath": (body or {}).get("queryPath", ""),
                        "queryValue": {"items": self.guest_attributes(qr, w)},
                    }
                    for w in workers
                ]
            }
        return error(405, f"{method} {verb or ''} not supported on nodes")

    def _patch(
        self, qr: QueuedResource, s: int, body: dict[str, Any], mask: str
    ) -> tuple[int, dict[str, Any]]:
        """``nodes.patch``: only ``metadata`` here, replaced whole (as the API does: the CLI
        sends the merged map); the guest agent installs ``ssh-keys`` on the workers soon."""
        if set(mask.split(",")) != {"metadata"}:
            return error(400, f"updateMask {mask!r} not supported by the stand-in")
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            return error(400, "metadata must be a map")
        qr.metadata[s] = {str(k): str(v) for k, v in meta.items()}
        workers = [w for w in qr.workers if w.slice_id == s]
        keys = qr.metadata[s].get("ssh-keys", "")
        threading.Thread(target=self.guest_agent, args=(workers, keys), daemon=True).start()
        ops = f"projects/{qr.project}/locations/{qr.zone}/operations/"
        return 200, operation(ops + uuid.uuid4().hex) | {"response": self.node_json(qr, s)}

    def _oslogin(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        """The OS Login API: ``users/EMAIL/loginProfile`` and ``users/EMAIL:importSshPublicKey``
        (the key also handed to the guest agent, as the OS Login NSS module would accept it)."""
        profile = self.oslogin_profile
        if profile is None:
            return error(403, "OS Login is not enabled here", "PERMISSION_DENIED")
        if method == "GET" and path.endswith("/loginProfile"):
            return 200, profile
        if method == "POST" and ":importSshPublicKey" in path:
            key = str((body or {}).get("key", "")).strip()
            fp = uuid.uuid5(uuid.NAMESPACE_OID, key).hex
            profile.setdefault("sshPublicKeys", {})[fp] = {"key": key, "fingerprint": fp}
            workers = [w for qr in self.resources.values() for w in qr.workers]
            names = [str(a.get("username")) for a in profile.get("posixAccounts", ())]
            lines = "\n".join(f"{name}:{key} {name}" for name in names)  # its POSIX users'
            threading.Thread(target=self.guest_agent, args=(workers, lines), daemon=True).start()
            return 200, {"loginProfile": profile}
        return error(405, f"{method} {path} not supported by the OS Login stand-in")
