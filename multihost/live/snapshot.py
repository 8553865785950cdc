"""A run's whole fleet at one moment: a row per host and the verdicts (no I/O here).

From each host's last two looks (:class:`multihost.live.figures.HostSample`): its state, its
steps and their times, its CPU, memory and accelerator; then across the fleet:

- **the straggler**: in an SPMD job every host's step ends together, as each collective waits
  for the slowest process; the slow host is the one that waits least, so its *own* time per
  step (its Python and dispatch, see ``multihost/diagnose/hooksteps.py``) stands out. A host
  is *slow* when its median own time is over the others' median by more than
  ``top_slow_share`` of the fleet's median step time (and ``top_slow_min``); the straggler is
  the slowest of those.
- **stuck**: a host whose last step ended more than ``top_stuck_steps`` of its median step
  times ago (and at least ``top_stuck_min`` s). When one process stops, every host stops
  stepping (the others wait for it in their next collective): each stuck row says whether its
  process is waiting for results (held up by another) or not (the one holding them up).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from multihost.defaults import DEFAULTS
from multihost.live.figures import Accelerator, HostSample
from multihost.model import Host, host_ranges

FRESH_S = 3.0  # a hook's watch file older than this (it writes every second) is stale


@dataclass(frozen=True)
class HostRow:
    """One host at the snapshot's moment: what ``top`` shows on its row."""

    host: Host
    state: str  # stepping, starting (jax, no step yet), running (no jax seen), stuck, stopped,
    # done, failed, missing (no run there), connecting (no answer yet), unreachable
    steps: int | None = None
    last_step_s: float | None = None
    median_step_s: float | None = None
    own_s: float | None = None  # median own time per step
    since_step_s: float | None = None  # since its last step ended
    waiting_s: float = 0.0  # in the wait for results going on now
    cpu_pct: float | None = None  # its Python processes' CPU, % of one core
    rss_bytes: int | None = None
    mem_available: int | None = None  # the host's
    mem_total: int | None = None
    accelerator: Accelerator | None = None
    last_line: str = ""
    slow: bool = False
    stuck: bool = False
    detail: str = ""  # the why of its state, in words
    site: str = ""  # where its program waits once a step

    def to_json(self) -> dict[str, Any]:
        acc = self.accelerator
        return {
            "host": self.host.name,
            "slice": self.host.slice_id,
            "worker": self.host.worker_id,
            "process": self.host.process_id,
            "state": self.state,
            "steps": self.steps,
            "last_step_s": self.last_step_s,
            "median_step_s": self.median_step_s,
            "own_s": self.own_s,
            "since_step_s": self.since_step_s,
            "waiting_s": self.waiting_s,
            "cpu_pct": self.cpu_pct,
            "rss_bytes": self.rss_bytes,
            "mem_available_bytes": self.mem_available,
            "mem_total_bytes": self.mem_total,
            "accelerator": None
            if acc is None
            else {
                "kind": acc.kind,
                "devices": acc.devices,
                "memory_used_bytes": acc.memory_used,
                "memory_total_bytes": acc.memory_total,
                "busy_pct": acc.busy_pct,
                "error": acc.error or None,
            },
            "last_line": self.last_line,
            "slow": self.slow,
            "stuck": self.stuck,
            "detail": self.detail,
            "site": self.site,
        }


@dataclass(frozen=True)
class SliceSummary:
    """A slice in one line (``top`` above ``top_rows`` hosts)."""

    slice_id: int
    hosts: int
    states: tuple[tuple[str, int], ...]  # (state, hosts in it), most first
    steps_min: int | None
    steps_max: int | None
    median_step_s: float | None
    median_own_s: float | None
    slowest: Host | None  # the host with the largest own time
    slowest_own_s: float | None


