"""asyncssh's import-time search for liboqs, answered from the linker's cache (pure)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.transport import oqs


def test_absent_is_answered_without_searching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"\x00libc.so.6\x00/lib/libc.so.6\x00")
    monkeypatch.setattr(oqs, "_CACHE", str(cache))
    monkeypatch.setattr(oqs, "_DEFAULT_DIRS", (str(tmp_path),))
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    real = ctypes.util.find_library
    with oqs.no_search_when_absent():
        assert ctypes.util.find_library("oqs") is None
        assert ctypes.util.find_library("liboqs") is None
        assert ctypes.util.find_library("c") == real("c")  # any other name: the real search
    assert ctypes.util.find_library is real


def test_present_or_unsure_keeps_the_real_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ctypes.util.find_library
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"\x00liboqs.so.5\x00/usr/lib/liboqs.so.5\x00")
    monkeypatch.setattr(oqs, "_CACHE", str(cache))
    with oqs.no_search_when_absent():
        assert ctypes.util.find_library is real
    monkeypatch.setattr(oqs, "_CACHE", str(tmp_path / "missing"))  # no cache: unsure
    with oqs.no_search_when_absent():
        assert ctypes.util.find_library is real
    cache.write_bytes(b"\x00libc.so.6\x00")
    monkeypatch.setattr(oqs, "_CACHE", str(cache))
    (tmp_path / "liboqs.so.5").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))  # where dlopen would look
    with oqs.no_search_when_absent():
        assert ctypes.util.find_library is real


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the search forks on Linux")
def test_importing_the_transport_starts_no_library_search() -> None:
    """Where liboqs is absent, importing asyncssh through the transport runs no ldconfig,
    gcc or ld for it (checked in a fresh interpreter)."""
    probe = (
        "import ctypes.util, subprocess\n"
        "asked = []\n"
        "real = ctypes.util.find_library\n"
        "ctypes.util.find_library = lambda n: asked.append(n) or real(n)\n"
        "import multihost.transport.ssh\n"
        "print(','.join(asked))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    if oqs._present():
        pytest.skip("liboqs is installed here: asyncssh's real search is kept")
    asked = out.stdout.strip().split(",")
    assert "oqs" not in asked
    assert "liboqs" not in asked
