"""multihost's own known_hosts file: keys trusted on first use, keys the cloud publishes for its
TPU workers (pinned), and forgetting them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def forget(addresses: Sequence[str], trust_file: Path) -> list[str]:
    """Drop the recorded keys of these addresses (any port) from the trust file."""
    if not trust_file.is_file():
        return []
    wanted = set(addresses)
    kept: list[str] = []
    dropped: list[str] = []
    for line in trust_file.read_text().splitlines(keepends=True):
        names = line.split(maxsplit=1)[0].split(",") if line.strip() else []
        hosts = {n[1:].split("]")[0] if n.startswith("[") else n for n in names}
        (dropped if hosts & wanted else kept).append(line)
    if dropped:
        trust_file.write_text("".join(kept))
    return [line.split(maxsplit=1)[0] for line in dropped]


def record_pins(pins: Sequence[tuple[str, int | None, Sequence[str]]], trust_file: Path) -> int:
    """Write the keys the cloud publishes for these hosts (address, port, ``"<type> <base64>"``
    keys) into the trust file, replacing whatever was recorded for them: later commands on the
    run (attach, status, kill) then verify against the published keys, and a re-created VM's
    new key replaces its old one without ``forget``. Returns the lines written."""
    if not pins:
        return 0
    forget([address for address, _, _ in pins], trust_file)
    lines = []
    for address, port, keys in pins:
        name = address if port in (None, 22) else f"[{address}]:{port}"
        lines += [f"{name} {key}\n" for key in keys if len(key.split()) == 2]
    trust_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(trust_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.writelines(lines)
    return len(lines)
