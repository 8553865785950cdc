"""Results as HTML (Jupyter's ``_repr_html_``) and as plain text: pure functions, no rich."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from multihost.model import HostResult, RunResult, State

if TYPE_CHECKING:
    from multihost.sweep.api import SweepResult

COLUMNS = ("host", "address", "state", "exit", "time", "last output / reason")
_COLOR = {State.DONE: "#1a7f37", State.KILLED: "#9a6700", State.RUNNING: "#0969da"}
_BAD = "#cf222e"


def host_row(r: HostResult) -> tuple[str, ...]:
    """One host's cells, in ``COLUMNS`` order (the same facts as the CLI's summary table)."""
    outcome = f"signal {r.signal}" if r.signal is not None else (
        "" if r.exit_code is None else str(r.exit_code))  # fmt: skip
    why = r.reason if not r.ok else r.last_line
    if not r.ok and r.last_line and r.state is State.FAILED:
        why = f"{why}: {r.last_line}" if why else r.last_line
    time = "" if r.duration is None else f"{r.duration:.1f}s"
    return (r.host.name, r.host.target, str(r.state), outcome, time, why)


def verdict(result: RunResult) -> str:
    """All good, or how many succeeded and who failed first."""
    ok, total = sum(1 for r in result.hosts if r.ok), len(result.hosts)
    if result.ok:
        return f"all {total} hosts succeeded"
    text = f"{ok}/{total} hosts succeeded"
    if result.interrupted:
        text += "; interrupted"
    if result.timed_out:
        text += "; timed out"
    if result.first_failure:
        text += f"; first failure: {result.first_failure}"
    return text


def _table(rows: Sequence[HostResult]) -> str:
    head = "".join(f"<th style='text-align:left'>{escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        cells = host_row(r)
        color = _COLOR.get(r.state, _BAD if r.state.final else "")
        tds = [f"<td style='text-align:left'>{escape(c)}</td>" for c in cells]
        tds[2] = f"<td style='text-align:left;color:{color}'><b>{escape(cells[2])}</b></td>"
        body.append(f"<tr>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def run_html(result: RunResult) -> str:
    """The run's title, every host's row, the verdict and where the logs are."""
    color = "#1a7f37" if result.ok else _BAD
    logs = f"<br><small>logs: {escape(str(result.log_dir))}</small>" if result.log_dir else ""
    return (
        f"<div class='multihost-run'><b>run {escape(result.run_name)}</b>{_table(result.hosts)}"
        f"<span style='color:{color}'>{escape(verdict(result))}</span>{logs}</div>"
    )


def host_html(r: HostResult) -> str:
    """One host as a one-row table."""
    return f"<div class='multihost-host'>{_table([r])}</div>"


def run_text(result: RunResult) -> str:
    """The same table as aligned plain text."""
    rows = [COLUMNS, *(host_row(r) for r in result.hosts)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
    logs = [f"logs: {result.log_dir}"] if result.log_dir else []
    return "\n".join([f"run {result.run_name}", *lines, verdict(result), *logs])


def _metric(value: Any) -> str:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def sweep_rows(result: SweepResult) -> list[tuple[str, ...]]:
    """Header and one row per point, best first (the CLI's sweep table)."""
    rows = [("#", *result.grid_names, result.metric, "ok", "status / reason")]
    for row in result.summary:
        rank = "" if row.get("rank") is None else str(row["rank"])
        values = (str(row["values"].get(n, "")) for n in result.grid_names)
        rows.append((rank, *values, _metric(row.get("metric")), f"{row['n_ok']}/{row['n']}",
                     str(row["status"])))  # fmt: skip
    return rows


def sweep_html(result: SweepResult) -> str:
    """The ranked points as a table, the best row in bold."""
    head, *rows = sweep_rows(result)
    th = "".join(f"<th style='text-align:left'>{escape(c)}</th>" for c in head)
    body = []
    for row, data in zip(rows, result.summary, strict=True):
        weight = "font-weight:bold;" if data.get("best") else ""
        tds = "".join(f"<td style='text-align:left;{weight}'>{escape(c)}</td>" for c in row)
        body.append(f"<tr>{tds}</tr>")
    return (
        f"<div class='multihost-sweep'><b>sweep {escape(result.name)}</b> by "
        f"{escape(result.metric)}<table><thead><tr>{th}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table><small>results: {escape(str(result.dir))}"
        "</small></div>"
    )


def sweep_text(result: SweepResult) -> str:
    """The same as aligned plain text."""
    rows = sweep_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    ]
    return "\n".join([f"sweep {result.name} by {result.metric}", *lines, f"results: {result.dir}"])
