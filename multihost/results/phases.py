"""Where a JAX process's start went: its phases, read from the host's state files, and the
run's one line about them. Pure: the staged hook measures them (diagnose/hookstart.py, which
keeps its own copy of ``PHASES``), ``HostResult.startup`` holds them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PHASES = ("import", "join", "devices", "compile", "first_step")
"""A JAX process's start, in order: ``import jax`` returned, ``jax.distributed.initialize``
returned, the first backend made, the last compile before the first step ended, the first step
ended (each in seconds from the process's start)."""
NAMED = (0.10, 0.5)  # the slowest host is named this far over the median: a share, and seconds


def parse(text: str) -> dict[str, float]:
    """``import=1.21,devices=1.4,...`` (the host's state files) as the phases, in ``PHASES``
    order; an unknown name or a value that is not seconds is left out, ``-`` is none."""
    found: dict[str, float] = {}
    for pair in text.split(","):
        name, _, value = pair.partition("=")
        try:
            at = float(value)
        except ValueError:
            continue
        if 0 <= at < float("inf"):
            found[name] = at
    return {p: found[p] for p in PHASES if p in found}


def phase_times(startup: Mapping[str, float]) -> dict[str, float]:
    """Each phase's own seconds: from the phase reached before it (the process's start, for
    the first)."""
    own, before = {}, 0.0
    for phase in PHASES:
        if phase in startup:
            own[phase] = max(0.0, startup[phase] - before)
            before = startup[phase]
    return own


def seconds(value: float) -> str:
    """``0.04``, ``1.07``, ``12.2``, ``123``: hundredths under 10 s, tenths under 100."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def startup_line(hosts: Sequence[tuple[str, Mapping[str, float]]]) -> str | None:
    """Where the hosts' start went, in one line: each phase's own seconds (the median over the
    hosts that reached it), and the median time to the last phase every host reached; the
    slowest host named where it stands out (``NAMED``), with the phase it lost most in.
    ``hosts``: (name, phases) pairs; None when no host has phases (no JAX)."""
    known = [(name, at) for name, at in hosts if at]
    if not known:
        return None
    own = [phase_times(at) for _, at in known]
    reached = [p for p in PHASES if any(p in o for o in own)]
    medians = {p: _median([o[p] for o in own if p in o]) for p in reached}
    parts = ", ".join(f"{_words(p)} {seconds(s)} s" for p, s in medians.items())
    common = [p for p in PHASES if all(p in at for _, at in known)]
    head = "start-up" + (f" (median of {len(known)} hosts)" if len(known) > 1 else "")
    if not common:
        return f"{head}: {parts}"
    last = common[-1]
    median = _median([at[last] for _, at in known])
    line = f"{head}: {parts}; {_words(last)} at {seconds(median)} s"
    name, slowest = max(known, key=lambda pair: pair[1][last])
    gap = slowest[last] - median
    share, floor = NAMED
    if len(known) > 1 and gap > max(floor, share * median):
        mine = phase_times(slowest)
        worst = max(mine, key=lambda p: mine[p] - medians[p])
        line += (
            f"; slowest: {name} at {seconds(slowest[last])} s (+{seconds(gap)} s; "
            f"{_words(worst)} +{seconds(mine[worst] - medians[worst])} s)"
        )
    return line


def cell(startup: Mapping[str, float]) -> str:
    """A host's phases, each its own seconds: ``import 1.21 join 0.40 … first step 0.31``
    (empty: no JAX, or not yet)."""
    return " ".join(f"{_words(p)} {seconds(s)}" for p, s in phase_times(startup).items())


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _words(phase: str) -> str:
    return phase.replace("_", " ")
