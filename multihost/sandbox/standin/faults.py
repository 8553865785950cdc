"""Control-plane faults, injected in the stand-in servers so that the REAL gcloud meets them.

``Faults`` is shared by the TPU API stand-in (checked before each request is routed) and by
``FaultProxy``, a small HTTP forwarder in front of fake-gcs-server for the runner's gcloud
(the hosts reach fake GCS directly). A window is real time: from now for ``seconds``, every
request answers 503 UNAVAILABLE or has its connection reset, in turn; ``deny`` answers 403
PERMISSION_DENIED until cleared.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RESET = "reset"


class Faults:
    """What the next request meets: None (served), an HTTP status, or ``RESET``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.until = 0.0
        self.denied = False
        self.turn = 0
        self.injected: list[tuple[float, str, str]] = []  # (time, what, path)

    def window(self, seconds: float) -> None:
        """Transient failures (503 and resets, in turn) from now for ``seconds``."""
        with self.lock:
            self.until = time.monotonic() + seconds

    def deny(self, on: bool = True) -> None:
        with self.lock:
            self.denied = on

    def clear(self) -> None:
        with self.lock:
            self.until, self.denied, self.turn = 0.0, False, 0
            self.injected.clear()

    @property
    def flaky(self) -> bool:
        return time.monotonic() < self.until

    def next(self, path: str) -> int | str | None:
        with self.lock:
            if self.denied:
                what: int | str | None = 403
            elif time.monotonic() < self.until:
                self.turn += 1
                what = RESET if self.turn % 3 == 0 else 503
            else:
                return None
            self.injected.append((time.time(), str(what), path))
            return what


def answer(h: BaseHTTPRequestHandler, what: int | str) -> None:
    """Fail one request as ``what`` says (the body read first, so the client sees the reply)."""
    length = int(h.headers.get("Content-Length") or 0)
    if length:
        h.rfile.read(length)
    if what == RESET:  # RST, not FIN: the client sees "connection reset by peer"
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.connection.close()
        h.close_connection = True
        return
    status = {403: "PERMISSION_DENIED", 503: "UNAVAILABLE"}.get(int(what), "INTERNAL")
    message = "caller does not have permission" if what == 403 else "backend unavailable"
    data = json.dumps({"error": {"code": what, "message": message, "status": status}}).encode()
    h.send_response(int(what))
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


class FaultProxy:
    """Forwards every request to ``upstream`` (host, port) unless ``faults`` says otherwise."""

    def __init__(self, upstream: tuple[str, int], faults: Faults) -> None:
        proxy = self
        self.upstream = upstream
        self.faults = faults

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                what = proxy.faults.next(self.path)
                if what is not None:
                    answer(self, what)
                    return
                proxy.forward(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def forward(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "host")}
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            reply = conn.getresponse()
            data = reply.read()
            h.send_response(reply.status, reply.reason)
            for k, v in reply.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        finally:
            conn.close()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
