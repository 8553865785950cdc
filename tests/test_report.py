"""Pure presentation: tables that fit 80 columns, host lines made safe for a terminal, the
staged file list (gitignore-style directory excludes), markup that cannot eat text."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from rich.console import Console

from multihost.cli import report, terminal
from multihost.errors import UsageError
from multihost.model import Host, State
from multihost.results.records import HostResult, RunResult
from multihost.staging.archive import list_files
from multihost.sweep.results import PLOT_MISSING


def _render(table: object, width: int = 80) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, highlight=False, color_system=None).print(table)
    return out.getvalue().splitlines()


def test_wide_check_table_fits_80_columns_and_says_what_is_hidden() -> None:
    keys = [
        "slice",
        "worker",
        "process",
        "address",
        "internal_address",
        "state",
        "python",
        "jax",
        "jaxlib",
        "libtpu",
        "flax",
        "optax",
        "coordinator_port",
        "disk_free",
        "error",
    ]
    rows = [{k: f"{k}-value-{i}" for k in keys} for i in range(3)]
    lines = _render(report.fleet_table(rows, flagged={"jax"}, width=80))
    assert all(len(line) <= 80 for line in lines)
    header = lines[1]
    assert "slice" in header
    assert "jax ≠" in header  # a column whose values differ is always shown
    assert any("not shown:" in line for line in lines)
    assert len(lines) == 3 + 4 + 3  # no row wraps; the caption takes the last lines


def test_state_header_is_never_one_letter_per_line() -> None:
    rows = [{"host": "s0/w0", "address": "x" * 70, "state": "running", "exit": ""}]
    lines = _render(report.fleet_table(rows, width=80))
    assert all(len(line) <= 80 for line in lines)
    assert len(lines) == 5
    assert "…" in lines[3]


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("\x1b[1;31mred\x1b[0m", "\x1b[1;31mred\x1b[0m"),
        ("a\x1b]0;title\x07b", "ab"),
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),
        ("\x1b[2J\x1b[H\x1b[?25lok", "ok"),
        ("bell\x07 back\x08 nul\x00 c1\x9b2J tab\tend", "bell back nul c12J tab\tend"),
        (" 10%|#  \r 50%|#####  \r100%|##########\r", "100%|##########"),
        ("windows line\r", "windows line"),
        ("\x1bcreset\x1b(Bx", "resetx"),
    ],
)
def test_safe_text_keeps_colour_only(raw: str, safe: str) -> None:
    assert terminal.safe_text(raw) == safe


def test_trailing_slash_excludes_a_directory(tmp_path: Path) -> None:
    for name in ("a.py", "tests/t.py", "tests/data/d.bin", "src/tests/u.py", "testsx/k.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert list_files(tmp_path, ("tests/",)) == ["a.py", "testsx/k.py"]
    assert list_files(tmp_path, ("src/tests/",)) == [
        "a.py",
        "tests/data/d.bin",
        "tests/t.py",
        "testsx/k.py",
    ]


def test_stage_size_is_checked_while_listing(tmp_path: Path) -> None:
    (tmp_path / "small").write_bytes(b"x" * 10)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "f").write_bytes(b"x" * 5000)
    assert len(list_files(tmp_path, (), max_bytes=6000)) == 2
    with pytest.raises(UsageError, match=r"big \(4.9 KiB\)"):
        list_files(tmp_path, (), max_bytes=1000)


def test_plot_hint_survives_markup() -> None:
    out = io.StringIO()
    Console(file=out, width=200).print(terminal.warning(f"no sweep.png: {PLOT_MISSING}"))
    assert "pip install 'multihost[plot]'" in out.getvalue()


def test_host_text_in_tables_is_never_markup(tmp_path: Path) -> None:
    host = Host(address="h0", slice_id=0, worker_id=0, process_id=0)
    failed = HostResult(host=host, state=State.FAILED, exit_code=1, last_line="[/] oops [red]x")
    result = RunResult(run_name="r", hosts=(failed,), log_dir=tmp_path)
    assert "[/] oops [red]x" in "".join(_render(report.summary_table(result), width=200))
    rows = [{"run": "r", "command": "pip install 'multihost[plot]' [/]"}]
    assert "'multihost[plot]' [/]" in "".join(_render(report.fleet_table(rows, width=200)))


def test_a_block_is_cleaned_as_each_of_its_lines() -> None:
    rng = random.Random(7)
    alphabet = "\x1b[]\x07\\Pm0;1?/ ~ab\r\t\x00\x9b\x7f\x08c(B^X"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(12))) for _ in range(4000)]
    for start in range(0, len(texts), 40):
        batch = texts[start : start + 40]
        per_line = "".join(f"[w] {terminal.safe_text(t)}\n" for t in batch)
        assert terminal.safe_block(batch, "[w] ") == per_line, batch
