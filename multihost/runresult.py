"""How a run ended, as values: ``HostResult``, ``RunResult``, ``Staging``, a function's outcome
on a host (``CallResult``), and what the work after a run brought back (``PullResult``,
``TpuLogs``); their one host row and one verdict, which every face formats (plain text and
HTML here, the terminal's table in ``multihost.cli.report``); and the payload's
``MULTIHOST_RESULT {json}`` line. Pure: no rich."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multihost.model import Host, State, signal_name
from multihost.phases import startup_line

RESULT_MARKER = "MULTIHOST_RESULT"
_PREFIX = RESULT_MARKER + " "


def find_result(text: str) -> dict[str, Any] | None:
    """The last ``MULTIHOST_RESULT {json}`` line's object; malformed lines are skipped."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line.startswith(_PREFIX):
            continue
        try:
            found = json.loads(line[len(_PREFIX) :])
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def read_result(path: Path) -> dict[str, Any] | None:
    """``find_result`` over a log file; a missing file has no result."""
    try:
        return find_result(path.read_text(errors="replace"))
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class HostResult:
    """One host's outcome in a run: how its part ended, or how it stands while it runs. Every
    host yields one; none raises. The one shape of it, wherever it comes from; each source
    fills what it knows and leaves the rest at its default:

    - the run that watched the host (``RunResult.hosts``): ``log``, and ``reported`` at the end;
    - the run's record (``RunRecord.hosts`` in ``run.json``, rewritten while the run goes on):
      ``env``, and ``log`` once read back (under the run's directory);
    - the host's state files, asked later (``multihost.status``, ``multihost status``):
      ``log_bytes`` and ``log_mtime``. A host that could not be asked is its recorded
      outcome with ``error`` saying why.

    ``startup`` comes with the host's end (a watched run, the record) or its state files.

    During a run it is read from the host's mutable ``core.livehost.LiveHost``. ``reason``
    says why it did not succeed: its ``cause`` first when there is one (a JAX job that its
    coordination service aborted: the host at fault named), then how it ended, which
    ``exit_code`` and ``signal`` keep as they were.
    """

    host: Host
    state: State
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    # why, when the host's end says more than its exit: a JAX job's coordination service
    # aborting it, naming the host at fault (multihost.diagnose.jaxfaults); the exit stays above
    cause: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    bytes_sent: int = 0
    last_line: str = ""
    log: Path | None = field(default=None, compare=False)  # the local copy of its output
    # its last MULTIHOST_RESULT object, read from ``log`` when the run's results are collected
    reported: Mapping[str, Any] | None = field(default=None, compare=False)
    # the record's: the environment it was launched with, less the --env values the record
    # keeps only the names of (RunRecord.env_names); None before it was planned
    env: Mapping[str, str] | None = field(default=None, compare=False)
    # asked of the host: its log's size there, and when it last grew (the host's clock)
    log_bytes: int | None = field(default=None, compare=False)
    log_mtime: float | None = field(default=None, compare=False)
    # where its JAX process's start went: seconds from the process's start to each phase of
    # phases.PHASES it reached, in that order (the staged hook's; empty: no JAX, or not yet)
    startup: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return self.state is State.DONE

    def result(self) -> dict[str, Any] | None:
        """The last ``MULTIHOST_RESULT {json}`` object this host printed, or None."""
        return None if self.reported is None else dict(self.reported)

    def __repr__(self) -> str:
        outcome = f" {self.reason}" if self.reason else ""
        return f"<HostResult {self.host.name} {self.state}{outcome}>"

    def _repr_html_(self) -> str:
        return f"<div class='multihost-host'>{_html_table([self])}</div>"

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    @property
    def reason(self) -> str:
        """One line saying why this host did not succeed (empty when it did): its ``cause``
        first when there is one, then how it ended."""
        ended = self.error or self._ended()
        if self.cause:
            return f"{self.cause}; {ended}" if ended else self.cause
        return ended

    def _ended(self) -> str:
        if self.signal is not None:
            killed = f"killed by signal {self.signal} ({signal_name(self.signal)})"
            if self.exit_code == 128 + self.signal:  # what a shell reports for such a child
                return f"exited with code {self.exit_code}: {killed}"
            return killed
        if self.exit_code:
            return f"exited with code {self.exit_code}"
        return ""


@dataclass(frozen=True)
class CallResult:
    """One host's outcome of a function sent by value (``multihost.call``, a session's
    ``call``): its return value, or what it raised and where."""

    host: Host
    value: Any = None
    error: str | None = None  # "ValueError: boom", or why no value came back
    traceback: str = ""  # the remote traceback, as text

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Staging:
    """How the code reached the hosts (``--stage-via``) and what it cost the runner's link."""

    via: str  # "direct", "peer" or the gs:// URL
    archive_bytes: int
    runner_bytes: int  # what left the runner: stdin through the transport, plus a bucket upload
    uploads: int  # whole-archive uploads by the runner: to hosts (seeds, fallbacks) or a bucket
    fetched: int = 0  # hosts that got it from a seed or the bucket
    present: int = 0  # hosts that had it already
    fallbacks: tuple[str, ...] = ()  # "host: why its fetch failed" (then sent directly)
    why: str = ""  # why --stage-via auto chose ``via`` ("" when it was asked for)
    kits: int = 0  # hosts sent multihost's kit (its hook and scripts: commands.Kit)
    kit_bytes: int = 0  # ... in all (not in runner_bytes)


