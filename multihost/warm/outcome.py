"""What a piece gave back: each host's outcome, and the piece as a run's result (the one host
row, verdict and faces every run has)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multihost.model import Host, State
from multihost.results.records import HostResult, RunResult, read_result
from multihost.runs.stream import LogSink
from multihost.warm.frames import Frame


@dataclass(frozen=True)
class HostOutcome:
    """One host's end of a piece: its exit code and what it raised, or why there is none."""

    host: Host
    exit_code: int | None = None  # None: no outcome came back (``error`` says why)
    error: str | None = None  # "raised ValueError: boom", or why no outcome came back
    traceback: str = ""
    value: bytes = field(default=b"", repr=False)  # a call's value, cloudpickled
    started_at: float | None = None
    ended_at: float | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)  # rss_bytes, live_arrays, ...
    stopped: bool = False  # no outcome because the set was stopped under it

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        return f"exited with code {self.exit_code}" if self.exit_code else ""


@dataclass(frozen=True)
class PieceResult:
    """A piece on every host: each host's outcome, and as a run's result (its logs, its
    first failure; ``timed_out``, ``interrupted``). ``broken``: why the set was stopped."""

    outcomes: tuple[HostOutcome, ...]
    result: RunResult
    broken: str | None = None


def outcome_of(host: Host, f: Frame) -> HostOutcome:
    """A host's ``done`` frame as its outcome."""
    said = f.json()
    error = said.get("error")
    return HostOutcome(
        host,
        exit_code=said.get("exit"),
        error=f"raised {error}" if error else None,
        traceback=said.get("traceback") or "",
        value=f.tail,
        started_at=said.get("started"),
        ended_at=said.get("ended"),
        stats={k: v for k, v in said.items() if k in ("rss_bytes", "live_arrays", "live_bytes")},
    )


def as_run(
    name: str,
    folder: Path,
    outcomes: tuple[HostOutcome, ...],
    sinks: Mapping[int, LogSink],
    *,
    timed_out: bool,
    interrupted: bool,
    broken: str | None,
) -> RunResult:
    """A piece as a run's result: a host row each (its log, its result line), the first host
    that failed of its own, or why the set was stopped."""
    hosts = []
    for o in outcomes:
        sink = sinks[o.host.process_id]
        if o.ok:
            state = State.DONE
        elif o.stopped:
            state = State.KILLED
        else:
            state = State.FAILED
        hosts.append(
            HostResult(
                host=o.host,
                state=state,
                exit_code=o.exit_code,
                error=o.error,
                started_at=o.started_at,
                ended_at=o.ended_at,
                last_line=sink.last_line,
                log=sink.path,
                reported=read_result(sink.path) if sink.may_have_result else None,
            )
        )
    failures = sorted(
        (o for o in outcomes if not o.ok and not o.stopped),
        key=lambda o: (o.ended_at or float("inf"), o.host.process_id),
    )
    first = f"{failures[0].host.name} {failures[0].reason}" if failures else None
    return RunResult(
        run_name=name,
        hosts=tuple(hosts),
        log_dir=folder,
        first_failure=first or (None if interrupted else broken),
        interrupted=interrupted,
        timed_out=timed_out,
    )
