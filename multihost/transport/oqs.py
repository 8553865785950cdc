"""asyncssh's import-time search for liboqs, without the processes it starts.

When asyncssh is imported it asks ``ctypes.util.find_library`` for ``oqs`` and ``liboqs``
(post-quantum key exchange). On Linux, for a library that is not installed, each call runs
``ldconfig -p``, then ``gcc`` (with its ``collect2`` and ``ld``), then ``ld``: seven processes
and about 17 ms of the runner's CPU per run, on every run, for a library almost no machine has.

While asyncssh is imported, :func:`no_search_when_absent` answers "not found" at once when no
file named ``liboqs.so*`` is in the dynamic linker's cache (``/etc/ld.so.cache``), in the
linker's default directories or on ``LD_LIBRARY_PATH``: the only places from which asyncssh's
``LoadLibrary`` of the answer could load it. Otherwise the real search runs, as before.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
from collections.abc import Iterator

_NAMES = ("oqs", "liboqs")
_CACHE = "/etc/ld.so.cache"
_DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def _present(stem: bytes = b"liboqs.so") -> bool:
    """Whether the dynamic linker could find a ``liboqs.so*`` (True when unsure)."""
    try:
        with open(_CACHE, "rb") as f:
            if stem in f.read():
                return True
    except OSError:
        return True  # no cache to consult (musl, a custom loader): ask the real search
    dirs = [*_DEFAULT_DIRS, *os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)]
    for d in filter(None, dirs):
        with contextlib.suppress(OSError):
            if any(n.startswith(stem.decode()) for n in os.listdir(d)):
                return True
    return False


@contextlib.contextmanager
def no_search_when_absent() -> Iterator[None]:
    """Inside: ``find_library("oqs"/"liboqs")`` is None at once when liboqs is absent."""
    real = ctypes.util.find_library
    if not sys.platform.startswith("linux") or _present():
        yield
        return

    def find_library(name: str) -> str | None:
        return None if name in _NAMES else real(name)

    ctypes.util.find_library = find_library
    try:
        yield
    finally:
        ctypes.util.find_library = real
