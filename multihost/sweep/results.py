"""Sweep results: the payload's result line, results.jsonl and .csv, the summary, the chart."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multihost.results.records import RESULT_MARKER
from multihost.runs.files import private_dir
from multihost.sweep.grid import RESERVED
from multihost.sweep.where import Value

NO_RESULT = f"no {RESULT_MARKER} line from process 0"
PLOT_MISSING = "matplotlib not installed: pip install 'multihost[plot]' for sweep.png"
Row = dict[str, Any]
# CSV columns after the grid names; the result fields go between these two groups.
_FIRST = ("point", "repeat", "status", "run")
_LAST = ("started", "ended", "command")


def point_status(run_ok: bool, reason: str, result: Mapping[str, Any] | None) -> str:
    """``ok``, or why a point's run does not count: its failure, or no result line."""
    if not run_ok:
        return reason or "failed"
    return "ok" if result is not None else NO_RESULT


@dataclass(frozen=True)
class Record:
    """One run of one point: its values, how it ended and what its result line said."""

    point: str
    repeat: int
    values: Mapping[str, Value]
    status: str
    result: Mapping[str, Any] = field(default_factory=dict)
    run: str = ""
    command: str = ""
    started: float | None = None
    ended: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> Row:
        """Flat row: grid values, the record's own keys, then the result's fields.

        A result field named like a grid axis or a record key is stored as ``result.<name>``.
        """
        row: Row = {**self.values, "point": self.point, "repeat": self.repeat}
        row |= {"status": self.status, "run": self.run, "command": self.command}
        row |= {"started": self.started, "ended": self.ended}
        for key, value in self.result.items():
            name = key
            while name in row or name in RESERVED:
                name = f"result.{name}"
            row[name] = value
        return row