@dataclass(frozen=True)
class FleetSnapshot:
    """Every host of a run at one moment, and the verdicts. ``multihost top --once --json``
    prints :meth:`FleetSnapshot.to_json`."""

    run: str
    at: float  # the runner's wall clock
    rows: tuple[HostRow, ...]
    straggler: Host | None = None
    stuck: tuple[Host, ...] = ()
    median_step_s: float | None = None
    median_own_s: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def straggler_row(self) -> HostRow | None:
        return next((r for r in self.rows if r.host == self.straggler), None)

    @property
    def others_own_s(self) -> float | None:
        """The median own time per step of every stepping host but the straggler."""
        return _median(
            r.own_s for r in self.rows if r.host != self.straggler and (r.steps or 0) >= 2
        )

    def slices(self) -> tuple[SliceSummary, ...]:
        by_slice: dict[int, list[HostRow]] = {}
        for row in self.rows:
            by_slice.setdefault(row.host.slice_id, []).append(row)
        return tuple(_slice(sid, rows) for sid, rows in sorted(by_slice.items()))

    def outliers(self, limit: int = DEFAULTS.top_rows) -> tuple[HostRow, ...]:
        """The rows that need a look, worst first: stuck, failed or gone, slow, then the
        largest own times, at most ``limit``."""

        def rank(row: HostRow) -> tuple[int, float]:
            if row.stuck or row.state in ("stopped", "failed", "unreachable", "missing"):
                return 0, -(row.since_step_s or 0.0)
            if row.slow:
                return 1, -(row.own_s or 0.0)
            return 2, -(row.own_s or 0.0)

        return tuple(sorted(self.rows, key=rank)[:limit])

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "at": self.at,
            "hosts": [r.to_json() for r in self.rows],
            "straggler": self.straggler.name if self.straggler else None,
            "stuck": [h.name for h in self.stuck],
            "median_step_s": self.median_step_s,
            "median_own_s": self.median_own_s,
            "notes": list(self.notes),
        }


def _slice(sid: int, rows: list[HostRow]) -> SliceSummary:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    steps = [r.steps for r in rows if r.steps is not None]
    owned = [r for r in rows if r.own_s is not None]
    slowest = max(owned, key=lambda r: r.own_s or 0.0, default=None)
    return SliceSummary(
        sid,
        len(rows),
        tuple(sorted(counts.items(), key=lambda kv: -kv[1])),
        min(steps, default=None),
        max(steps, default=None),
        _median(r.median_step_s for r in rows),
        _median(r.own_s for r in rows),
        slowest.host if slowest else None,
        slowest.own_s if slowest else None,
    )


def _median(values: Any) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def host_row(sample: HostSample, before: HostSample | None) -> HostRow:
    """A host's row from its last look (and the one before, for its CPU %)."""
    base = HostRow(
        sample.host,
        "running",
        mem_available=sample.mem_available,
        mem_total=sample.mem_total,
        accelerator=sample.accelerator,
        last_line=sample.last_line,
    )
    if sample.run_state == "missing":
        return replace(base, state="missing", detail="no such run on this host")
    if sample.run_state.startswith("exit"):
        code = sample.run_state.partition(" ")[2]
        return replace(base, state="done" if code == "0" else "failed", detail=f"exit {code}")
    procs = sample.processes
    base = replace(
        base,
        cpu_pct=_cpu_pct(sample, before),
        rss_bytes=sum(p.rss_bytes for p in procs) if procs else None,
    )
    main = sample.stepping
    if main is None or main.watch is None:
        stopped = [p for p in procs if p.state == "T"]
        if stopped:
            return replace(base, state="stopped", detail=_stopped(stopped))
        if not procs:
            return replace(base, detail="no Python process of the run's own (yet)")
        return replace(base, detail="its Python has not imported jax (yet)")
    w = main.watch
    halted = main.state == "T"
    base = replace(base, waiting_s=w.waiting, site=w.site, steps=w.steps)
    if w.steps == 0:
        waiting = f"waiting for results {w.waiting:.0f} s" if w.waiting >= 1 else "no step yet"
        if halted:
            return replace(base, state="stopped", detail=_stopped([main]))
        return replace(base, state="starting", detail=waiting)
    since = None
    if w.last is not None:
        # while the hook writes (every second) a step may have ended since it wrote: what is
        # sure is how long none had ended when it wrote; a hook silent for longer (a stopped
        # process) says nothing since, so from its last step to now
        fresh = sample.uptime - w.at < FRESH_S
        since = max(0.0, (w.at if fresh else sample.uptime) - w.last)
    return replace(
        base,
        state="stopped" if halted else "stepping",
        last_step_s=w.recent[-1] if w.recent else None,
        median_step_s=statistics.median(w.recent) if w.recent else None,
        own_s=statistics.median(w.own) if w.own else None,
        since_step_s=since,
        detail=_stopped([main]) if halted else _silent(sample.uptime - w.at),
    )


