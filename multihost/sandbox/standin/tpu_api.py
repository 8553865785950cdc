"""A TPU v2 API stand-in: queued resources, their state machine, and long-running operations.

When a queued resource becomes ACTIVE, each of its TPU VM workers is one loopback host (the
sandbox's, or the tests' fleet): the server gives it a metadata server and has ``launch`` run
the resource's startup script there over real ssh, detached, with a systemd-like environment
(no ``HOME``) plus the gcloud settings that reach the fake Cloud Storage.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from multihost.sandbox.standin.env import ZONE as _ZONE
from multihost.sandbox.standin.faults import Faults, answer
from multihost.sandbox.standin.resources import (
    QueuedResource,
    Request,
    Worker,
    error,
    make_workers,
    operation,
)
from multihost.sandbox.standin.tpu_nodes import Nodes
from multihost.sandbox.standin.zones import (
    ACCELERATOR_TYPES,
    PROJECT_NUMBER,
    ZONES,
    Capacity,
    capacity_type,
    no_capacity,
    quota_message,
    region_of,
    unknown_location,
    unknown_type,
    valid_for,
    workers_of,
)

# v2, and v2alpha1 for gcloud's alpha track (``--best-effort``): the same resources
_QR = re.compile(
    r"^/v2(?:alpha1)?/projects/([^/]+)/locations/([^/]+)/queuedResources(?:/([^/?]+))?$"
)
_OP = re.compile(r"^/v2(?:alpha1)?/projects/([^/]+)/locations/([^/]+)/operations/([^/?]+)$")
_PROJECT = re.compile(r"^/compute/v1/projects/([^/]+)$")
_NODE = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/nodes(?:/([^/:?]+))?(:\w+)?$")


class TpuApi(Nodes):
    """The server. ``hosts``: fleet host indices it may hand out as TPU VM workers."""

    def __init__(
        self,
        hosts: Sequence[int],
        launch: Callable[[Worker, QueuedResource], None],
        stop_hosts: Callable[[list[int]], None],
        *,
        provision_delay: float = 0.5,
        faults: Faults | None = None,
    ) -> None:
        self.faults = faults or Faults()
        self.free = list(hosts)
        self.launch = launch
        self.stop_hosts = stop_hosts
        self.provision_delay = provision_delay
        self.resources: dict[str, QueuedResource] = {}
        self.requests: list[Request] = []
        self.broken_storage: set[str] = set()
        self.held: set[str] = set()  # resources that stay ACCEPTED (no capacity for them)
        self.held_provisioning: set[str] = set()  # resources that stay PROVISIONING (release)
        self.internal_only: set[str] = set()  # resources created with internal-only workers
        # project metadata (``commonInstanceMetadata``, compute API) and the guest agent
        self.project_metadata: dict[str, str] = {}
        self.guest_agent: Callable[[list[Worker], str], None] = lambda workers, keys: None
        self.oslogin_profile: dict[str, Any] | None = None  # set by the OS Login stand-in
        # guest attributes hostkeys/*: a fleet host's real host key ("<type> <base64>"),
        # a wrong one for the hosts in ``wrong_host_keys``, none for ``no_host_keys`` resources
        self.host_key: Callable[[int], str | None] = lambda host: None
        self.wrong_host_keys: set[int] = set()
        # internal-only workers' addresses by fleet host (a VPC's, in the tests); unset:
        # 127.1.0.x, where nothing listens
        self.internal_address: Callable[[int], str] | None = None
        self.no_host_keys: set[str] = set()
        self.capacity = Capacity()  # quota refusals per region, zones with no capacity
        # provisioned workers look like TPU VM images to an ordinary SSH session: gcloud on
        # PATH pointed here, the metadata server reachable (``launch`` makes them so)
        self.vm_image = False
        self.lock = threading.RLock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api._handle(self, "GET")

            def do_POST(self) -> None:
                api._handle(self, "POST")

            def do_DELETE(self) -> None:
                api._handle(self, "DELETE")

            def do_PATCH(self) -> None:
                api._handle(self, "PATCH")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        """What ``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU`` must be."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    # ------------------------------------------------------------ HTTP

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        fault = self.faults.next(url.path)
        if fault is not None:
            answer(h, fault)
            return
        query = parse_qs(url.query)
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        with self.lock:
            auth = h.headers.get("Authorization", "")
            self.requests.append(Request(method, url.path, query, body, auth))
            code, reply = self._route(method, url.path, query, body)
        data = json.dumps(reply).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        if m := _OP.match(path):
            return 200, operation(f"projects/{m[1]}/locations/{m[2]}/operations/{m[3]}")
        if m := _NODE.match(path):
            if m[2] not in ZONES and m[2] != "-":
                return error(403, unknown_location(m[2]), "PERMISSION_DENIED")
            return self._nodes(method, m[1], m[2], m[3], m[4], body, query)
        if (m := _PROJECT.match(path)) and method == "GET":
            items = [{"key": k, "value": v} for k, v in self.project_metadata.items()]
            return 200, {
                "kind": "compute#project",
                "name": m[1],
                "id": "1",
                "commonInstanceMetadata": {"kind": "compute#metadata", "items": items},
            }
        if path.startswith("/v1/users/"):
            return self._oslogin(method, path, body)
        m = _QR.match(path)
        if not m:
            return error(404, f"no such API path {path}")
        project, zone, name = "p" if m[1] == PROJECT_NUMBER else m[1], m[2], m[3]
        if zone not in ZONES:  # as the service answers for a location it does not have
            return error(403, unknown_location(zone), "PERMISSION_DENIED")
        ops = f"projects/{project}/locations/{zone}/operations/"
        if method == "POST" and name is None:
            qid = query.get("queuedResourceId", [""])[0]
            if not qid or body is None:
                return error(400, "queuedResourceId and a body are required")
            if qid in self.resources:
                return error(409, f"queued resource {qid} already exists", "ALREADY_EXISTS")
            node = (body.get("tpu", {}).get("nodeSpec") or [{}])[0].get("node", {})
            kind = str(node.get("acceleratorType"))
            if kind not in ACCELERATOR_TYPES:  # the service's own refusal of a made-up type
                return error(400, unknown_type(kind, zone), "INVALID_ARGUMENT")
            ctype = capacity_type(body)
            if (region_of(zone), ctype) in self.capacity.quota:
                return error(429, quota_message(region_of(zone), ctype, kind), "RESOURCE_EXHAUSTED")
            for spec in body.get("tpu", {}).get("nodeSpec", []):  # v2alpha1's name for it
                if "multiNodeParams" in spec:
                    spec["multisliceParams"] = spec.pop("multiNodeParams")
            qr = QueuedResource(qid, project, zone, body, internal_only=qid in self.internal_only)
            self.resources[qid] = qr
            threading.Thread(target=self._provision, args=(qr,), daemon=True).start()
            return 200, operation(ops + uuid.uuid4().hex)
        if method == "GET" and name is None:
            here = [q for q in self.resources.values() if (q.project, q.zone) == (project, zone)]
            return 200, {"queuedResources": [q.to_json() for q in here]}
        found = self.resources.get(name or "")
        if found is None or (found.project, found.zone) != (project, zone):  # in its zone only
            return error(404, f"queued resource {name} not found", "NOT_FOUND")
        qr = found
        if method == "GET":
            return 200, qr.to_json()
        if method == "DELETE":
            forced = query.get("force", ["false"])[0].lower() == "true"
            if qr.state in ("PROVISIONING", "ACTIVE") and not forced:
                return error(400, "it has nodes: delete with force", "FAILED_PRECONDITION")
            if qr.state == "DELETING":
                return 200, operation(ops + uuid.uuid4().hex)
            self._set(qr, "DELETING")
            threading.Thread(target=self._delete, args=(qr,), daemon=True).start()
            return 200, operation(ops + uuid.uuid4().hex)
        return error(405, f"{method} not supported")

    # ------------------------------------------------------------ state machine

    def _set(self, qr: QueuedResource, state: str) -> None:
        qr.state = state
        qr.reason = {}
        qr.history.append(state)

    def _provision(self, qr: QueuedResource) -> None:
        time.sleep(self.provision_delay)
        with self.lock:
            if qr.state != "ACCEPTED" or qr.name in self.held:
                return
            need = qr.num_slices * workers_of(qr.accelerator_type)
            if need > len(self.free) or qr.zone in self.capacity.starved:
                self._set(qr, "WAITING_FOR_RESOURCES")
                seconds = valid_for(qr.body)
                if seconds is not None:  # the service gives up at the request's valid-until
                    at = threading.Timer(qr.created + seconds - time.time(), self._expire, [qr])
                    at.daemon = True
                    at.start()
                return
            self._set(qr, "PROVISIONING")
            hosts, self.free = self.free[:need], self.free[need:]
            qr.taken = list(hosts)  # a reset or delete meanwhile gives them back
        time.sleep(self.provision_delay)
        while qr.name in self.held_provisioning and qr.state == "PROVISIONING":
            time.sleep(0.05)  # until release() (the nodes show as CREATING meanwhile)
        workers = make_workers(qr, hosts)
        with self.lock:
            if not qr.taken:  # released meanwhile (deleted, or the stand-in reset): no VMs
                for made in workers:
                    made.metadata.stop()
                return
            qr.workers, qr.taken = workers, []
            if qr.state != "PROVISIONING" or self.resources.get(qr.name) is not qr:
                self._release(qr)
                return
            self._set(qr, "ACTIVE")
        threads = [threading.Thread(target=self._boot, args=(w, qr), daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _boot(self, worker: Worker, qr: QueuedResource) -> None:
        """A worker's startup script started; a VM deleted while it booted (its host's
        processes killed, its ssh cut) is no failure of the stand-in's."""
        try:
            self.launch(worker, qr)
        except Exception:
            with self.lock:
                if self.resources.get(qr.name) is qr and worker in qr.workers:
                    raise
                return

    def _expire(self, qr: QueuedResource) -> None:
        """Past its valid-until with no capacity: FAILED, with the capacity message."""
        with self.lock:
            if self.resources.get(qr.name) is qr and qr.state == "WAITING_FOR_RESOURCES":
                self._set(qr, "FAILED")
                qr.reason = no_capacity(qr.zone)

    def _release(self, qr: QueuedResource) -> None:
        """The nodes go: every process of their hosts is killed, the hosts are free again."""
        hosts = [w.host for w in qr.workers] + qr.taken
        qr.taken = []
        self.stop_hosts(hosts)
        for w in qr.workers:
            w.metadata.stop()
        qr.workers = []
        self.free = sorted(self.free + hosts)

    def _delete(self, qr: QueuedResource) -> None:
        time.sleep(0.2)
        with self.lock:
            self._release(qr)
            self.resources.pop(qr.name, None)

    def release(self, name: str) -> None:
        """A resource held in PROVISIONING goes on to ACTIVE."""
        self.held_provisioning.discard(name)

    def add(
        self,
        name: str,
        accelerator_type: str = "v4-16",
        slices: int = 1,
        *,
        hold: str | None = None,
        internal_only: bool = False,
    ) -> QueuedResource:
        """A queued resource as ``queued-resources create`` makes it; ``hold``: "ACCEPTED" or
        "PROVISIONING" to keep it there (``release`` lets a PROVISIONING one go on)."""
        if hold == "ACCEPTED":
            self.held.add(name)
        elif hold == "PROVISIONING":
            self.held_provisioning.add(name)
        if internal_only:
            self.internal_only.add(name)
        node: dict[str, Any] = {"acceleratorType": accelerator_type, "runtimeVersion": "v2"}
        spec: dict[str, Any] = {"node": node, "parent": f"projects/p/locations/{_ZONE}"}
        if slices > 1:
            spec["multisliceParams"] = {"nodeCount": slices}
        else:
            spec["nodeId"] = name
        code, reply = self._route(
            "POST",
            f"/v2/projects/p/locations/{_ZONE}/queuedResources",
            {"queuedResourceId": [name]},
            {"tpu": {"nodeSpec": [spec]}},
        )
        assert code == 200, reply
        return self.resources[name]

    # ------------------------------------------------------------ hooks

    def preempt(self, name: str, notice: float = 1.0) -> None:
        """Spot preemption: the notice (``instance/preempted``), then every process of the
        resource's hosts killed, the nodes gone, the resource SUSPENDED."""
        qr = self.resources[name]
        for w in qr.workers:
            w.metadata.values["instance/preempted"] = "TRUE"
        self._set(qr, "SUSPENDING")
        time.sleep(notice)
        with self.lock:
            self._release(qr)
            self._set(qr, "SUSPENDED")

    def remove(self, name: str) -> None:
        """Someone else deletes the resource (``gcloud ... delete`` from another terminal)."""
        with self.lock:
            qr = self.resources.pop(name)
            self._release(qr)

    def fail(self, name: str, message: str | None = None) -> None:
        """The resource fails: nodes gone, state FAILED (``message``: its ``failedData``)."""
        with self.lock:
            qr = self.resources[name]
            self._release(qr)
            self._set(qr, "FAILED")
            if message:
                qr.reason = {"failedData": {"error": {"code": 8, "message": message}}}

    def wait_state(self, name: str, state: str, timeout: float = 60) -> QueuedResource:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            qr = self.resources.get(name)
            if qr is not None and qr.state == state:
                return qr
            time.sleep(0.1)
        raise TimeoutError(f"{name} never reached {state}")

    def reset(self) -> None:
        """Delete every resource at once (between tests)."""
        with self.lock:
            for qr in list(self.resources.values()):
                self._release(qr)
            self.resources.clear()
            self.requests.clear()
            self.broken_storage.clear()
            self.held.clear()
            self.held_provisioning.clear()
            self.internal_only.clear()
            self.faults.clear()
            self.project_metadata.clear()
            self.oslogin_profile = None
            self.capacity.clear()
            self.vm_image = False
            self.wrong_host_keys.clear()
            self.no_host_keys.clear()
            self.internal_address = None

    def stop(self) -> None:
        self.reset()
        self.httpd.shutdown()
        self.httpd.server_close()
