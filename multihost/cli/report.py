"""Rich renderables as pure functions of state; the Console is always passed in. A run's
table and verdict format the records' own row and verdict (``multihost.results.records``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from multihost.cli.terminal import safe_text
from multihost.model import Host, State, signal_name
from multihost.results import phases
from multihost.results.faces import COLUMNS, host_row, size
from multihost.results.faces import verdict as run_verdict
from multihost.results.records import HostResult, PullResult, RunResult, Staging

if TYPE_CHECKING:
    from multihost.envsync.store import EnvStore
    from multihost.runs.record import RunRecord

STATE_STYLE = {
    State.DONE: "green",
    State.FAILED: "bold red",
    State.KILLED: "yellow",
    State.ERROR: "bold red",
    State.LOST: "bold red",
    State.RECONNECTING: "yellow",
    State.STOPPING: "yellow",
    State.RUNNING: "cyan",
}
ORDER: tuple[State, ...] = tuple(s for s in State if s is not State.PENDING)


def status_line(
    run_name: str,
    states: Mapping[int, State],
    elapsed: float,
    silent: Mapping[Host, float] | None = None,
) -> Text:
    """One line: how many hosts are in each state, how long the run has taken, and which
    running hosts have printed nothing for a while (``silent``: host -> seconds)."""
    counts: dict[State, int] = dict.fromkeys(ORDER, 0)
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    text = Text(f"{run_name}  {elapsed:6.1f}s  ", style="bold")
    parts = [(f"{n} {s}", STATE_STYLE.get(s, "")) for s, n in counts.items() if n]
    for i, (label, style) in enumerate(parts):
        text.append(label, style=style)
        if i < len(parts) - 1:
            text.append(" · ", style="dim")
    text.append(f"  ({len(states)} hosts)", style="dim")
    if silent:
        worst = sorted(silent.items(), key=lambda kv: -kv[1])
        least = min(silent.values())
        shown = ", ".join(f"{h.name} {_clock(s)}" for h, s in worst[:3])
        more = f", +{len(worst) - 3}" if len(worst) > 3 else ""
        text.append(f"  {len(silent)} host(s) silent > {_clock(least)}: {shown}{more}", "yellow")
    return text


def summary_table(result: RunResult, *, all_hosts: bool = True) -> Table:
    """Per host: slice/worker, state, exit code or signal, duration, and why it failed."""
    table = Table(title=f"run {result.run_name}", title_justify="left", expand=False)
    for col in COLUMNS[:-1]:
        table.add_column(col, no_wrap=True)
    table.add_column(COLUMNS[-1], overflow="fold")
    rows: Sequence[HostResult] = result.hosts if all_hosts else result.failed
    for r in rows:
        name, address, state, *cells, why = host_row(r)
        table.add_row(
            name,
            Text(address),
            Text(state, style=STATE_STYLE.get(r.state, "")),
            *cells,
            Text(safe_text(why)),  # a host's own words: never rich markup
        )
    return table


def staging_line(staging: Staging) -> Text:
    """What staging cost the runner's link: bytes sent, uploads, fetches and fallbacks."""
    ratio = staging.runner_bytes / staging.archive_bytes if staging.archive_bytes else 0.0
    text = Text(
        f"code via {staging.via}{f' ({safe_text(staging.why)})' if staging.why else ''}: "
        f"the runner sent {size(staging.runner_bytes)} "
        f"({ratio:.1f}× the {size(staging.archive_bytes)} archive, "
        f"{staging.uploads} upload(s))",
        style="dim",
    )
    if staging.fetched:
        text.append(f"; {staging.fetched} host(s) fetched it", style="dim")
    if staging.present:
        text.append(f"; {staging.present} had it", style="dim")
    if staging.kits:
        text.append(
            f"; multihost's kit to {staging.kits} host(s) ({size(staging.kit_bytes)})",
            style="dim",
        )
    if staging.fallbacks:
        text.append(
            f"; {len(staging.fallbacks)} fell back to direct upload "
            f"(first: {safe_text(staging.fallbacks[0])})",
            style="yellow",
        )
    return text


def verdict(result: RunResult) -> Text:
    """The last line: all good, or who failed first and why."""
    v = run_verdict(result)
    if v.ok:
        return Text(v.text, style="bold green")
    head, *rest = v.parts
    text = Text(head, style="bold red")
    for part in rest:
        text.append(part, style="red" if part.startswith("; first failure") else "bold red")
    return text


CELL_MAX = 40  # a long cell (a command, an error) is cut to this with an ellipsis


