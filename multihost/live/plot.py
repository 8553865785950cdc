"""``multihost plot``: every host's step times over a run as one picture (matplotlib, the
``plot`` extra; drawn with Agg, pyplot's global state never touched).

Two heatmaps, hosts down and steps across, on one scale of steps: above, each host's step
time (a slow *step* is a bright column: in an SPMD job every host's step ends together);
below, each host's own time per step, its Python and dispatch before it waits for results (a
slow *host* is a bright row: the one the others wait for). The host with the largest median
own time is named in the title when it stands out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multihost.defaults import DEFAULTS
from multihost.live.steplog import HostSteps, StepTable, fetch_steps, table
from multihost.model import Fleet
from multihost.transport import SSHOptions

PLOT_MISSING = "matplotlib not installed: pip install 'multihost[plot]' for the picture"
LABELLED = 64  # at most this many host names down the side (else every k-th)


def slowest(table: StepTable) -> tuple[int, float, float] | None:
    """(row, its median own time, the others' median) of the host whose own time per step
    stands out (by top's rule: over the others' by a share of the median step time)."""
    owns = [_median(row) for row in table.own_s]
    steps = [s for row in table.step_s for s in row if s is not None]
    known = [(i, o) for i, o in enumerate(owns) if o is not None]
    if len(known) < 2 or not steps:
        return None
    i, worst = max(known, key=lambda item: item[1])
    others = statistics.median(o for j, o in known if j != i)
    limit = max(DEFAULTS.top_slow_share * statistics.median(steps), DEFAULTS.top_slow_min)
    return (i, worst, others) if worst - others > limit else None


def _seconds(value: float) -> str:
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"


def _median(row: tuple[float | None, ...]) -> float | None:
    got = [v for v in row if v is not None]
    return statistics.median(got) if got else None


def write_png(path: Path, table: StepTable, run: str) -> str | None:
    """The picture as a PNG at ``path``; None when written, else why not."""
    try:  # an optional extra
        import numpy as np
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return PLOT_MISSING
    n = len(table.hosts)
    height = min(30.0, 3.0 + 0.16 * n) * 2
    fig = Figure(figsize=(12.0, height), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    extent = (0.5, table.columns * table.width + 0.5, n - 0.5, -0.5)
    names = [h.name for h in table.hosts]
    every = max(1, -(-n // LABELLED))
    for ax, values, label in (
        (top, table.step_s, "step time (s)"),
        (bottom, table.own_s, "own time per step (s): Python and dispatch, not waiting"),
    ):
        data = np.array([[np.nan if v is None else v for v in row] for row in values], float)
        image = ax.imshow(
            np.ma.masked_invalid(data), aspect="auto", interpolation="nearest", extent=extent
        )
        fig.colorbar(image, ax=ax, label=label, shrink=0.9)
        ax.set_yticks(range(0, n, every), names[::every], fontsize=7 if n > 16 else 9)
        ax.set_ylabel("host")
    bottom.set_xlabel(
        "step" + (f" (each column {table.width} steps, mean)" if table.width > 1 else "")
    )
    title = f"{run}: step times of {n} host(s), {table.last_step} steps"
    worst = slowest(table)
    if worst is not None:
        i, own, others = worst
        title += f"; slowest: {names[i]} (own {_seconds(own)} per step, others {_seconds(others)})"
        bottom.annotate(
            names[i],
            (extent[1], i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            color="red",
            fontsize=8,
            annotation_clip=False,
        )
    top.set_title(title)
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        return f"could not write {path}: {exc.strerror or exc}"
    return None


@dataclass(frozen=True)
class Picture:
    """What ``multihost plot`` made: the PNG (None, and ``problem`` says why, when none), the
    table drawn and each host's answer (``error`` on a host that had no steps to give)."""

    path: Path | None
    table: StepTable | None
    hosts: tuple[HostSteps, ...]
    problem: str | None = None


async def picture(
    run: str,
    fleet: Fleet,
    run_dirs: Mapping[int, str],
    ssh: SSHOptions,
    path: Path,
    *,
    limit: int = DEFAULTS.connect_limit,
) -> Picture:
    """Every host's binned steps fetched, put on one grid and drawn to ``path``."""
    rows = tuple(await fetch_steps(fleet, run_dirs, ssh, limit=limit))
    steps = table(rows)
    if steps is None:
        why = (
            f"no host of run {run} logged a step: nothing to draw (steps are counted where a "
            "JAX program waits for its results; see multihost top)"
        )
        return Picture(None, None, rows, why)
    problem = write_png(path, steps, run)
    return Picture(None if problem else path, steps, rows, problem)
