"""Reading a capture's traces: per host, the span, the steps seen and how busy XLA was.

A ``jax.profiler`` capture writes ``<host>.trace.json.gz`` (Chrome trace events) beside its
xplane; that file is read here with the standard library, so the runner needs no jax. Steps
are the events that carry a ``step_num`` argument (``jax.profiler.StepTraceAnnotation``, as the
payloads annotate theirs); XLA work is the union of the op events on device planes
(``/device:*``) or, on CPU, on XLA's own threads (``tf_XLA*``), over the trace's span.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

TRACE_GLOB = "**/*.trace.json.gz"
MAX_TRACE_BYTES = 512 * 2**20  # a compressed trace larger than this is not read back in memory
SLOW_GAP = 0.05  # the slowest host is named when its median step is this much over the median


@dataclass(frozen=True)
class TraceStats:
    """What one trace file says: its span, the steps it saw and XLA's busy share."""

    span_s: float
    step_name: str | None
    steps: int
    median_step_s: float | None
    busy: float | None  # XLA op time / span, None when the trace shows no XLA work


@dataclass(frozen=True)
class HostTrace:
    """One host's row of a capture: the stats, or why there are none."""

    host: str
    stats: TraceStats | None
    files: tuple[str, ...] = ()
    error: str | None = None


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _is_xla(process: str, thread: str) -> bool:
    return process.startswith("/device:") or thread.startswith("tf_XLA")


def stats_of_events(events: Sequence[dict[str, object]]) -> TraceStats:
    """The stats of one trace's events (Chrome trace format, microseconds)."""
    processes: dict[object, str] = {}
    threads: dict[tuple[object, object], str] = {}
    spans: list[tuple[float, float]] = []
    steps: dict[str, list[float]] = {}
    busy: list[tuple[float, float]] = []
    for e in events:
        ph, args = e.get("ph"), e.get("args")
        if ph == "M" and isinstance(args, dict):
            if e.get("name") == "process_name":
                processes[e.get("pid")] = str(args.get("name", ""))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(args.get("name", ""))
            continue
        if ph != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, int | float) or not isinstance(dur, int | float):
            continue
        spans.append((ts, ts + dur))
        name = str(e.get("name", ""))
        if isinstance(args, dict) and "step_num" in args:
            steps.setdefault(name, []).append(dur / 1e6)
        elif dur > 0 and not name.startswith(("ThreadpoolListener", "end: ")):
            pid = e.get("pid")
            if _is_xla(processes.get(pid, ""), threads.get((pid, e.get("tid")), "")):
                busy.append((ts, ts + dur))
    span = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e6 if spans else 0.0
    step_name = max(steps, key=lambda k: len(steps[k])) if steps else None
    durations = steps.get(step_name, []) if step_name else []
    return TraceStats(
        span_s=span,
        step_name=step_name,
        steps=len(durations),
        median_step_s=statistics.median(durations) if durations else None,
        busy=(_union(busy) / 1e6 / span) if busy and span > 0 else None,
    )


def read_stats(path: Path) -> TraceStats:
    """The stats of one ``*.trace.json.gz``; ValueError when it cannot be read as a trace."""
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise ValueError(f"{path.name} is over {MAX_TRACE_BYTES >> 20} MiB compressed")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path.name} is not a readable trace: {e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{path.name} has no traceEvents")
    return stats_of_events([e for e in events if isinstance(e, dict)])


def host_trace(host: str, folder: Path, error: str | None = None) -> HostTrace:
    """A host's row from the folder its capture came back into (several processes: the one
    with the most steps stands for the host)."""
    files = sorted(folder.glob(TRACE_GLOB)) if folder.is_dir() else []
    names = tuple(str(p.relative_to(folder)) for p in files)
    if error is not None:
        return HostTrace(host, None, names, error)
    if not files:
        return HostTrace(host, None, names, "no trace came back")
    best: TraceStats | None = None
    for path in files:
        try:
            stats = read_stats(path)
        except (OSError, ValueError) as e:
            return HostTrace(host, None, names, str(e))
        if best is None or stats.steps > best.steps:
            best = stats
    return HostTrace(host, best, names)


def slowest(rows: Sequence[HostTrace]) -> tuple[str, float] | None:
    """The host whose median step is furthest over the median of the hosts' medians, with that
    gap as a fraction, when it is more than SLOW_GAP; else None."""
    medians = [
        (r.host, r.stats.median_step_s)
        for r in rows
        if r.stats is not None and r.stats.median_step_s is not None
    ]
    if len(medians) < 2:
        return None
    middle = statistics.median(m for _, m in medians)
    host, worst = max(medians, key=lambda hm: hm[1])
    gap = (worst - middle) / middle if middle > 0 else 0.0
    return (host, gap) if gap > SLOW_GAP else None