def _silent(age: float) -> str:
    if age < FRESH_S:
        return ""
    return f"its hook has not written for {age:.0f} s (the process holds the GIL, or is stopped)"


def _stopped(procs: Sequence[Any]) -> str:
    pids = ", ".join(str(p.pid) for p in procs)
    return f"stopped (SIGSTOP or SIGTSTP): process {pids}"


def _cpu_pct(sample: HostSample, before: HostSample | None) -> float | None:
    if before is None or sample.uptime <= before.uptime:
        return None
    earlier = {p.pid: p.cpu_ticks for p in before.processes}
    ticks = sum(p.cpu_ticks - earlier[p.pid] for p in sample.processes if p.pid in earlier)
    return max(0.0, 100.0 * ticks / sample.hz / (sample.uptime - before.uptime))


def verdicts(run: str, rows: Sequence[HostRow], at: float) -> FleetSnapshot:
    """The fleet's snapshot from its rows: who is slow (and the straggler), who is stuck."""
    d = DEFAULTS
    median_step = _median(r.median_step_s for r in rows if r.steps)
    owned = [r for r in rows if r.own_s is not None and (r.steps or 0) >= 2]
    slow: set[int] = set()
    straggler = None
    if len(owned) >= 2 and median_step is not None:
        limit = max(d.top_slow_share * median_step, d.top_slow_min)
        everyone = statistics.median(r.own_s or 0.0 for r in owned)
        for r in owned:
            others = (
                everyone
                if len(owned) > 2
                else statistics.median(o.own_s or 0.0 for o in owned if o is not r)
            )
            if (r.own_s or 0.0) - others > limit:
                slow.add(r.host.process_id)
        worst = max((r for r in owned if r.host.process_id in slow), key=_own, default=None)
        straggler = worst.host if worst else None
    out: list[HostRow] = []
    for r in rows:
        stuck = _is_stuck(r)
        if stuck:
            r = replace(r, state="stuck" if r.state != "stopped" else r.state)
            r = replace(r, stuck=True, detail=_stuck_detail(r))
        if r.host.process_id in slow:
            r = replace(r, slow=True)
        out.append(r)
    stuck_hosts = tuple(r.host for r in out if r.stuck)
    notes = []
    reached = [r for r in out if r.state != "unreachable"]
    if reached and all(r.accelerator is None for r in reached):
        notes.append("no accelerator figures on CPU hosts")
    if stuck_hosts:
        notes.append(
            f"stuck: {host_ranges(stuck_hosts)}; `multihost stack {run}` shows where each waits"
        )
    return FleetSnapshot(
        run,
        at,
        tuple(out),
        straggler,
        stuck_hosts,
        median_step,
        _median(r.own_s for r in owned),
        tuple(notes),
    )


def _own(row: HostRow) -> float:
    return row.own_s or 0.0


def _is_stuck(row: HostRow) -> bool:
    if row.since_step_s is None or row.median_step_s is None:
        return False
    if row.state not in ("stepping", "stopped"):
        return False
    limit = max(DEFAULTS.top_stuck_steps * row.median_step_s, DEFAULTS.top_stuck_min)
    return row.since_step_s > limit


def _stuck_detail(row: HostRow) -> str:
    since = f"no step for {row.since_step_s or 0.0:.0f} s"
    if row.state == "stopped":
        return f"{since}; {row.detail}"
    if row.waiting_s >= 1:
        return f"{since}; waiting for results {row.waiting_s:.0f} s (held up by another host?)"
    return f"{since}; not waiting for results: in its own code"


def unreachable(host: Host, why: str) -> HostRow:
    """The row of a host that could not be asked."""
    return HostRow(host, "unreachable", detail=why)
