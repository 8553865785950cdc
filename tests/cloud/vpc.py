"""The workers' VPC, modelled honestly: internal addresses the workers reach and the runner
does not.

A network namespace of its own holds one sshd per worker, listening on port 22 of the
worker's internal address, as the loopback fleet's host ``i`` (same user, host key and
authorized keys). The addresses are ``127.77.x.y``: loopback addresses of the namespace's own
``lo``, so nothing sent to them ever leaves this machine (this machine's default route
accepts connections to any outside address, 10.x included). In this machine's own
namespace, where the runner runs, nothing listens there: a runner that connects straight to
an internal address is refused, so a test fails if multihost quietly connects directly.
From inside, every worker reaches every other (a hop's ``direct-tcpip``), as in a VPC. The
IAP relay stand-in (``tests/cloud/iap.py``) reaches in as Google's relay does: its backend
sockets are made inside the namespace (``connect``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests import fleet as loopback

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def name() -> str:
    """The namespace's name: one per test fleet (several fleets run side by side)."""
    return f"mh-vpc-{loopback.PORT}"


def address(i: int) -> str:
    """Worker ``i``'s internal address (inside the namespace only)."""
    return f"127.77.{i // 250}.{2 + i % 250}"


def usable() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{name()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Vpc:
    """The namespace and the workers' sshds in it (``up``/``down``)."""

    def __init__(self, fleet: loopback.Fleet) -> None:
        self.fleet = fleet
        self.ns = name()
        self.dir = fleet.dir / "vpc"
        self.connects: list[tuple[str, int]] = []  # what the relay opened into the VPC

    def up(self) -> None:
        self.down()
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        self._ip("link", "set", "lo", "up")  # all of 127.0.0.0/8 is its own from then on
        for h in self.fleet.hosts:
            self.start_host(h.index)

    def down(self) -> None:
        """Every sshd in the namespace killed, the namespace deleted (also what a crashed run
        left)."""
        if not Path(f"/run/netns/{self.ns}").exists():
            return
        pids = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.ns, *args], check=True)

    def _pidfile(self, i: int) -> Path:
        return self.dir / f"h{i}.pid"

    def start_host(self, i: int) -> None:
        """Worker ``i``'s sshd, listening on its internal address inside the namespace."""
        self.dir.mkdir(parents=True, exist_ok=True)
        text = (self.fleet.dir / "hosts" / f"h{i}" / "sshd_config").read_text()
        text = re.sub(r"(?m)^ListenAddress .*$", f"ListenAddress {address(i)}:22", text)
        text = re.sub(r"(?m)^PidFile .*$", f"PidFile {self._pidfile(i)}", text)
        conf = self.dir / f"h{i}.sshd_config"
        conf.write_text(text)
        self._pidfile(i).unlink(missing_ok=True)
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.ns,
                loopback.SSHD,
                "-f",
                str(conf),
                "-E",
                str(self.dir / f"h{i}.log"),
            ],
            check=True,
        )
        deadline = time.monotonic() + loopback.START_TIMEOUT
        while not self._pidfile(i).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the VPC's sshd for h{i} did not start")
            time.sleep(0.01)

    def running(self, i: int) -> bool:
        try:
            return Path(f"/proc/{int(self._pidfile(i).read_text())}").exists()
        except (OSError, ValueError):
            return False

    def stop_host(self, i: int) -> None:
        """Worker ``i``'s sshd and its sessions killed (the VM is gone; its jobs run on)."""
        try:
            pid = int(self._pidfile(i).read_text())
        except (OSError, ValueError):
            return
        victims = [pid, *_sshd_children(pid)]
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        self._pidfile(i).unlink(missing_ok=True)

    def connect(self, host: str, port: int, timeout: float = 10) -> socket.socket:
        """A TCP connection to ``host:port`` made from inside the VPC (the IAP relay's way
        in)."""
        sock = _socket_in(f"/run/netns/{self.ns}")
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        self.connects.append((host, port))
        return sock


def _sshd_children(root: int) -> Sequence[int]:
    """The session sshds under a listener (found through /proc)."""
    out, todo = [], [root]
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (proc / "stat").read_text()
                parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    while todo:
        parent = todo.pop()
        for pid, pp in parents.items():
            if pp == parent:
                with contextlib.suppress(OSError):
                    if b"sshd" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        out.append(pid)
                        todo.append(pid)
    return out


def _socket_in(ns_path: str) -> socket.socket:
    """A TCP socket that belongs to the namespace at ``ns_path``: this thread enters it just
    to make the socket (a socket keeps the namespace it was made in), then comes back."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(ns_path, os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns_path}: {os.strerror(err)}")
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                os._exit(70)  # a thread stuck in the VPC would make every later test a lie
    finally:
        os.close(own)
        os.close(target)


@contextlib.contextmanager
def vpc(fleet: loopback.Fleet) -> Iterator[Vpc]:
    """The VPC up for ``fleet``'s hosts, down afterwards."""
    v = Vpc(fleet)
    v.up()
    try:
        yield v
    finally:
        v.down()
