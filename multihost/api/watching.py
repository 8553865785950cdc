"""A run looked at while it runs (``multihost stack``, ``top``, ``plot`` as data): every host's
Python stacks, every host's steps at this moment, and every host's step times as a picture."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.api.runs import find_record
from multihost.bridge import blocking
from multihost.errors import MultihostError, UsageError
from multihost.runs.past import options_from_record, record_paths

if TYPE_CHECKING:
    from multihost.diagnose.stacks import StackReport
    from multihost.live.snapshot import FleetSnapshot


def top(
    run_name: str,
    *,
    log_dir: str | Path | None = None,
    workers: str | None = None,
    exclude_workers: str | None = None,
) -> FleetSnapshot:
    """Every host of a run at this moment (``multihost top --once`` as data): per host its
    state, steps, step and own time per step, CPU, memory and accelerator; the straggler (the
    host whose own time per step stands out) and the stuck hosts. Each host is looked at
    twice, a second apart; one that cannot be reached is a row saying why."""
    from multihost.live.watcher import look_once

    logs, _, record = find_record(run_name, log_dir)
    opts = options_from_record(record, logs)
    record = _some(record, workers, exclude_workers)
    dirs = {pid: paths.run for pid, paths in record_paths(record).items()}
    return blocking(
        lambda: look_once(
            run_name, record.fleet.hosts, dirs, opts.ssh, connect_limit=opts.connect_limit
        )
    )


def plot(
    run_name: str, *, log_dir: str | Path | None = None, out: str | Path | None = None
) -> Path:
    """Every host's step times over a run as a PNG (``multihost plot``; matplotlib from the
    ``plot`` extra): step time and own time per step, hosts down, steps across. Returns where
    it went (``out``, else ``steps.png`` in the run's log dir); a UsageError when no host
    logged a step or the picture cannot be drawn."""
    from multihost.live.plot import picture

    logs, run_dir, record = find_record(run_name, log_dir)
    opts = options_from_record(record, logs)
    dirs = {pid: paths.run for pid, paths in record_paths(record).items()}
    path = Path(out).expanduser() if out is not None else run_dir / "steps.png"
    made = blocking(
        lambda: picture(run_name, record.fleet, dirs, opts.ssh, path, limit=opts.connect_limit)
    )
    if made.path is None:
        raise MultihostError(made.problem or "no picture")
    return made.path


def _some(record: Any, workers: str | None, exclude: str | None) -> Any:
    """The record with only the hosts ``workers`` names, less ``exclude``'s."""
    from multihost.sources.workers import select

    fleet, subset = select(record.fleet, workers, exclude, whose=f"run {record.run_name}")
    if not subset:
        return record
    pids = {h.process_id for h in fleet}
    return replace(record, hosts=tuple(h for h in record.hosts if h.host.process_id in pids))


def stacks(
    run_name: str,
    *,
    log_dir: str | Path | None = None,
    native: bool = False,
    all_threads: bool = False,
) -> StackReport:
    """Every host's Python stacks right now, grouped (``multihost stack`` as data): the groups
    (hosts, frames; odd ones out first), the stragglers, the hosts that could not answer. The
    raw dumps are saved under the run's log dir."""
    from multihost.diagnose.collect import take

    logs, run_dir, record = find_record(run_name, log_dir)
    if record.state != "running":
        raise UsageError(f"run {run_name} is {record.state}: there are no stacks to take")
    opts = options_from_record(record, logs)
    dirs = {pid: paths.run for pid, paths in record_paths(record).items()}
    report, _ = blocking(
        lambda: take(
            record.fleet.hosts,
            dirs,
            opts.ssh,
            run_dir,
            native=native,
            all_threads=all_threads,
            limit=opts.connect_limit,
        )
    )
    return report
