"""Fetch the archive and check its sha256 for ``--stage-via`` (stdlib only; the host's python3).

``python3 -c SOURCE URL OUT DIGEST TIMEOUT``. With an ``http://`` URL, the token is the first
line of stdin (never on a command line): GETs it from a seed into OUT, hashing as it goes.
With URL ``-``, only hashes OUT (fetched by something else, e.g. ``gcloud storage cp``). Exit
1 when the fetch fails, 3 when the sha256 is not DIGEST (OUT is then removed): either way,
why on stderr. Plain sockets and hashlib: a few ms of start-up, no urllib/ssl import, and
OpenSSL's sha256 is several times faster than coreutils' ``sha256sum``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys

HEADER = "X-Multihost-Token"
CHUNK = 1 << 20


def get(url: str, out: str, timeout: float, token: str) -> str:
    """The body of a GET of ``url`` (http://HOST:PORT/PATH) into ``out``; its sha256."""
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    host, _, port = netloc.rpartition(":")
    request = f"GET /{path} HTTP/1.0\r\nHost: {netloc}\r\n{HEADER}: {token}\r\n\r\n"
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        sock.sendall(request.encode())
        got = sock.makefile("rb")
        status = got.readline().decode("latin-1").split()
        if len(status) < 2 or status[1] != "200":
            raise OSError(f"the seed answered {' '.join(status[1:]) or 'nothing'}")
        length = -1
        while (line := got.readline().strip()) != b"":
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        digest, size = hashlib.sha256(), 0
        with open(out, "wb") as f:
            while chunk := got.read(CHUNK):
                digest.update(chunk)
                f.write(chunk)
                size += len(chunk)
        if size != length:
            raise OSError(f"got {size} of {length} bytes")
    return digest.hexdigest()


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    url, out, want, timeout = argv[1], argv[2], argv[3], float(argv[4])
    try:
        token = "" if url == "-" else sys.stdin.readline().strip()
        found = sha256(out) if url == "-" else get(url, out, timeout, token)
    except (OSError, ValueError) as exc:
        print(f"fetch from {url} failed: {exc}", file=sys.stderr)
        return 1
    if found != want:
        os.unlink(out)
        print(f"sha256 mismatch ({found}, expected {want}): refused, not unpacked", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