class ResultsStore:
    """``results.jsonl`` (append-only, fsynced per record) and ``results.csv`` in a sweep dir."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / "results.jsonl"
        self.csv_path = self.directory / "results.csv"

    def append(self, record: Record | Mapping[str, Any]) -> None:
        """Add one row and make it durable before returning."""
        row = record.to_json() if isinstance(record, Record) else dict(record)
        data = (json.dumps(row, default=str) + "\n").encode()
        private_dir(self.directory)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a+b") as f:
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # a crash tore the last line; don't glue onto it
                    data = b"\n" + data
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> list[Row]:
        """Every row in order; torn or malformed lines (from a crash) are skipped."""
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        rows: list[Row] = []
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def completed_ok(self) -> set[tuple[str, int]]:
        """``(point id, repeat)`` of every run already ok, for ``--resume``."""
        return {
            (str(r["point"]), r["repeat"])
            for r in self.load()
            if r.get("status") == "ok" and "point" in r and isinstance(r.get("repeat"), int)
        }

    def write_csv(self, rows: Sequence[Row], grid_names: Sequence[str] | None = None) -> Path:
        """Rewrite ``results.csv``: grid names, point/repeat/status/run, result fields sorted.

        Without ``grid_names`` the keys before ``point`` in each row are taken as the grid.
        """
        grid = list(grid_names) if grid_names is not None else _leading_keys(rows)
        fixed = {*grid, *_FIRST, *_LAST}
        extra = sorted({k for row in rows for k in row} - fixed)
        columns = [*grid, *_FIRST, *extra, *_LAST]
        private_dir(self.directory)
        tmp = self.csv_path.with_suffix(".csv.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows([_cell(row.get(c)) for c in columns] for row in rows)
        os.replace(tmp, self.csv_path)  # readers never see a half-written table
        return self.csv_path


def _leading_keys(rows: Iterable[Row]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key == "point":
                break
            names[key] = None
    return list(names)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool | list | dict):
        return json.dumps(value)
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def latest(rows: Iterable[Row]) -> list[Row]:
    """One row per (point, repeat), the last written winning (a resumed rerun replaces)."""
    kept: dict[tuple[Any, Any], Row] = {}
    for row in rows:
        kept[(row.get("point"), row.get("repeat"))] = row
    return list(kept.values())


def summarize(
    rows: Iterable[Row], metric: str, grid_names: Sequence[str], higher_is_better: bool = True
) -> list[Row]:
    """One row per point, best median ``metric`` first; points without one last, with why.

    Keys: point, index (first-seen order), values, label, metric (median over ok repeats),
    metrics (each ok repeat's), n_ok, n, status (``ok`` or a reason), reasons (every failure),
    command, run (of the best repeat), rank (1 = best; None without a metric), best.
    """
    groups: dict[str, list[Row]] = {}
    for row in latest(rows):
        groups.setdefault(str(row.get("point")), []).append(row)
    summary: list[Row] = []
    for index, (point, runs) in enumerate(groups.items()):
        runs.sort(key=lambda r: r["repeat"] if isinstance(r.get("repeat"), int) else 0)
        ok = [r for r in runs if r.get("status") == "ok"]
        scored = [r for r in ok if _number(r.get(metric))]
        reasons = [str(r.get("status")) for r in runs if r.get("status") != "ok"]
        if len(scored) < len(ok):
            reasons.append(f"no numeric {metric!r} in the result")
        top = max(scored, key=lambda r: r[metric] if higher_is_better else -r[metric], default=None)
        values = {n: runs[0].get(n) for n in grid_names}
        summary.append(
            {
                "point": point,
                "index": index,
                "values": values,
                "label": " ".join(f"{n}={v}" for n, v in values.items()),
                "metric": statistics.median(r[metric] for r in scored) if scored else None,
                "metrics": [r[metric] for r in scored],
                "n_ok": len(ok),
                "n": len(runs),
                "status": "ok" if scored else reasons[-1],
                "reasons": list(dict.fromkeys(reasons)),
                "command": next((r["command"] for r in reversed(runs) if r.get("command")), ""),
                "run": (top or runs[-1]).get("run", ""),
                "rank": None,
                "best": False,
            }
        )
    sign = -1 if higher_is_better else 1
    scored_rows = sorted(
        (s for s in summary if s["metric"] is not None), key=lambda s: sign * s["metric"]
    )
    for rank, row in enumerate(scored_rows, 1):
        row["rank"], row["best"] = rank, rank == 1
    return scored_rows + [s for s in summary if s["metric"] is None]


def metric_text(value: Any) -> str:
    """A metric as shown: floats to 6 significant digits, nothing for None."""
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def sweep_rows(
    summary: Sequence[Mapping[str, Any]], metric: str, names: Sequence[str]
) -> list[tuple[str, ...]]:
    """The one sweep table: a header and one row per point, best first (every face shows it)."""
    rows = [("#", *names, metric, "ok", "status / reason")]
    for row in summary:
        rank = "" if row.get("rank") is None else str(row["rank"])
        values = (str(row["values"].get(n, "")) for n in names)
        rows.append(
            (
                rank,
                *values,
                metric_text(row.get("metric")),
                f"{row['n_ok']}/{row['n']}",
                str(row["status"]),
            )
        )
    return rows


def _group_axis(shown: Sequence[Row], grid_names: Sequence[str]) -> str | None:
    """With two or more axes, the first that varies among the charted points."""
    if len(grid_names) < 2:
        return None
    return next((n for n in grid_names if len({str(s["values"][n]) for s in shown}) > 1), None)


def write_chart(
    path: Path,
    summary: Sequence[Row],
    metric: str,
    grid_names: Sequence[str],
    higher_is_better: bool = True,
) -> str | None:
    """Bar chart of ``metric`` per point as a PNG; None when written, else why not."""
    try:  # an optional extra: a sweep without it still has its tables
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return PLOT_MISSING
    shown = sorted((s for s in summary if s["metric"] is not None), key=lambda s: s["index"])
    if not shown:
        return f"no point has a numeric {metric!r}; no chart"
    group = _group_axis(shown, grid_names)
    keys = list(dict.fromkeys(str(s["values"][group]) for s in shown)) if group else [""]
    fig = Figure(figsize=(min(40.0, max(6.0, 0.45 * len(shown) + 2)), 4.8), layout="constrained")
    FigureCanvasAgg(fig)  # draw with Agg explicitly; pyplot's global state is never touched
    ax = fig.add_subplot()
    xs, labels = [], []
    for i, row in enumerate(shown):
        key = str(row["values"][group]) if group else ""
        x = i + 0.6 * keys.index(key)  # a gap between groups
        colour = f"C{keys.index(key) % 10}" if group else ("C1" if row["best"] else "C0")
        legend = f"{group}={key}" if group and key not in labels else None
        mark = {"linewidth": 2.5, "hatch": "//"} if row["best"] else {"linewidth": 0}
        ax.bar(x, row["metric"], color=colour, label=legend, edgecolor="black", **mark)
        if legend:
            labels.append(key)
        if len(row["metrics"]) > 1:  # each repeat as a dot over its median bar
            ax.plot([x] * len(row["metrics"]), row["metrics"], "k.", markersize=4, zorder=3)
        if row["best"]:
            text = f"best {row['metric']:.4g}"
            top = max(row["metrics"])  # above the highest repeat's dot
            ax.annotate(text, (x, top), (0, 3), textcoords="offset points", ha="center")
        xs.append(x)
    ticks = [" ".join(f"{n}={v}" for n, v in r["values"].items() if n != group) for r in shown]
    ax.set_xticks(xs, ticks, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    repeats = " (median of repeats)" if any(len(r["metrics"]) > 1 for r in shown) else ""
    better = "higher" if higher_is_better else "lower"
    ax.set_title(f"{metric} per point{repeats}, {better} is better")
    if group:
        ax.legend(title=None, fontsize=8)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        return f"could not write {path}: {exc.strerror or exc}"
    return None