def fleet_table(
    rows: Sequence[Mapping[str, Any]],
    flagged: set[str] | None = None,
    width: int | None = None,
    prefer: Sequence[str] = (),
) -> Table:
    """One row per host (or run); ``flagged`` columns (values differ) in red.

    With ``width`` (the console's), columns empty in every row are left out and the others
    chosen to fit — the first, the flagged, then the ``prefer`` ones, then the rest in order
    while they fit — long cells end in an ellipsis, the last column shown takes what is left,
    and the caption names the columns left out. Without ``width`` every cell is shown whole.
    """
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    if width is not None:
        columns = [c for c in columns if any(row.get(c) not in (None, "") for row in rows)]
    cells = [["" if row.get(c) is None else str(row[c]) for c in columns] for row in rows]
    cap = CELL_MAX if width is not None else None
    natural = [
        min(cap or 1 << 30, max([len(_header(c, flagged)), *(len(r[i]) for r in cells)]))
        for i, c in enumerate(columns)
    ]
    shown, room = _fit(columns, natural, [*sorted(flagged or ()), *prefer], width)
    table = Table()
    for i in shown:
        col = columns[i]
        last = i == shown[-1]
        table.add_column(
            _header(col, flagged),
            no_wrap=True,
            overflow="ellipsis",
            max_width=(room if last else natural[i]) if width is not None else None,
            min_width=None if last or width is None else natural[i],
            style="bold red" if flagged and col in flagged else None,
        )
    for r in cells:
        table.add_row(*(Text(safe_text(r[i])) for i in shown))  # values are data, not markup
    hidden = [columns[i] for i in range(len(columns)) if i not in shown]
    if hidden:
        table.caption = f"not shown: {', '.join(hidden)} (wider terminal, or --json)"
    return table


def _header(col: str, flagged: set[str] | None) -> str:
    return col.replace("_", " ") + (" ≠" if flagged and col in flagged else "")


def _fit(
    columns: Sequence[str], natural: Sequence[int], first: Sequence[str], width: int | None
) -> tuple[list[int], int | None]:
    """Indices of the columns that fit in ``width`` (3 cells of border and padding each) — the
    first column, then ``first`` in its order, then the rest — and the room for the last one."""
    if width is None or not columns:
        return list(range(len(columns))), None
    order = [0, *dict.fromkeys(columns.index(c) for c in first if c in columns[1:])]
    order += [i for i in range(1, len(columns)) if i not in order]
    used = 1
    shown: list[int] = []
    for i in order:
        need = min(natural[i], 12) if i == len(columns) - 1 else natural[i]
        if not shown or used + need + 3 <= width:
            shown.append(i)
            used += natural[i] + 3
    shown.sort()
    rest = sum(natural[i] + 3 for i in shown[:-1]) + 1
    return shown, max(1, min(natural[shown[-1]], width - rest - 3))


def _clock(seconds: float) -> str:
    """``4m12s``, ``1h02m``, ``45s``."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}{unit}"
    return f"{seconds:.0f}s"


def status_row(host: Host, status: HostResult | None, error: str | None) -> dict[str, object]:
    """A row of ``multihost status`` from what the host's state files said (or why it could not
    be asked)."""
    if status is None:
        return {
            "host": host.name,
            "address": host.target,
            "state": "unreachable",
            "exit": "",
            "runtime": "",
            "last line": error or "",
        }
    end = status.ended_at if status.ended_at is not None else time.time()
    runtime = "" if status.started_at is None else f"{end - status.started_at:.1f}s"
    exit_text = "" if status.exit_code is None else str(status.exit_code)
    if status.signal is not None:
        exit_text += f" ({signal_name(status.signal)})"
    silent = ""
    if status.state is State.RUNNING and status.log_mtime is not None:
        silent = _age(max(0.0, time.time() - status.log_mtime))  # host clock: NTP-close
    return {
        "host": host.name,
        "address": host.target,
        "state": str(status.state),
        "exit": exit_text,
        "runtime": runtime,
        "silent": silent,
        "startup": phases.cell(status.startup),
        "last line": status.last_line,
    }


def record_row(h: HostResult) -> dict[str, object]:
    """A row of ``multihost status`` from run.json alone: the host's own row."""
    name, address, state, outcome, runtime, _sent, why = host_row(h)
    return {
        "host": name,
        "address": address,
        "state": state,
        "exit": outcome,
        "runtime": runtime,
        "startup": phases.cell(h.startup),
        "last line": why,
    }


