"""The faces of a run's result: the one host row (``COLUMNS``, ``host_row``) and the one
verdict that every face shows, the run's words under its table (where its start went, a
payload's result), and ``str()`` and the notebook's HTML of ``multihost.results.records``'
``HostResult`` and ``RunResult`` (the terminal's table is ``multihost.cli.report``'s). Pure: no
rich.

The faces read a result through ``HostOutcome`` and ``RunOutcome``, what they need of it, so
that the records can give their ``str()`` and HTML here without this module importing them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from multihost.model import Host, State
from multihost.results.phases import startup_line


class HostOutcome(Protocol):
    """What a face reads of one host's outcome (``records.HostResult``)."""

    @property
    def host(self) -> Host: ...
    @property
    def state(self) -> State: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...
    @property
    def bytes_sent(self) -> int: ...
    @property
    def last_line(self) -> str: ...
    @property
    def reported(self) -> Mapping[str, Any] | None: ...
    @property
    def startup(self) -> Mapping[str, float]: ...
    @property
    def ok(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def duration(self) -> float | None: ...


class RunOutcome(Protocol):
    """What a face reads of a run's outcome (``records.RunResult``)."""

    @property
    def run_name(self) -> str: ...
    @property
    def hosts(self) -> Sequence[HostOutcome]: ...
    @property
    def log_dir(self) -> Path | None: ...
    @property
    def first_failure(self) -> str | None: ...
    @property
    def interrupted(self) -> bool: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def ok(self) -> bool: ...
    def result(self) -> dict[str, Any] | None: ...


# The one host row: every face (the terminal's summary, str(), the notebook's HTML) shows these.
COLUMNS = ("host", "address", "state", "exit", "time", "sent", "last output / reason")


def host_row(r: HostOutcome) -> tuple[str, ...]:
    """One host's cells, in ``COLUMNS`` order. The last is the host's own words (its reason,
    or its last line): a face that shows it to a terminal makes it safe first."""
    outcome = (
        f"signal {r.signal}"
        if r.signal is not None
        else ("" if r.exit_code is None else str(r.exit_code))
    )
    step = step_time(r)
    why = r.reason if not r.ok else (f"{step:.3g} s/step" if step is not None else r.last_line)
    if not r.ok and r.last_line and r.state is State.FAILED:
        why = f"{why}: {r.last_line}" if why else r.last_line
    time = "" if r.duration is None else f"{r.duration:.1f}s"
    return (r.host.name, r.host.target, str(r.state), outcome, time, size(r.bytes_sent), why)


def step_time(r: HostOutcome) -> float | None:
    """The mean step time a payload reported (``step_time_s``), or None."""
    value = (r.reported or {}).get("step_time_s")
    return float(value) if isinstance(value, int | float) and value > 0 else None


SPREAD_NAMED = 0.03  # the slowest host is named when its step time is this far over the median


def payload_lines(result: RunOutcome) -> tuple[str, ...]:
    """A payload run in words: the headline of process 0's result, as the seed prints it
    (``0.79 s/step (mean of 5 steps after 1 warm-up), 0.0081 TFLOP/s per device, utilization
    12.3%``), and the step time's spread across hosts (the slowest named when it stands out).
    Empty when no host reported a step time."""
    lines = []
    first = result.result() or {}
    step = first.get("step_time_s")
    if isinstance(step, int | float) and step > 0:
        head = f"{step:.3g} s/step" + (f" ({words})" if (words := mean_of(first)) else "")
        tflops = first.get("tflops_per_device")
        if isinstance(tflops, int | float):
            head += f", {tflops:.3g} TFLOP/s per device"
        util = first.get("utilization")
        if isinstance(util, int | float):
            head += f", utilization {util:.1%}"
        elif first.get("device_kind"):
            head += f" (no peak known for {first['device_kind']}: no utilization)"
        lines.append(head)
    steps = [(r.host.name, t) for r in result.hosts if (t := step_time(r)) is not None]
    if len(steps) > 1:
        ordered = sorted(t for _, t in steps)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        name, slowest = max(steps, key=lambda nt: nt[1])
        gap = (slowest - median) / median
        if gap > SPREAD_NAMED:
            lines.append(
                f"slowest: {name} at {slowest:.3g} s/step, {gap:.1%} over the median "
                f"{median:.3g} s of {len(steps)} hosts"
            )
        else:
            spread = (slowest - ordered[0]) / median
            lines.append(
                f"step time within {spread:.1%} across {len(steps)} hosts (median {median:.3g} s)"
            )
    return tuple(lines)


def run_lines(result: RunOutcome) -> tuple[str, ...]:
    """A run's words under its table: where its start went (``phases.startup_line``), then a
    payload's result (``payload_lines``)."""
    startup = startup_line([(r.host.name, r.startup) for r in result.hosts])
    return (*([startup] if startup else []), *payload_lines(result))


def mean_of(result: dict[str, Any]) -> str | None:
    """What a payload's ``step_time_s`` is the mean of, in the payload's own words (``mean of
    18 steps after 2 warm-up``: its ``timed_steps``, ``warmup_steps``); a result without them
    is the mean of all its ``timings_s``. None when it does not say."""
    timed, warmup = result.get("timed_steps"), result.get("warmup_steps")
    if not isinstance(timed, int) or isinstance(timed, bool) or timed < 1:
        timings = result.get("timings_s")
        if not isinstance(timings, list) or not timings:
            return None
        timed, warmup = len(timings), 0
    after = f" after {warmup} warm-up" if isinstance(warmup, int) and warmup > 0 else ""
    return f"mean of {timed} steps{after}"


def size(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``20.0 MiB``."""
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


@dataclass(frozen=True)
class Verdict:
    """A run's last line: all good, or how many succeeded and what went wrong, in parts."""

    ok: bool
    parts: tuple[str, ...]  # "2/4 hosts succeeded", "; interrupted", "; first failure: ..."

    @property
    def text(self) -> str:
        return "".join(self.parts)


def verdict(result: RunOutcome) -> Verdict:
    """All good, or how many succeeded and who failed first."""
    ok, total = sum(1 for r in result.hosts if r.ok), len(result.hosts)
    if result.ok:
        return Verdict(
            True, ("the host succeeded" if total == 1 else f"all {total} hosts succeeded",)
        )
    parts = [f"{ok}/{total} host{'s' * (total != 1)} succeeded"]
    if result.interrupted:
        parts.append("; interrupted")
    if result.timed_out:
        parts.append("; timed out")
    if result.first_failure:
        parts.append(f"; first failure: {result.first_failure}")
    return Verdict(False, tuple(parts))


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as plain-text lines, columns padded to their widest cell (the last left ragged)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    ]


_COLOR = {State.DONE: "#1a7f37", State.KILLED: "#9a6700", State.RUNNING: "#0969da"}
_GOOD, _BAD = "#1a7f37", "#cf222e"


def _html_table(rows: Sequence[HostOutcome]) -> str:
    from html import escape  # notebooks only: not on a run's path

    head = "".join(f"<th style='text-align:left'>{escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        cells = host_row(r)
        color = _COLOR.get(r.state, _BAD if r.state.final else "")
        tds = [f"<td style='text-align:left'>{escape(c)}</td>" for c in cells]
        tds[2] = f"<td style='text-align:left;color:{color}'><b>{escape(cells[2])}</b></td>"
        body.append(f"<tr>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def host_html(r: HostOutcome) -> str:
    """A host's result in a notebook: its row as a table."""
    return f"<div class='multihost-host'>{_html_table([r])}</div>"


def run_text(result: RunOutcome) -> str:
    """``str()`` of a run's result: its name, the host table, its words and verdict, its logs."""
    rows = [COLUMNS, *(host_row(r) for r in result.hosts)]
    logs = [f"logs: {result.log_dir}"] if result.log_dir else []
    words = [*run_lines(result)]
    return "\n".join(
        [f"run {result.run_name}", *aligned(rows), *words, verdict(result).text, *logs]
    )


def run_html(result: RunOutcome) -> str:
    """A run's result in a notebook: the same as ``run_text``, as HTML."""
    from html import escape  # notebooks only: not on a run's path

    color = _GOOD if result.ok else _BAD
    logs = f"<br><small>logs: {escape(str(result.log_dir))}</small>" if result.log_dir else ""
    words = "".join(f"{escape(line)}<br>" for line in run_lines(result))
    return (
        f"<div class='multihost-run'><b>run {escape(result.run_name)}</b>"
        f"{_html_table(result.hosts)}{words}<span style='color:{color}'>"
        f"{escape(verdict(result).text)}</span>{logs}</div>"
    )
