"""Output of any shape costs the runner bounded memory; the log files keep every byte.

Each case runs over ``--local`` (no root) and over the real sshd fleet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multihost.runs.stream import LAST_LINE
from tests.faults.conftest import Where
from tests.faults.harness import run_measured

BIG = 20_000_000
# One 20 MB line, then exit 3 (no buffer may hold it whole): shell only, so it runs on any host.
HUGE_LINE = f"head -c {BIG} /dev/zero | tr '\\0' a; echo; exit 3"
# 60 MB of 1000-character lines, as fast as the host can print them.
FLOOD = "yes $(printf 'x%.0s' $(seq 1 999)) | head -c 60000000"


@pytest.fixture
def code(code: Path) -> Path:
    """The shared code dir plus ``blob.bin``: every byte value, no trailing newline (binary
    output must reach the log unchanged)."""
    (code / "blob.bin").write_bytes(bytes(range(256)) * 64 + b"\x00\xffend")
    return code


def test_one_huge_line_then_exit_3(where: Where, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = f'[ "$JAX_PROCESS_ID" = 1 ] && {{ {HUGE_LINE}; }}; sleep 0.5'
    res = run_measured(where.args(code, logs, "huge", cmd), timeout=60)
    print(f"20 MB line + exit 3: {res.wall:.1f} s, runner peak {res.max_rss_mb:.0f} MB")
    assert res.returncode == 1, res.stderr
    assert "s0/w1 exited with code 3" in res.stderr
    assert res.wall < 15, f"the run took {res.wall:.1f} s"
    assert res.max_rss_mb < 200, f"runner peak RSS {res.max_rss_mb:.0f} MB"
    record = logs / "huge" / "run.json"
    assert record.stat().st_size < 1_000_000
    last = json.loads(record.read_text())["hosts"][1]["last_line"]
    assert last.startswith("a" * LAST_LINE)
    assert "more characters" in last
    assert len(last) < LAST_LINE + 50
    log = (logs / "huge" / "slice_0000_worker_0001.log").read_bytes()
    assert log == b"a" * BIG + b"\n"


def test_binary_without_trailing_newline(where: Where, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = run_measured(where.args(code, logs, "bin", "cat blob.bin"), timeout=60)
    assert res.returncode == 0, res.stderr
    for i in range(2):
        log = logs / "bin" / f"slice_0000_worker_{i:04d}.log"
        assert log.read_bytes() == (code / "blob.bin").read_bytes()


def test_flood_of_lines_bounded_memory(where: Where, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = run_measured(where.args(code, logs, "flood", FLOOD), timeout=120)
    print(f"60 MB flood: {res.wall:.1f} s, runner peak {res.max_rss_mb:.0f} MB")
    assert res.returncode == 0, res.stderr
    assert res.max_rss_mb < 200, f"runner peak RSS {res.max_rss_mb:.0f} MB"
    for i in range(2):
        assert (logs / "flood" / f"slice_0000_worker_{i:04d}.log").stat().st_size == 60_000_000
