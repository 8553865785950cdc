"""The guest agent's part in first contact (issue 26): a node's ``ssh-keys`` lines installed
on its workers a little after a metadata change, as the Google guest agent does.

The loopback fleet's hosts share one ``authorized_keys`` file (``tests/fleet.py``), so a key
installed for one worker is accepted by every fleet host; what the agent adds it removes again
(``forget``), leaving the shared fleet as it found it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path


class GuestAgent:
    """Installs ``USER:<type> <base64> ...`` lines' keys after ``delay`` seconds."""

    def __init__(self, authorized_keys: Path, delay: float = 1.0) -> None:
        self.file = authorized_keys
        self.delay = delay
        self.added: list[str] = []
        self.installs = 0  # how many changes it has applied
        self.lock = threading.Lock()

    def __call__(self, workers: object, ssh_keys: str) -> None:
        time.sleep(self.delay)
        keys = []
        for line in ssh_keys.splitlines():
            _, _, key = line.partition(":")
            fields = key.split()
            if len(fields) >= 2 and not fields[0].startswith("{"):
                keys.append(f"{fields[0]} {fields[1]}")
        with self.lock:
            present = self.file.read_text().splitlines()
            new = [k for k in keys if k not in present and k not in self.added]
            if new:
                with self.file.open("a") as f:
                    f.write("".join(f"{k}\n" for k in new))
                self.added += new
            self.installs += 1

    def forget(self) -> None:
        """Remove every key it installed (the fleet is shared)."""
        with self.lock:
            if self.added:
                kept = [ln for ln in self.file.read_text().splitlines() if ln not in self.added]
                self.file.write_text("".join(f"{ln}\n" for ln in kept))
            self.added = []
            self.installs = 0
