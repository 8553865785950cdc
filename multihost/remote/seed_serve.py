"""A seed's short-lived file server for ``--stage-via peer`` (stdlib only; the host's python3).

``python3 -c SOURCE ADDR DIR LIFETIME FETCHES NAME``: reads the token from ``DIR/token`` (then
deletes it), binds ADDR on a free port, prints ``port N`` (or ``error WHY``) on stdout, and
serves ``DIR/archive`` at the path NAME (any other path: 404) to requests that carry the token
in the ``X-Multihost-Token`` header.
It exits after FETCHES complete transfers, after LIFETIME seconds, or on SIGTERM, and removes
DIR on its way out.
"""

from __future__ import annotations

import hmac
import http.server
import os
import shutil
import signal
import socket
import sys
import threading
from typing import Any

HEADER = "X-Multihost-Token"


def main(argv: list[str]) -> int:
    addr, folder, lifetime, fetches = argv[1], argv[2], float(argv[3]), int(argv[4])
    name = argv[5]
    archive = os.path.join(folder, "archive")
    finished = threading.Event()
    try:
        with open(os.path.join(folder, "token")) as f:
            token = f.read().strip().encode()
        os.unlink(os.path.join(folder, "token"))
        size = os.path.getsize(archive)
        server = _server(addr, archive, name, size, token, fetches, finished)
    except (OSError, ValueError) as exc:
        print(f"error {exc}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: finished.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    print(f"port {server.server_address[1]}", flush=True)
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    try:
        finished.wait(lifetime)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def _server(
    addr: str,
    archive: str,
    name: str,
    size: int,
    token: bytes,
    fetches: int,
    finished: threading.Event,
) -> http.server.ThreadingHTTPServer:
    served = [0]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            given = (self.headers.get(HEADER) or "").encode()
            if not hmac.compare_digest(given, token):
                self.send_error(403)
                return
            if self.path != name:  # its one archive, nothing else
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.flush()
            with open(archive, "rb") as f:
                self.connection.sendfile(f)
            with lock:
                served[0] += 1
                if served[0] >= fetches:
                    finished.set()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        request_queue_size = 1024  # every host of a slice may knock at once
        daemon_threads = True

    return Server((addr.strip("[]"), 0), Handler)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
