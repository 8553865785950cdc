"""What a trace capture found: each process's answer (:class:`ProcessTrace`), each host's
(:class:`HostCapture`), the whole capture (:class:`Capture`); the host script's lines read, and
the capture told in words, as rows (the table, ``--json``) and as ``summary.json``.

Taking the capture is ``multihost.diagnose.capture``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multihost.diagnose.traces import HostTrace, slowest
from multihost.model import Host


@dataclass(frozen=True)
class ProcessTrace:
    """One process's answer: ``done``, ``error``, ``gone``, ``late`` or ``nojax``."""

    pid: int
    state: str
    detail: str = ""  # done: "BEGAN END full|exit STEPS MEDIAN" (host clock), else the reason

    def traced(self) -> tuple[float, bool] | None:
        """A done process's traced seconds, and whether its program exited during them."""
        parts = self.detail.split()
        if self.state != "done" or len(parts) < 2:
            return None
        try:
            return max(0.0, float(parts[1]) - float(parts[0])), parts[2:3] == ["exit"]
        except ValueError:
            return None

    def counted(self) -> tuple[int, float] | None:
        """The steps that ended during the capture and their median duration, as the hook
        timed them (a step that began before the capture included); None when not said."""
        parts = self.detail.split()
        if self.state != "done" or len(parts) < 5 or not parts[3].isdigit():
            return None
        try:
            return int(parts[3]), float(parts[4])
        except ValueError:
            return None


@dataclass(frozen=True)
class HostCapture:
    """One host's capture: its processes' answers, then its trace row once pulled."""

    host: Host
    processes: tuple[ProcessTrace, ...] = ()
    error: str | None = None  # the host as a whole (unreachable, no hook, run finished)
    row: HostTrace | None = None


@dataclass(frozen=True)
class Capture:
    """A whole capture: its name, where it came back to and every host's answer."""

    name: str
    folder: Path
    seconds: float
    hosts: tuple[HostCapture, ...]


def parse_answer(text: str) -> tuple[tuple[ProcessTrace, ...], str | None]:
    """The script's lines: the processes' answers and a host-wide error (or None)."""
    processes: list[ProcessTrace] = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "nohook":
            return (), "the run has no hook (started by an older multihost, or without Python)"
        if word == "finished":
            return (), "the run has finished on this host: nothing to trace"
        if word == "none" and not processes:
            return (), "no process of the run has imported jax"
        if word in ("done", "error", "gone", "late", "nojax"):
            pid, _, detail = rest.partition(" ")
            if pid.isdigit():
                processes.append(ProcessTrace(int(pid), word, detail.strip()))
    if not any(p.state != "nojax" for p in processes):
        if processes:
            return tuple(processes), "no process of the run has imported jax"
        return (), "the trace script ended early"
    return tuple(processes), None


def host_error(capture: HostCapture) -> str | None:
    """Why this host has no trace, in words; None when at least one process traced."""
    if capture.error is not None:
        return capture.error
    if any(p.state == "done" for p in capture.processes):
        return None
    reasons = [
        f"pid {p.pid} {GONE if p.state == 'gone' else p.state}{': ' + p.detail if p.detail else ''}"
        for p in capture.processes
        if p.state != "nojax"
    ]
    return "; ".join(reasons) or "no process traced"


GONE = "ended before its trace was written (killed, or its job ended as the capture began)"


def in_words(result: Capture) -> tuple[str, str]:
    """The capture in one line and its level: how many hosts traced, and when the job ended
    during it, how far the capture got and what to change."""
    hosts = result.hosts
    traced = sum(1 for h in hosts if h.row is not None and h.row.stats is not None)
    line = f"trace {result.name}: {traced}/{len(hosts)} host(s) traced, in {result.folder}"
    level = "info" if traced == len(hosts) else "warning"
    cut = [w[0] for h in hosts for p in h.processes if (w := p.traced()) is not None and w[1]]
    if cut:
        got = min(cut)
        line += (
            f"; the job ended {got:.1f} s into the {result.seconds:g} s capture (kept what "
            f"ran until then): for a whole window, trace less (--trace {max(got, 0.1):.1f})"
            " or run more steps"
        )
        level = "warning"
    elif traced < len(hosts) and any("finished" in (h.error or "") for h in hosts):
        line += (
            "; the job ended before the capture began: run more steps, or start sooner "
            "(a smaller --trace-after)"
        )
    return line, level


def with_counted(row: HostTrace, processes: Sequence[ProcessTrace]) -> HostTrace:
    """The row with the steps the hook counted (the process with the most stands for the
    host): every step that ended in the capture, where the trace itself shows only those that
    also began in it (none at all when a step is longer than half the capture)."""
    counts = [c for p in processes if (c := p.counted()) is not None]
    if row.stats is None or not counts:
        return row
    steps, median = max(counts)
    stats = replace(row.stats, steps=steps, median_step_s=median if steps else None)
    return replace(row, stats=stats)


def save_rows(result: Capture) -> Path:
    """The capture's rows as ``summary.json`` in its folder (``run --trace`` shows them after
    the run); returns the file."""
    data = summary(result)
    path = result.folder / "summary.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    return path


def rows(result: Capture) -> list[dict[str, object]]:
    """One dict per host: what the table shows and ``--json`` prints."""
    out: list[dict[str, object]] = []
    for h in result.hosts:
        row = h.row
        stats = row.stats if row is not None else None
        windows = [w for p in h.processes if (w := p.traced()) is not None]
        out.append(
            {
                "host": h.host.name,
                "ok": stats is not None,
                "traced_s": max((s for s, _ in windows), default=None),
                "cut": any(cut for _, cut in windows),  # the job ended during the capture
                "span_s": stats.span_s if stats else None,
                "step_name": stats.step_name if stats else None,
                "steps": stats.steps if stats else 0,
                "median_step_s": stats.median_step_s if stats else None,
                "xla_busy": stats.busy if stats else None,
                "files": list(row.files) if row else [],
                "error": row.error if row else h.error,
                "skipped": [
                    {"pid": p.pid, "command": p.detail} for p in h.processes if p.state == "nojax"
                ],
            }
        )
    return out


def summary(result: Capture) -> dict[str, Any]:
    """The capture as data (``--json``, ``summary.json``)."""
    worst = slowest([h.row for h in result.hosts if h.row is not None])
    return {
        "capture": result.name,
        "folder": str(result.folder),
        "seconds": result.seconds,
        "hosts": rows(result),
        "slowest": {"host": worst[0], "gap": worst[1]} if worst else None,
    }
