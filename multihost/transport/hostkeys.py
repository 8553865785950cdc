"""multihost's own trust-on-first-use known_hosts file: forgetting recorded keys."""

from __future__ import annotations

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
