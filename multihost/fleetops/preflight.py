"""``multihost hosts --check``: what each host has (pure command text and parsing)."""

from __future__ import annotations

import shlex
import socket
from collections.abc import Mapping, Sequence

from multihost.remote import load, script

PREFLIGHT = load("preflight")  # d port packages probe
PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax")
_VERSIONS = """\
import importlib.metadata as m, platform, socket, sys
print("python=" + platform.python_version())
for name in sys.argv[2].split(","):
    try:
        print(name + "=" + m.version(name))
    except Exception:
        print(name + "=-")
"""
_PORT = """\
import socket, sys
port = int(sys.argv[1])
if port:
    s = socket.socket()
    # As a server binds it: a connection lingering in TIME_WAIT does not make the port busy.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        print("coordinator_port=free")
    except OSError as exc:
        print("coordinator_port=in use (" + (exc.strerror or str(exc)) + ")")
    finally:
        s.close()
"""
_PROBE = _VERSIONS + _PORT


def port_in_use(port: int, host: str = "") -> str | None:
    """Why this machine cannot bind ``port`` (as the probe above does on a host), or None."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        s.close()


def free_port() -> int:
    """A TCP port nothing on this machine listens on right now (for ``--local`` runs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_command(port: int) -> str:
    """Prints ``coordinator_port=free`` or ``coordinator_port=in use (why)`` (nothing without
    python3)."""
    return f"python3 -c {shlex.quote(_PORT)} {int(port)} 2>/dev/null || true"


def check_command(base: str, port: int | None) -> str:
    """Prints ``key=value`` lines: Python and package versions, free disk, port state."""
    return script(
        PREFLIGHT, paths={"d": base}, port=int(port or 0), packages=",".join(PACKAGES), probe=_PROBE
    )


def parse_check(output: str) -> dict[str, str]:
    """``key=value`` lines → a mapping (unknown lines ignored)."""
    facts: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum():
            facts[key] = value.strip()
    return facts


def mismatches(rows: Sequence[Mapping[str, str]], keys: Sequence[str]) -> set[str]:
    """The keys whose values differ between hosts (versions must agree across a job)."""
    return {k for k in keys if len({row.get(k, "-") for row in rows}) > 1}
