"""Every host's step times over a whole run, for ``multihost plot``: each host bins its own
step log (the hook's ``<pid>.steps``; see ``multihost/remote/steps.sh``), so what comes back is
at most ``bins`` lines per host however long the run; here the hosts' bins are put on one grid
of steps (:class:`StepTable`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from multihost import remote
from multihost.defaults import DEFAULTS
from multihost.model import Fleet, Host
from multihost.remote import script
from multihost.transport import Connection, SSHOptions
from multihost.transport.fanout import Outcome, on_every_host

STEPS = remote.load("steps")  # r bins


@dataclass(frozen=True)
class StepBin:
    """Consecutive steps of one host: from ``first`` on, ``count`` of them (its log keeps
    every step up to a bound, then every 2nd, 4th ...)."""

    first: int
    count: int
    mean_s: float
    max_s: float
    mean_own_s: float
    max_own_s: float


@dataclass(frozen=True)
class HostSteps:
    """One host's binned steps, or why there are none."""

    host: Host
    bins: tuple[StepBin, ...] = ()
    last_step: int = 0
    error: str | None = None

    @property
    def median_own_s(self) -> float | None:
        owns = [b.mean_own_s for b in self.bins]
        return statistics.median(owns) if owns else None


def parse_steps(host: Host, text: str) -> HostSteps:
    """``steps.sh``'s answer → the host's bins (a line that is not one is left out)."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if head[:1] == ["missing"]:
        return HostSteps(host, error="the run's directory is gone from this host")
    if head[:1] != ["steps"] or len(head) != 5 or not head[3].isdigit():
        return HostSteps(host, error="no step logged (the program never waited for results?)")
    bins = []
    for line in lines[1:]:
        words = line.split()
        if len(words) != 8 or words[0] != "b" or not words[1].isdigit() or not words[2].isdigit():
            continue
        try:
            values = [float(w) for w in words[3:7]]
        except ValueError:
            continue
        if all(math.isfinite(v) for v in values):
            bins.append(StepBin(int(words[1]), int(words[2]), *values))
    return HostSteps(host, tuple(bins), int(head[3]))


def steps_command(run_dir: str, bins: int) -> str:
    import shlex

    return f"sh -c {shlex.quote(script(STEPS, paths={'r': run_dir}, bins=bins))}"


async def fetch_steps(
    fleet: Fleet,
    run_dirs: Mapping[int, str],
    ssh: SSHOptions,
    *,
    bins: int = DEFAULTS.plot_bins,
    limit: int = DEFAULTS.connect_limit,
) -> list[HostSteps]:
    """Every host's binned steps (a host that cannot be asked: its row says why)."""

    async def one(conn: Connection) -> HostSteps:
        res = await conn.run(steps_command(run_dirs[conn.host.process_id], bins))
        return parse_steps(conn.host, res.stdout.decode(errors="replace"))

    outcomes = await on_every_host(fleet, ssh, one, limit=limit, timeout=DEFAULTS.command_timeout)
    return [_row(o) for o in outcomes]


def _row(o: Outcome[HostSteps]) -> HostSteps:
    if o.value is not None:
        return o.value
    return HostSteps(o.host, error=o.error.message if o.error else "failed")


@dataclass(frozen=True)
class StepTable:
    """Hosts × columns of steps: each cell the mean step time (and own time) of a host's
    steps in that column (None: none logged there)."""

    hosts: tuple[Host, ...]
    width: int  # steps per column
    step_s: tuple[tuple[float | None, ...], ...]  # per host, per column
    own_s: tuple[tuple[float | None, ...], ...]
    last_step: int

    @property
    def columns(self) -> int:
        return len(self.step_s[0]) if self.step_s else 0


def table(rows: Sequence[HostSteps], bins: int = DEFAULTS.plot_bins) -> StepTable | None:
    """The hosts with steps on one grid of at most ``bins`` columns (None: no host has any)."""
    stepped = [r for r in rows if r.bins]
    if not stepped:
        return None
    last = max(r.last_step for r in stepped)
    width = max(1, -(-last // bins))
    columns = -(-last // width)
    steps, owns = [], []
    for row in sorted(stepped, key=lambda r: r.host.process_id):
        total = [0.0] * columns
        own = [0.0] * columns
        count = [0] * columns
        for b in row.bins:
            col = min(columns - 1, (b.first - 1) // width)
            total[col] += b.mean_s * b.count
            own[col] += b.mean_own_s * b.count
            count[col] += b.count
        steps.append(tuple(t / c if c else None for t, c in zip(total, count, strict=True)))
        owns.append(tuple(o / c if c else None for o, c in zip(own, count, strict=True)))
    hosts = tuple(r.host for r in sorted(stepped, key=lambda r: r.host.process_id))
    return StepTable(hosts, width, tuple(steps), tuple(owns), last)
