"""A stand-in for the IAP TCP-forwarding relay that the REAL ``gcloud start-iap-tunnel`` talks to.

gcloud connects a websocket (subprotocol ``relay.tunnel.cloudproxy.app``) to
``/v4/connect?project=P&zone=Z&instance=NAME&interface=nic0&port=N``; the relay answers
CONNECT_SUCCESS_SID, then both sides send DATA frames (tag 4: u32 length, bytes) and ACK
frames (tag 7: u64 bytes received so far) — read from ``api_lib/compute/iap_tunnel_websocket*.py``.
This relay connects to the fleet host behind the instance name (the TPU stand-in knows it) on
the asked port. gcloud reaches it through its hidden ``--iap-tunnel-url-override`` flag, which
``gcloud_iap`` (the test's ``$MULTIHOST_GCLOUD``) appends, with an access-token file (gcloud
sends a bearer token on the websocket; the relay does not check it).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import socketserver
import ssl
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SUBPROTOCOL = "relay.tunnel.cloudproxy.app"
CONNECT_SUCCESS_SID, DATA, ACK = 0x1, 0x4, 0x7
MAX_DATA = 16384
WRAPPER = Path(__file__).with_name("gcloud_iap")  # the gcloud the runner is given


def _frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One unmasked server frame."""
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack(">BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 127, n)
    return head + payload


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    b1, b2 = _read_exact(sock, 2)
    n = b2 & 0x7F
    if n == 126:
        n = struct.unpack(">H", _read_exact(sock, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", _read_exact(sock, 8))[0]
    mask = _read_exact(sock, 4) if b2 & 0x80 else b"\0\0\0\0"
    data = bytes(c ^ mask[i % 4] for i, c in enumerate(_read_exact(sock, n)))
    return b1 & 0x0F, data


def _tls_context() -> ssl.SSLContext:
    """A self-signed certificate for 127.0.0.1 (gcloud's websocket wants TLS; the wrapper
    turns its certificate check off with the hidden flag made for that)."""
    import datetime
    import tempfile

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # the ssl module loads a certificate only from files; once loaded they are not needed
    with tempfile.TemporaryDirectory(prefix="multihost-iap-") as tmp:
        d = Path(tmp)
        (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / "key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
    return ctx


class IapRelay:
    """Serves tunnels to the hosts ``resolve(instance)`` names (None: no such instance),
    reached with ``connect`` (default: from here; a VPC's ``connect`` reaches inside it)."""

    def __init__(
        self,
        resolve: Callable[[str], str | None],
        connect: Callable[[str, int], socket.socket] | None = None,
    ) -> None:
        self.resolve = resolve
        self.connect = connect or (lambda host, port: socket.create_connection((host, port), 10))
        self.tunnels: list[tuple[str, int]] = []  # (instance, port) of each tunnel opened
        self.open = 0  # tunnels open right now
        self.lock = threading.Lock()
        self.tls = _tls_context()
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    ws = relay.tls.wrap_socket(self.request, server_side=True)
                except (OSError, ssl.SSLError):
                    return
                relay._serve(ws)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        """What ``--iap-tunnel-url-override`` must be."""
        return f"wss://127.0.0.1:{self.server.server_address[1]}/v4"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _serve(self, ws: socket.socket) -> None:
        try:
            self._relay(ws)
        finally:
            ws.close()

    def _relay(self, ws: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = ws.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        path = lines[0].split()[1]
        headers = {
            k.strip().lower(): v.strip()
            for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
        }
        query = parse_qs(urlsplit(path).query)
        accept = base64.b64encode(
            hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()
        ).decode()
        ws.sendall(
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n"
            ).encode()
        )
        instance, port = query.get("instance", [""])[0], int(query.get("port", ["22"])[0])
        address = self.resolve(instance)
        if address is None or not urlsplit(path).path.endswith("/connect"):
            ws.sendall(_frame(struct.pack(">H", 4047) + b"instance not found", 0x8))
            ws.close()
            return
        try:
            tcp = self.connect(address, port)
        except OSError:
            ws.sendall(_frame(struct.pack(">H", 4014) + b"failed to connect to backend", 0x8))
            ws.close()
            return
        tcp.settimeout(None)
        with self.lock:
            self.tunnels.append((instance, port))
            self.open += 1
        send = threading.Lock()
        sid = b"sid-" + instance.encode()
        ws.sendall(_frame(struct.pack(">HI", CONNECT_SUCCESS_SID, len(sid)) + sid))

        def host_to_client() -> None:
            try:
                while chunk := tcp.recv(MAX_DATA):
                    with send:
                        ws.sendall(_frame(struct.pack(">HI", DATA, len(chunk)) + chunk))
                with send:
                    ws.sendall(_frame(struct.pack(">H", 1000), 0x8))
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    ws.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=host_to_client, daemon=True)
        back.start()
        received = 0
        try:
            while True:
                opcode, data = _read_frame(ws)
                if opcode == 0x8:
                    break
                if opcode == 0x9:
                    with send:
                        ws.sendall(_frame(data, 0xA))
                    continue
                if opcode != 0x2 or len(data) < 2:
                    continue
                tag = struct.unpack(">H", data[:2])[0]
                if tag == DATA:
                    n = struct.unpack(">I", data[2:6])[0]
                    tcp.sendall(data[6 : 6 + n])
                    received += n
                    with send:
                        ws.sendall(_frame(struct.pack(">HQ", ACK, received)))
        except (EOFError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError):
                tcp.shutdown(socket.SHUT_RDWR)
            back.join(timeout=10)
            tcp.close()
            ws.close()
            with self.lock:
                self.open -= 1
