"""How a run ended, as values: ``HostResult``, ``RunResult``, ``Staging``, a function's outcome
on a host (``CallResult``), and what the work after a run brought back (``PullResult``,
``TpuLogs``); and the payload's ``MULTIHOST_RESULT {json}`` line. Their faces (the one host
row, the verdict, plain text and HTML) are ``multihost.results.faces``. Pure: no rich."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multihost.model import Host, State, signal_name
from multihost.results.faces import host_html, run_html, run_text

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
        return host_html(self)

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
        return run_text(self)

    def _repr_html_(self) -> str:
        return run_html(self)
