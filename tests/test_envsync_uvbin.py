"""Whether the runner's uv runs on a host: the binary's own header read,
checked against what hosts report; and when the builder fetches uv instead of being sent it."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest

from multihost.envsync.probe import Probe, RunnerUv
from multihost.envsync.uvbin import Binary, inspect, uv_binary
from multihost.model import Host

GLIBC = ("linux", "x86_64", "glibc-2.35")
MUSL_HOST = ("linux", "x86_64", "unknown")  # what a musl host's Python reports
ARM = ("linux", "aarch64", "glibc-2.35")


def _elf(machine: int, interp: bytes | None) -> bytes:
    """A 64-bit little-endian ELF header with one program header: PT_INTERP or PT_LOAD."""
    phoff, phsize = 64, 56
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", head, 16, 3, machine)
    struct.pack_into("<Q", head, 32, phoff)
    struct.pack_into("<HH", head, 54, phsize, 1)
    text = interp or b""
    ph = struct.pack(
        "<IIQQQQQQ", 3 if interp else 1, 4, phoff + phsize, 0, 0, len(text), len(text), 1
    )
    return bytes(head) + ph + text


def _macho(cpu: int) -> bytes:
    return b"\xcf\xfa\xed\xfe" + struct.pack("<I", cpu) + bytes(24)


@pytest.mark.parametrize(
    ("data", "binary", "fits"),
    [
        (
            _elf(0x3E, b"/lib64/ld-linux-x86-64.so.2\0"),
            Binary("linux", "x86_64", "glibc"),
            {GLIBC: True, MUSL_HOST: False, ARM: False},
        ),
        (
            _elf(0x3E, b"/lib/ld-musl-x86_64.so.1\0"),
            Binary("linux", "x86_64", "musl"),
            {GLIBC: False, MUSL_HOST: True, ARM: False},
        ),
        (
            _elf(0x3E, None),
            Binary("linux", "x86_64", "static"),
            {GLIBC: True, MUSL_HOST: True, ARM: False},
        ),
        (
            _elf(0xB7, b"/lib/ld-linux-aarch64.so.1\0"),
            Binary("linux", "aarch64", "glibc"),
            {GLIBC: False, MUSL_HOST: False, ARM: True},
        ),
        (
            _macho(0x0100000C),
            Binary("darwin", "aarch64"),
            {GLIBC: False, MUSL_HOST: False, ARM: False},
        ),
        (b"MZ" + bytes(62), Binary("windows", ""), {GLIBC: False, ARM: False}),
        (b"#!/bin/sh\nexec uv\n", Binary("unknown", ""), {GLIBC: False}),
    ],
)
def test_what_a_binary_runs_on(
    tmp_path: Path, data: bytes, binary: Binary, fits: dict[tuple[str, str, str], bool]
) -> None:
    path = tmp_path / "uv"
    path.write_bytes(data)
    assert inspect(path) == binary
    for host, ok in fits.items():
        assert binary.fits(*host) is ok, (binary, host)


def test_the_runners_own_uv_fits_this_machine() -> None:
    uv = uv_binary()
    if uv is None:
        pytest.skip("no uv here")
    libc = "-".join(os.confstr("CS_GNU_LIBC_VERSION").split()) if sys.platform == "linux" else ""
    assert inspect(uv).fits(sys.platform, os.uname().machine, libc)


def _probe(machine: str = "x86_64", libc: str = "glibc-2.36", uv: str = "none") -> Probe:
    line = (
        f"key={'k' * 32} state=absent python=3.11.2 impl=cpython exe=/usr/bin/python3 "
        f"machine={machine} envs=/h/.multihost/envs uv={uv} os=linux libc={libc}"
    )
    return Probe.parse(Host(address="127.0.0.1", process_id=0), line)


def test_builder_gets_the_runners_uv_only_where_it_runs() -> None:
    linux = RunnerUv("/u/uv", "0.13.9", Binary("linux", "x86_64", "glibc"), fetch=False)
    assert linux.ships_to(_probe())
    assert not linux.ships_to(_probe(machine="aarch64"))  # fetched there instead
    assert not linux.ships_to(_probe(libc="unknown"))  # a musl host
    mac = RunnerUv("/u/uv", "0.13.9", Binary("darwin", "aarch64"), fetch=False)
    assert not mac.ships_to(_probe())
    asked = RunnerUv("/u/uv", "0.13.9", Binary("linux", "x86_64", "glibc"), fetch=True)
    assert not asked.ships_to(_probe())  # --host-uv fetch
    assert not RunnerUv(None, "0.13.9", Binary("unknown", ""), fetch=False).ships_to(_probe())
    old = Probe.parse(
        Host(address="h", process_id=0),
        "key=k state=absent python=3.11.2 exe=/p machine=x86_64 envs=/e uv=none",
    )
    assert (old.os, old.libc) == ("linux", "")  # a probe line without them: not glibc
