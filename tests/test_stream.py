"""Host output at line rate over ``--local``: nothing lost or reordered, logs byte-exact, and a
flooding host never holds back a quiet host's lines (the fast tier: no sshd, no root)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multihost.cli.output import FullWriter
from tests.clitools import REPO

LINES = 60_000  # per numbered host
# Host 0 floods until host 3 has ticked 5 times, 0.25 s apart (the flood is CPU-bound on
# purpose: each tick more is ~0.5 s of CPU for the flood alone); hosts 1 and 2 print numbered
# lines, with a few long lines (beyond the event bound, MAX_LINE), carriage returns and bytes
# that are not UTF-8 mixed in.
CMD = r"""
case $JAX_PROCESS_ID in
0) k=0; until [ -e "$HOME/ticked" ]; do seq 1 5000 | sed "s/^/flood $k /"; k=$((k + 1)); done ;;
3) for i in 1 2 3 4 5; do echo "tick $(date +%s.%N)"; sleep 0.25; done; : > "$HOME/ticked" ;;
*) seq 1 LINES | awk '{ print "n " $1 }
     $1 % 20000 == 0 { printf "long "; for (k = 0; k < 3000; k++) printf "0123456789"; print "" }
     $1 % 25000 == 0 { printf "cr\r\n"; printf "bad \377\376 end\n" }' ;;
esac
""".replace("LINES", str(LINES))


def _expected_log(i: int) -> bytes:
    out = bytearray()
    for n in range(1, LINES + 1):
        out += f"n {n}\n".encode()
        if n % 20000 == 0:
            out += b"long " + b"0123456789" * 3000 + b"\n"
        if n % 25000 == 0:
            out += b"cr\r\nbad \xff\xfe end\n"
    return bytes(out)


@pytest.fixture
def home(tmp_path: Path, code: Path) -> Path:
    """A private HOME beside ``code``."""
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_lines_are_complete_in_order_and_a_flood_does_not_delay_others(
    tmp_path: Path, home: Path
) -> None:
    argv = [
        sys.executable,
        "-m",
        "multihost",
        "run",
        "--local",
        "4",
        "--script-dir",
        str(tmp_path / "code"),
        "--log-dir",
        str(tmp_path / "logs"),
        "--run-name",
        "flood",
        "--stream",
        "all",
        "--cmd",
        CMD,
    ]
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert proc.stderr is not None
    arrived: list[tuple[float, bytes]] = []  # when each tick line reached us
    chunks: list[bytes] = []
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))  # type: ignore[union-attr]
    reader.start()
    tail = b""
    while chunk := os.read(proc.stdout.fileno(), 1 << 16):
        now = time.time()
        chunks.append(chunk)
        for line in (tail + chunk).split(b"\n")[:-1]:
            if b"tick " in line:
                arrived.append((now, line))
        tail = (tail + chunk).rsplit(b"\n", 1)[-1]
    assert proc.wait(timeout=120) == 0, b"".join(err)
    reader.join()
    proc.stdout.close()
    proc.stderr.close()
    out = b"".join(chunks).decode(errors="replace").splitlines()

    by_host: dict[str, list[str]] = {}
    for line in out:
        m = re.match(r"\[s0/w(\d)\] (.*)", line)
        assert m, line[:200]
        by_host.setdefault(m.group(1), []).append(m.group(2))
    blocks = len(by_host["0"]) // 5000
    assert blocks >= 2, len(by_host["0"])  # it did flood while host 3 ticked
    assert by_host["0"] == [f"flood {k} {n}" for k in range(blocks) for n in range(1, 5001)]
    for i in ("1", "2"):
        numbered = [t for t in by_host[i] if t.startswith("n ")]
        assert numbered == [f"n {n}" for n in range(1, LINES + 1)]  # none lost, none reordered
        long = [t for t in by_host[i] if t.startswith("long ")]
        assert len(long) == LINES // 20000
        assert all(t.endswith("more bytes in the log]") for t in long)  # cut, with the marker
        assert by_host[i].count("cr") == LINES // 25000
        assert by_host[i].count("bad \ufffd\ufffd end") == LINES // 25000
        log = tmp_path / "logs" / "flood" / f"slice_0000_worker_000{i}.log"
        assert log.read_bytes() == _expected_log(int(i))  # byte-exact

    assert len(arrived) == 5
    delays = [now - float(line.split(b"tick ")[1]) for now, line in arrived]
    assert max(delays) < 1.0, delays  # the flood never holds a quiet host's line back 1 s


# Writes 20 MB through FullWriter to its stdout (a pty) while signals with a handler arrive:
# each signal can cut a write short, which Python's own unbuffered stdout would not finish.
_PESTERED = """
import signal, sys
from multihost.cli.output import FullWriter
signal.signal(signal.SIGWINCH, lambda *_: None)
sys.stderr.write("ready\\n")
sys.stderr.flush()
out = FullWriter(1)
for _ in range(100):
    out.write(("x" * 99 + "\\n") * 2000)
"""


def test_a_write_cut_short_by_a_signal_still_writes_every_byte() -> None:
    master, slave = os.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _PESTERED],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    assert proc.stderr is not None
    assert proc.stderr.readline() == b"ready\n"
    got = 0
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGWINCH)
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the writer is gone
            break
        if not chunk:
            break
        got += chunk.count(b"\n")
    os.close(master)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    proc.stderr.close()
    assert got == 100 * 2000


def test_full_writer_waits_on_a_nonblocking_descriptor() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)  # another process may have made a shared stdout non-blocking
    data = ("y" * 63 + "\n") * 50_000  # 3.2 MB: far beyond a pipe's buffer
    got = bytearray()
    reader = threading.Thread(target=lambda: got.extend(iter_read(r)))
    reader.start()
    assert FullWriter(w).write(data) == len(data)
    os.close(w)
    reader.join(timeout=30)
    os.close(r)
    assert got == data.encode()


def iter_read(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 4096):
        out += chunk
        time.sleep(0.0002)  # a slow reader: the writer finds the pipe full
    return bytes(out)
