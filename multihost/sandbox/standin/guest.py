"""The guest agent's part in first contact: a node's ``ssh-keys`` lines installed on its
workers a little after a metadata change, as the Google guest agent does.

The real agent reads each line ``USER:<type> <base64> ...``, creates USER on the worker and
puts the key in USER's ``authorized_keys``: the key logs in as USER and as nobody else. Here
each worker is a loopback host whose sshd also reads a file of ``keys_dir`` (the tests' fleet:
``guest_keys/<user>``, one Unix user per host; the sandbox: ``guest_keys/<host>``, all its
hosts being the user who runs it); a line is installed on a worker of the node only when it
names that worker's user (a line for any other user makes an account nobody logs into here).
What the agent installs it removes again (``forget``), leaving the hosts as it found them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def key_lines(ssh_keys: str) -> list[tuple[str, str]]:
    """``(user, "<type> <base64>")`` of each ``USER:<type> <base64> ...`` line."""
    out = []
    for line in ssh_keys.splitlines():
        user, _, key = line.partition(":")
        fields = key.split()
        if user and len(fields) >= 2 and not fields[0].startswith("{"):
            out.append((user.strip(), f"{fields[0]} {fields[1]}"))
    return out


class GuestAgent:
    """Installs each line's key for its user on the workers that are that user, after
    ``delay`` seconds. ``user_of``: a worker's host index -> its Unix user; ``file_of``: ->
    the name of its keys file in ``keys_dir`` (default: its user's name)."""

    def __init__(
        self,
        keys_dir: Path,
        user_of: Callable[[int], str],
        delay: float = 1.0,
        file_of: Callable[[int], str] | None = None,
    ) -> None:
        self.dir = keys_dir
        self.user_of = user_of
        self.file_of = file_of or user_of
        self.delay = delay
        self.installs = 0  # how many changes it has applied
        self.installed: list[tuple[str, str]] = []  # (file, key) it has installed
        self.lock = threading.Lock()

    def __call__(self, workers: Sequence[Any], ssh_keys: str) -> None:
        time.sleep(self.delay)
        with self.lock:
            for user, key in key_lines(ssh_keys):
                for w in workers:
                    name = self.file_of(w.host)
                    if self.user_of(w.host) != user or (name, key) in self.installed:
                        continue
                    self.dir.mkdir(mode=0o755, exist_ok=True)
                    with (self.dir / name).open("a") as f:
                        f.write(f"{key}\n")
                    self.installed.append((name, key))
            self.installs += 1

    def forget(self) -> None:
        """Remove every key it installed."""
        with self.lock:
            for name in {n for n, _ in self.installed}:
                (self.dir / name).unlink(missing_ok=True)
            self.installed = []
            self.installs = 0
