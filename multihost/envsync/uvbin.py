"""The runner's uv binary: where it is (:func:`uv_binary`), its version (:func:`uv_version`),
and whether it runs on a host: its OS, machine and C library, read from the binary's own header
(ELF, Mach-O, PE), never from ``uv --version`` (a packaged uv may not say).

A Linux uv is either dynamically linked against glibc (the ``manylinux`` wheels, uv's ``-gnu``
builds), against musl, or static (uv's ``-musl`` builds are static): a static one runs on any
Linux of its machine, a glibc one only where the host's ``libc`` is glibc.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_ELF_MACHINES = {
    0x3E: "x86_64",
    0xB7: "aarch64",
    0x03: "i686",
    0x28: "armv7l",
    0xF3: "riscv64",
    0x15: "ppc64le",
    0x16: "s390x",
}
_MACHO_CPUS = {0x01000007: "x86_64", 0x0100000C: "aarch64"}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "x64": "x86_64"}
PT_INTERP = 3


def uv_binary() -> str | None:
    """The runner's uv: on PATH, else the one the ``uv`` package installed."""
    found = shutil.which("uv")
    if found:
        return os.path.realpath(found) if not _is_shim(found) else _package_uv() or found
    return _package_uv()


def _is_shim(path: str) -> bool:
    return "/shims/" in path


def _package_uv() -> str | None:
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        return None


def uv_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    words = out.stdout.split()
    return words[1] if out.returncode == 0 and len(words) > 1 else ""


@dataclass(frozen=True)
class Binary:
    """What a binary needs of the machine that runs it."""

    os: str  # linux, darwin, windows, or unknown
    machine: str  # x86_64, aarch64, ... ("" when unknown)
    libc: str = ""  # Linux: glibc, musl or static

    def fits(self, os: str, machine: str, libc: str) -> bool:
        """Whether it runs on a host that reports ``sys.platform``, its machine and its libc
        (``glibc-2.35``; anything else is not glibc)."""
        if self.os != "linux" or os != "linux" or not self.machine:
            return self.os == os != "linux" and self.machine in (normal(machine), "universal")
        if self.machine != normal(machine):
            return False
        if self.libc == "static":
            return True
        return (self.libc == "glibc") == libc.startswith("glibc")

    def __str__(self) -> str:
        return "-".join(p for p in (self.os, self.machine, self.libc) if p)


def normal(machine: str) -> str:
    return _ALIASES.get(machine.lower(), machine.lower())


def inspect(path: str | Path) -> Binary:
    """The OS, machine and C library a binary is built for (``unknown`` when not a binary)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] == b"\x7fELF":
                return _elf(f, head)
    except OSError:
        return Binary("unknown", "")
    if head[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"):
        (cpu,) = struct.unpack_from("<I", head, 4)
        return Binary("darwin", _MACHO_CPUS.get(cpu, ""))
    if head[:4] in (b"\xca\xfe\xba\xbe", b"\xbe\xba\xfe\xca"):
        return Binary("darwin", "universal")
    if head[:2] == b"MZ":
        return Binary("windows", "")
    return Binary("unknown", "")


def _elf(f: BinaryIO, head: bytes) -> Binary:
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    (machine,) = struct.unpack_from(order + "H", head, 18)
    if wide:
        (phoff,) = struct.unpack_from(order + "Q", head, 32)
        size, count = struct.unpack_from(order + "HH", head, 54)
    else:
        (phoff,) = struct.unpack_from(order + "I", head, 28)
        size, count = struct.unpack_from(order + "HH", head, 42)
    libc = "static"
    for i in range(min(count, 64)):
        f.seek(phoff + i * size)
        entry = f.read(size)
        if len(entry) < size or struct.unpack_from(order + "I", entry, 0)[0] != PT_INTERP:
            continue
        if wide:
            (offset,) = struct.unpack_from(order + "Q", entry, 8)
            (length,) = struct.unpack_from(order + "Q", entry, 32)
        else:
            (offset,) = struct.unpack_from(order + "I", entry, 4)
            (length,) = struct.unpack_from(order + "I", entry, 16)
        f.seek(offset)
        interp = f.read(min(length, 256))
        libc = "musl" if b"musl" in interp else "glibc"
        break
    return Binary("linux", _ELF_MACHINES.get(machine, ""), libc)
