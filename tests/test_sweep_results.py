"""Sweep results: result lines, results.jsonl/csv, summaries and the chart. Pure, no SSH."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from multihost.results.records import find_result, read_result
from multihost.sweep.grid import Point, expand
from multihost.sweep.results import (
    NO_RESULT,
    PLOT_MISSING,
    Record,
    ResultsStore,
    latest,
    point_status,
    summarize,
    write_chart,
)

GRID = {"fsdp": ("1", "2"), "tp": ("2", "1"), "b": ("4096", "16384")}
NAMES = list(GRID)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def record(p: Point, repeat: int, metric: float | None, status: str = "ok") -> Record:
    result: dict[str, Any] = {} if metric is None else {"tflops": metric, "steps": 10}
    return Record(
        point=p.id,
        repeat=repeat,
        values=p.as_dict(),
        status=status,
        result=result,
        run=f"sw-{p.id}-r{repeat}",
        command=p.command("run " + " ".join(f"{{{n}}}" for n, _ in p.values)),
        started=100.0,
        ended=160.5,
    )


def test_find_result_last_valid_line_wins() -> None:
    text = "\n".join(
        [
            'MULTIHOST_RESULT {"tflops": 1}',
            "step 1 loss 2.0",
            '   MULTIHOST_RESULT {"tflops": 2, "nested": {"a": [1]}}\r',
            "MULTIHOST_RESULT {not json",
            'MULTIHOST_RESULT ["a list"]',
            'MULTIHOST_RESULTS {"tflops": 9}',
            'MULTIHOST_RESULT{"tflops": 8}',
            'echo MULTIHOST_RESULT {"tflops": 7}',
            "done",
        ]
    )
    assert find_result(text) == {"tflops": 2, "nested": {"a": [1]}}
    assert find_result("no result here\n") is None
    assert find_result("") is None


def test_read_result(tmp_path: Path) -> None:
    log = tmp_path / "w0.log"
    log.write_bytes(b'\xff\xfe junk\nMULTIHOST_RESULT {"x": 1}\n')
    assert read_result(log) == {"x": 1}
    assert read_result(tmp_path / "missing.log") is None


def test_point_status() -> None:
    assert point_status(True, "", {"x": 1}) == "ok"
    assert point_status(True, "", None) == NO_RESULT
    assert point_status(False, "timed out after 60s", {"x": 1}) == "timed out after 60s"
    assert point_status(False, "", None) == "failed"


def test_record_to_json_flattens_and_prefixes_collisions() -> None:
    p = expand(GRID)[0]
    rec = Record(
        p.id,
        1,
        p.as_dict(),
        "ok",
        {"tflops": 3.5, "status": "fine", "fsdp": 99, "result.fsdp": 7, "mesh": [1, 2]},
        run="r1",
        command="run 1 2 4096",
    )
    row = rec.to_json()
    assert list(row)[:10] == [
        "fsdp",
        "tp",
        "b",
        "point",
        "repeat",
        "status",
        "run",
        "command",
        "started",
        "ended",
    ]
    assert row["fsdp"] == 1
    assert row["status"] == "ok"
    assert row["result.status"] == "fine"
    assert row["result.fsdp"] == 99
    assert row["result.result.fsdp"] == 7
    assert row["tflops"] == 3.5
    assert row["mesh"] == [1, 2]
    assert rec.ok
    assert json.loads(json.dumps(row)) == row


def test_store_append_load_and_torn_line(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "sweeps" / "s1")
    assert store.load() == []
    assert store.completed_ok() == set()
    points = expand(GRID)
    store.append(record(points[0], 0, 10.0))
    store.append(record(points[0], 1, None, status="timed out"))
    # A crash mid-write leaves half a line with no newline.
    with open(store.path, "ab") as f:
        f.write(b'{"point": "fsdp2-tp2-b4096", "repe')
    assert [r["repeat"] for r in store.load()] == [0, 1]
    store.append(record(points[1], 0, 11.0))  # must not be glued onto the torn line
    rows = store.load()
    assert [(r["point"], r["repeat"]) for r in rows] == [
        (points[0].id, 0),
        (points[0].id, 1),
        (points[1].id, 0),
    ]
    assert store.path.read_bytes().endswith(b"\n")
    assert store.completed_ok() == {(points[0].id, 0), (points[1].id, 0)}


def test_store_accepts_plain_rows(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    store.append({"a": 1, "point": "a1", "repeat": 0, "status": "ok"})
    store.path.write_text(store.path.read_text() + "[1, 2]\n\n")
    assert store.load() == [{"a": 1, "point": "a1", "repeat": 0, "status": "ok"}]
    assert store.completed_ok() == {("a1", 0)}


def test_csv_columns_and_cells(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    p = expand(GRID)[0]
    rows = [
        Record(
            p.id, 0, p.as_dict(), "ok", {"zeta": 1, "alpha": {"k": [1]}, "flag": True}
        ).to_json(),
        Record(p.id, 1, p.as_dict(), "exited with code 1", run="r", command="run 1").to_json(),
    ]
    path = store.write_csv(rows, NAMES)
    assert path == tmp_path / "results.csv"
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == [
        "fsdp",
        "tp",
        "b",
        "point",
        "repeat",
        "status",
        "run",
        "alpha",
        "flag",
        "zeta",
        "started",
        "ended",
        "command",
    ]
    assert table[1] == [
        "1",
        "2",
        "4096",
        p.id,
        "0",
        "ok",
        "",
        '{"k": [1]}',
        "true",
        "1",
        "",
        "",
        "",
    ]
    assert table[2][5] == "exited with code 1"
    assert table[2][-1] == "run 1"
    # Without grid names the keys before "point" are the grid.
    store.write_csv(rows)
    assert path.read_text().splitlines()[0].startswith("fsdp,tp,b,point,repeat,status,run,")
    assert not list(tmp_path.glob("*.tmp"))


def rows_for_sweep() -> tuple[list[Point], list[dict[str, Any]]]:
    """8 points, 3 repeats: varied metrics, a failing point, a partial one, a rerun."""
    points = expand(GRID)
    recs = []
    for p in points:
        for r in range(3):
            if p.index == 5:
                recs.append(record(p, r, None, status="timed out"))
            elif p.index == 6:
                recs.append(record(p, r, None, status="ok"))  # ok, but no metric
            elif p.index == 2 and r == 2:
                recs.append(record(p, r, None, status="exited with code 1"))
            else:
                recs.append(record(p, r, 10.0 * p.index + r))
    recs.append(record(points[7], 0, 1000.0))  # a rerun of (p7, 0) replaces the first
    return points, [rec.to_json() for rec in recs]


def test_latest_keeps_last_per_repeat() -> None:
    _, rows = rows_for_sweep()
    kept = latest(rows)
    assert len(kept) == 24
    p7 = [r for r in kept if r["point"] == "fsdp2-tp1-b16384"]
    assert sorted(r["tflops"] for r in p7) == [71.0, 72.0, 1000.0]


def test_summarize_medians_order_and_failures() -> None:
    points, rows = rows_for_sweep()
    summary = summarize(rows, "tflops", NAMES)
    assert [s["point"] for s in summary] == [points[i].id for i in (7, 4, 3, 2, 1, 0, 5, 6)]
    top = summary[0]
    assert top["metric"] == 72.0  # median of 1000, 71, 72
    assert top["metrics"] == [1000.0, 71.0, 72.0]
    assert top["run"] == f"sw-{points[7].id}-r0"  # the best single repeat's run
    assert top["best"] is True
    assert top["rank"] == 1
    assert top["values"] == {"fsdp": 2, "tp": 1, "b": 16384}
    assert top["label"] == "fsdp=2 tp=1 b=16384"
    assert top["command"] == "run 2 1 16384"
    assert (top["n_ok"], top["n"], top["status"], top["reasons"]) == (3, 3, "ok", [])
    partial = next(s for s in summary if s["point"] == points[2].id)
    assert (partial["n_ok"], partial["n"], partial["metric"]) == (2, 3, 20.5)
    assert partial["status"] == "ok"
    assert partial["reasons"] == ["exited with code 1"]
    failed, no_metric = summary[-2:]
    assert (failed["metric"], failed["status"], failed["n_ok"]) == (None, "timed out", 0)
    assert failed["rank"] is None
    assert not failed["best"]
    assert no_metric["status"] == "no numeric 'tflops' in the result"
    assert no_metric["n_ok"] == 3
    assert [s["rank"] for s in summary[:6]] == [1, 2, 3, 4, 5, 6]


def test_summarize_lower_is_better_and_best() -> None:
    points, rows = rows_for_sweep()
    summary = summarize(rows, "tflops", NAMES, higher_is_better=False)
    assert summary[0]["point"] == points[0].id
    assert summary[0]["metric"] == 1.0
    assert summary[0]["best"] is True
    high = summarize(rows, "tflops", NAMES)
    assert high[0]["point"] == points[7].id
    assert high[0]["best"] is True
    assert not any(s["best"] for s in summarize(rows, "no_such_metric", NAMES))
    assert summarize([], "tflops", NAMES) == []


def test_summarize_ignores_non_numeric_metrics() -> None:
    p = expand({"a": ("1",)})[0]
    rows = [
        Record(p.id, 0, p.as_dict(), "ok", {"m": "fast"}).to_json(),
        Record(p.id, 1, p.as_dict(), "ok", {"m": float("nan")}).to_json(),
        Record(p.id, 2, p.as_dict(), "ok", {"m": True}).to_json(),
        Record(p.id, 3, p.as_dict(), "ok", {"m": 4}).to_json(),
    ]
    (row,) = summarize(rows, "m", ["a"])
    assert (row["metric"], row["n_ok"], row["n"], row["best"]) == (4, 4, 4, True)


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    image = pytest.importorskip("matplotlib.image").imread(path)
    assert image.shape[0] > 100
    assert image.shape[1] > 100


@pytest.mark.parametrize("names", [["fsdp", "tp", "b"], ["b"]])
def test_chart_written(tmp_path: Path, names: list[str]) -> None:
    pytest.importorskip("matplotlib")
    grid = {n: GRID[n] for n in names}
    rows = [record(p, r, 5.0 + p.index + r).to_json() for p in expand(grid) for r in range(2)]
    rows.append(record(expand(grid)[0], 2, None, status="timed out").to_json())
    summary = summarize(rows, "tflops", names)
    out = tmp_path / "sweep.png"
    assert write_chart(out, summary, "tflops", names) is None
    _check_png(out)


def test_chart_with_nothing_to_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    p = expand({"a": ("1",)})[0]
    summary = summarize([Record(p.id, 0, p.as_dict(), "timed out").to_json()], "m", ["a"])
    out = tmp_path / "sweep.png"
    assert write_chart(out, summary, "m", ["a"]) == "no point has a numeric 'm'; no chart"
    assert not out.exists()


def test_chart_unwritable_path(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _, rows = rows_for_sweep()
    summary = summarize(rows, "tflops", NAMES)
    message = write_chart(tmp_path / "no" / "dir" / "sweep.png", summary, "tflops", NAMES)
    assert message is not None
    assert message.startswith("could not write")


def test_chart_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes any import of it fail, as if it were not installed.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    _, rows = rows_for_sweep()
    out = tmp_path / "sweep.png"
    assert write_chart(out, summarize(rows, "tflops", NAMES), "tflops", NAMES) == PLOT_MISSING
    assert "pip install 'multihost[plot]'" in PLOT_MISSING
    assert not out.exists()


def test_payloads_print_the_marker_sweeps_read() -> None:
    """Payloads are standalone scripts (no multihost import on the hosts), so they keep their
    own copy of the marker; it must be the one the runner reads."""
    from multihost.results.records import RESULT_MARKER

    text = (Path(__file__).resolve().parent.parent / "payloads" / "meshing.py").read_text()
    assert f'RESULT_PREFIX = "{RESULT_MARKER} "' in text
