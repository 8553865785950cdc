"""One GCE metadata server per TPU VM worker (what ``GCE_METADATA_HOST`` points at)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/computeMetadata/v1/"


class MetadataServer:
    """Serves ``instance/...`` paths from a dict; ``values`` may be changed while it runs."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                value = server.values.get(path[len(PREFIX) :]) if path.startswith(PREFIX) else None
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._send(403, "missing Metadata-Flavor: Google")
                elif value is None:
                    self._send(404, "not found")
                else:
                    self._send(200, value)

            def _send(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        """``host:port``, the form ``GCE_METADATA_HOST`` takes."""
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def worker_values(
    *,
    worker: int,
    slice_id: int,
    num_slices: int,
    node: str,
    accelerator_type: str,
    slice_ips: list[str],
    coordinator_ip: str,
) -> dict[str, str]:
    """The attributes a TPU VM worker's metadata server serves, shaped as on GCE."""
    tpu_env = [
        f"ACCELERATOR_TYPE: '{accelerator_type}'",
        f"NODE_ID: '{node}'",
        f"WORKER_ID: '{worker}'",
        f"HOSTNAME: '{node}-w-{worker}'",
    ]
    if num_slices > 1:
        tpu_env += [
            f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator_ip}:8080'",
            f"MEGASCALE_NUM_SLICES: '{num_slices}'",
            f"MEGASCALE_SLICE_ID: '{slice_id}'",
        ]
    endpoints = ",".join(f"{i}:{8470 + i}:{ip}" for i, ip in enumerate(slice_ips))
    return {
        "instance/attributes/agent-worker-number": str(worker),
        "instance/attributes/tpu-env": "\n".join(tpu_env) + "\n",
        "instance/attributes/worker-network-endpoints": endpoints,
        "instance/attributes/accelerator-type": accelerator_type,
        "instance/network-interfaces/0/ip": slice_ips[worker],
        "instance/preempted": "FALSE",
    }
