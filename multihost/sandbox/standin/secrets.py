"""A Secret Manager stand-in: ``versions/latest:access`` of the secrets a test puts in it."""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ACCESS = re.compile(r"^/v1/projects/([^/]+)/secrets/([^/]+)/versions/([^/:]+):access$")


class SecretManager:
    """``values``: secret name → bytes; ``accessed``: the names read, in order."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.accessed: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                m = _ACCESS.match(self.path.split("?", 1)[0])
                value = server.values.get(m[2]) if m else None
                if m is None or value is None:
                    name = m[2] if m else self.path
                    error = {"code": 404, "status": "NOT_FOUND", "message": f"{name} not found"}
                    self._send(404, {"error": error})
                    return
                server.accessed.append(m[2])
                self._send(
                    200,
                    {
                        "name": f"projects/{m[1]}/secrets/{m[2]}/versions/1",
                        "payload": {"data": base64.b64encode(value).decode()},
                    },
                )

            def _send(self, code: int, reply: dict[str, Any]) -> None:
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        """What ``CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER`` must be."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def reset(self) -> None:
        self.values.clear()
        self.accessed.clear()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
