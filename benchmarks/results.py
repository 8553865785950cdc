"""The one way a benchmark writes its own section of benchmarks/RESULTS.md, and the one way a
benchmark's worker process ends."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def markers(name: str) -> tuple[str, str]:
    """The comments that open and close the section ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_section(name: str, block: str, path: Path = RESULTS) -> None:
    """Put ``block`` (which runs from the section's begin marker to its end marker) where the
    section ``name`` is, or at the end of the file if it has none yet; the rest is kept."""
    begin, end = markers(name)
    block = block.strip("\n")
    if not (block.startswith(begin) and block.endswith(end)):
        raise ValueError(f"the {name} block must run from {begin} to {end}")
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def worker_exit(method: str, failed: Sequence[str]) -> int:
    """A worker's exit status: 1, and the first failed host named on stderr, if any failed."""
    if failed:
        print(f"{method}: {len(failed)} host(s) failed, first {failed[0]}", file=sys.stderr)
        return 1
    return 0