@dataclass(frozen=True)
class PullResult:
    """What one host gave back: files copied and skipped (already there), bytes, and every
    problem in words (no match, unreadable, unreachable); ``ok`` when there was none."""

    host: Host
    local_dir: Path
    files: int = 0
    skipped: int = 0
    bytes: int = 0
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class TpuLogs:
    """What one failing host gave back: the folder, its files, those cut, or why none."""

    host: Host
    folder: Path
    files: int = 0
    cut: int = 0
    problem: str | None = None


@dataclass(frozen=True)
class RunResult:
    """Every host's result plus what the run as a whole saw."""

    run_name: str
    hosts: tuple[HostResult, ...]
    log_dir: Path | None = None
    first_failure: str | None = None
    interrupted: bool = False
    timed_out: bool = False
    staging: Staging | None = None  # None when this run staged nothing (a sweep's later runs)
    # the work after the run (multihost.core.postrun):
    traces: tuple[Mapping[str, Any], ...] = ()  # each trace's summary (traces/*/summary.json)
    tpu_logs: tuple[TpuLogs, ...] = ()  # a failed run: its failing TPU hosts' runtime logs
    pulled: tuple[PullResult, ...] = ()  # pull=: what each host gave back, in host order
    stepped: int = 0  # hosts whose processes logged steps (``multihost plot`` draws them)

    @property
    def failed(self) -> tuple[HostResult, ...]:
        return tuple(r for r in self.hosts if not r.ok)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted and not self.timed_out

    @property
    def exit_code(self) -> int:
        """0 all succeeded, 1 any failed, 130 interrupted."""
        if self.interrupted:
            return 130
        return 0 if self.ok else 1

    def result(self) -> dict[str, Any] | None:
        """Process 0's last ``MULTIHOST_RESULT {json}`` object, or None when it printed none."""
        first = min(self.hosts, key=lambda r: r.host.process_id, default=None)
        return None if first is None else first.result()

    def __repr__(self) -> str:
        hosts = ", ".join(f"{r.host.name} {r.state}" for r in self.hosts)
        return f"<RunResult {self.run_name}: exit {self.exit_code}; {hosts}>"

    def __str__(self) -> str:
        rows = [COLUMNS, *(host_row(r) for r in self.hosts)]
        logs = [f"logs: {self.log_dir}"] if self.log_dir else []
        words = [*run_lines(self)]
        return "\n".join(
            [f"run {self.run_name}", *aligned(rows), *words, verdict(self).text, *logs]
        )

    def _repr_html_(self) -> str:
        from html import escape  # notebooks only: not on a run's path

        color = _GOOD if self.ok else _BAD
        logs = f"<br><small>logs: {escape(str(self.log_dir))}</small>" if self.log_dir else ""
        words = "".join(f"{escape(line)}<br>" for line in run_lines(self))
        return (
            f"<div class='multihost-run'><b>run {escape(self.run_name)}</b>"
            f"{_html_table(self.hosts)}{words}<span style='color:{color}'>"
            f"{escape(verdict(self).text)}</span>{logs}</div>"
        )


# The one host row: every face (the terminal's summary, str(), the notebook's HTML) shows these.
COLUMNS = ("host", "address", "state", "exit", "time", "sent", "last output / reason")


def host_row(r: HostResult) -> tuple[str, ...]:
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


def step_time(r: HostResult) -> float | None:
    """The mean step time a payload reported (``step_time_s``), or None."""
    value = (r.reported or {}).get("step_time_s")
    return float(value) if isinstance(value, int | float) and value > 0 else None


SPREAD_NAMED = 0.03  # the slowest host is named when its step time is this far over the median


def payload_lines(result: RunResult) -> tuple[str, ...]:
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


def run_lines(result: RunResult) -> tuple[str, ...]:
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


def verdict(result: RunResult) -> Verdict:
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


def _html_table(rows: Sequence[HostResult]) -> str:
    from html import escape

    head = "".join(f"<th style='text-align:left'>{escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        cells = host_row(r)
        color = _COLOR.get(r.state, _BAD if r.state.final else "")
        tds = [f"<td style='text-align:left'>{escape(c)}</td>" for c in cells]
        tds[2] = f"<td style='text-align:left;color:{color}'><b>{escape(cells[2])}</b></td>"
        body.append(f"<tr>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
