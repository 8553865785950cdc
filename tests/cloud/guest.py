"""The guest agent's part in first contact: a node's ``ssh-keys`` lines installed on its
workers a little after a metadata change, as the Google guest agent does.

The real agent reads each line ``USER:<type> <base64> ...``, creates USER on the worker and
puts the key in USER's ``authorized_keys``: the key logs in as USER and as nobody else. Here
each worker is a fleet host with one Unix user, whose sshd also reads ``guest_keys/<user>`` in
the fleet's directory (``tests/fleet.py``); a line is installed on a worker of the node only
when it names that worker's user (a line for any other user makes an account nobody logs into
here). What the agent installs it removes again (``forget``), leaving the fleet as it found it.
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
    ``delay`` seconds. ``user_of``: a worker's fleet host index -> its Unix user."""

    def __init__(self, keys_dir: Path, user_of: Callable[[int], str], delay: float = 1.0) -> None:
        self.dir = keys_dir
        self.user_of = user_of
        self.delay = delay
        self.installs = 0  # how many changes it has applied
        self.installed: list[tuple[str, str]] = []  # (user, key) it has installed
        self.lock = threading.Lock()

    def __call__(self, workers: Sequence[Any], ssh_keys: str) -> None:
        time.sleep(self.delay)
        users = {self.user_of(w.host) for w in workers}
        with self.lock:
            for user, key in key_lines(ssh_keys):
                if user not in users or (user, key) in self.installed:
                    continue
                self.dir.mkdir(mode=0o755, exist_ok=True)
                with (self.dir / user).open("a") as f:
                    f.write(f"{key}\n")
                self.installed.append((user, key))
            self.installs += 1

    def forget(self) -> None:
        """Remove every key it installed."""
        with self.lock:
            for user in {u for u, _ in self.installed}:
                (self.dir / user).unlink(missing_ok=True)
            self.installed = []
            self.installs = 0