def ls_row(name: str, record: RunRecord) -> dict[str, object]:
    """A row of ``multihost ls``."""
    states: dict[str, int] = {}
    for h in record.hosts:
        states[str(h.state)] = states.get(str(h.state), 0) + 1
    age = time.time() - (record.updated or time.time())
    return {
        "run": name,
        "hosts": len(record.hosts),
        "states": ", ".join(f"{n} {s}" for s, n in states.items()),
        "updated": f"{_age(age)} ago",
        "command": record.job.command,
    }


def env_rows(host: Host, store: EnvStore | None, error: str | None) -> list[dict[str, object]]:
    """The rows of ``multihost envs --json``: one per environment a host holds (raw values:
    the whole key, bytes, seconds), one for a host that holds none or could not be asked."""
    head: dict[str, object] = {"host": host.name, "address": host.target}
    if store is None:
        return [{**head, "state": "unreachable", "error": error or ""}]
    if not store.envs:
        return [{**head, "state": "none"}]
    return [
        {
            **head,
            "key": e.key,
            "state": e.state,
            "size": e.size,
            "packed": e.packed,
            "last_used": e.last_used,
            "age": e.age,
            "runs": [u.run for u in e.runs],
            "running": [u.run for u in e.runs if u.running],
        }
        for e in store.envs
    ]


def env_cells(row: Mapping[str, Any]) -> dict[str, object]:
    """An ``env_rows`` row for the table: short key, sizes, age, runs (``*``: running)."""
    if "key" not in row:
        return {
            "host": row["host"],
            "address": row["address"],
            "state": row["state"],
            "error": row.get("error", ""),
        }
    running = set(row["running"])
    runs = ", ".join(f"{r}*" if r in running else r for r in row["runs"])
    return {
        "host": row["host"],
        "address": row["address"],
        "key": str(row["key"])[:12],
        "state": row["state"],
        "size": size(int(row["size"])),
        "packed": size(int(row["packed"])) if row["packed"] else "",
        "last use": "" if row["age"] is None else f"{_age(float(row['age']))} ago",
        "runs": runs or "(none)",
    }


def record_line(done: int, total: int, record: Any, metric: str) -> Text:
    """One completed sweep point, as it happens."""
    from multihost.sweep.results import metric_text  # sweeps only: not on a run's path

    value = record.result.get(metric) if record.ok else None
    text = Text(f"[{done}/{total}] ", style="dim")
    text.append(" ".join(f"{k}={v}" for k, v in record.values.items()))
    text.append(f"  r{record.repeat}  ", style="dim")
    text.append(record.status, style="green" if record.ok else "red")
    if value is not None:
        text.append(f"  {metric}={metric_text(value)}", style="bold")
    return text


def sweep_table(summary: Sequence[Mapping[str, Any]], metric: str, names: Sequence[str]) -> Table:
    """The sweep's points, best first; the best row highlighted."""
    from multihost.sweep.results import sweep_rows

    title = Text(f"sweep by {metric} (median over ok repeats)")
    table = Table(title=title, title_justify="left")
    head, *rows = sweep_rows(summary, metric, names)
    for col in head[:-1]:
        table.add_column(Text(col), justify="right")
    table.add_column(head[-1], overflow="fold")
    for cells, row in zip(rows, summary, strict=True):
        style = "bold green" if row.get("best") else None
        table.add_row(*(Text(c) for c in cells), style=style)
    return table


def pull_lines(results: Sequence[PullResult], dest: Path, *, all_hosts: bool = True) -> list[str]:
    """What ``multihost pull`` says: a line per host (only the failed ones unless
    ``all_hosts``), each problem named, then the totals. Plain text: hosts' words included."""
    lines = []
    for r in results:
        if not all_hosts and r.ok:
            continue
        got = f"{r.files} file(s), {size(r.bytes)}" + (
            f", {r.skipped} already there" if r.skipped else ""
        )
        lines.append(f"{r.host.name}  {got}" if r.ok else f"{r.host.name}  FAILED ({got})")
        lines += [f"  {safe_text(problem)}" for problem in r.errors]
    failed = sum(1 for r in results if not r.ok)
    files, skipped = sum(r.files for r in results), sum(r.skipped for r in results)
    gave = sum(1 for r in results if r.files or r.skipped)  # a host that failed may give some
    lines.append(
        f"pulled {files} file(s), {size(sum(r.bytes for r in results))}"
        + (f" ({skipped} already there)" if skipped else "")
        + f" from {gave} of {len(results)} host(s) into {dest}"
        + (f"; {failed} host(s) had problems (above)" if failed else "")
    )
    return lines
