"""Fetch the archive from a seed for ``--stage-via peer`` (stdlib only; the host's python3).

``python3 -c SOURCE URL OUT TIMEOUT``, with the token as the first line of stdin (never on a
command line): writes the body to OUT; on any failure says why on stderr and exits 1. The
caller checks the sha256 before unpacking.
"""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request

HEADER = "X-Multihost-Token"


def main(argv: list[str]) -> int:
    url, out, timeout = argv[1], argv[2], float(argv[3])
    token = sys.stdin.readline().strip()
    request = urllib.request.Request(url, headers={HEADER: token})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as got, open(out, "wb") as f:
            shutil.copyfileobj(got, f, 1 << 20)
    except (OSError, urllib.error.URLError) as exc:
        print(f"fetch from {url} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
