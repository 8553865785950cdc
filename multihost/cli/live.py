"""``multihost top`` (a run's whole fleet, live, full screen; ``--once`` a snapshot) and
``multihost plot`` (every host's step times as a picture). The figures and verdicts are
``multihost.live``'s; here they are drawn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from multihost.bridge import Interrupt, blocking
from multihost.cli.terminal import safe_text
from multihost.cli.wiring import chosen_hosts, record_options
from multihost.defaults import DEFAULTS as D
from multihost.live.snapshot import FleetSnapshot, HostRow, SliceSummary
from multihost.live.watcher import FleetWatch, look_once
from multihost.model import host_ranges
from multihost.runs import past
from multihost.settings.checks import log_dir

STATE_STYLE = {
    "stepping": "green",
    "starting": "cyan",
    "running": "cyan",
    "stuck": "bold red",
    "stopped": "bold red",
    "done": "green",
    "failed": "bold red",
    "missing": "yellow",
    "unreachable": "bold red",
    "connecting": "dim",
}
KEYS = "q: quit (the run goes on)"


def cmd_top(args: argparse.Namespace, err: Console) -> int:
    _, record = past.find_run(log_dir(args.log_dir), args.run)
    record = chosen_hosts(record, args.workers, args.exclude_workers)
    options = record_options(record, args.log_dir, args.ssh_config)
    dirs = {pid: paths.run for pid, paths in past.record_paths(record).items()}
    hosts = record.fleet.hosts
    if args.once or args.json:
        snap = blocking(
            lambda: look_once(
                args.run, hosts, dirs, options.ssh, connect_limit=options.connect_limit
            )
        )
        if args.json:
            print(json.dumps(snap.to_json(), indent=1))
        else:
            Console(highlight=False).print(render(snap, width=Console().width))
        return 1 if any(r.state == "unreachable" for r in snap.rows) else 0
    watch = FleetWatch(
        args.run,
        hosts,
        dirs,
        options.ssh,
        interval=args.interval,
        connect_limit=options.connect_limit,
    )
    stop = asyncio.Event()
    interrupt = Interrupt(
        stop.set,
        "leaving top; the run goes on",
        say=lambda text: None,  # the screen is top's own: it leaves it, says nothing over it
        signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
        exit_at_second=True,
        left="the run goes on",
    )
    out = Console(highlight=False)
    if not out.is_terminal:
        blocking(lambda: _batch(watch, out, stop, args.interval), interrupt)
        return 0
    with _keys() as keys:
        blocking(lambda: _screen(watch, out, stop, keys), interrupt)
    return 0


async def _batch(watch: FleetWatch, out: Console, stop: asyncio.Event, every: float) -> None:
    """Not on a terminal: a snapshot printed every ``every`` s until stopped (``top -b``)."""
    task = asyncio.create_task(watch.run())
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await stop.wait()
            if not stop.is_set():
                out.print(render(watch.snapshot(), width=out.width))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _screen(watch: FleetWatch, out: Console, stop: asyncio.Event, keys: int | None) -> None:
    """Full screen, redrawn at each host's new look (at most 4 times a second), until ``q``
    or a signal."""
    from rich.live import Live

    loop = asyncio.get_running_loop()
    if keys is not None:

        def on_key() -> None:
            try:
                typed = os.read(keys, 64)
            except OSError:
                typed = b"q"
            if not typed or b"q" in typed.lower():
                stop.set()

        loop.add_reader(keys, on_key)
    task = asyncio.create_task(watch.run())
    try:
        with Live(console=out, screen=True, auto_refresh=False, transient=True) as live:
            while not stop.is_set():
                live.update(screen(watch.snapshot(), out), refresh=True)
                watch.changed.clear()
                waiter = asyncio.ensure_future(watch.changed.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, timeout=max(1.0, watch.interval))
                waiter.cancel()
                stopper.cancel()
                await asyncio.sleep(0.25)  # several hosts' looks in one redraw
    finally:
        if keys is not None:
            loop.remove_reader(keys)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """The terminal's keys one at a time (no echo, no line editing; Ctrl-C still a signal),
    its settings put back however top ends; None when stdin is no terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:
        yield None
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def screen(snap: FleetSnapshot, out: Console) -> RenderableType:
    """Top's screen: the view, and the keys."""
    return Group(render(snap, width=out.width, height=out.height), Text(KEYS, style="dim"))


def render(snap: FleetSnapshot, *, width: int = 120, height: int | None = None) -> Group:
    """A snapshot drawn: the header, a row per host (slices apart) or, above ``top_rows``
    hosts, the slices' lines and the outliers; the verdicts below."""
    parts: list[RenderableType] = [_header(snap)]
    if len(snap.rows) > D.top_rows:
        parts.append(_slices(snap.slices()))
        room = max(5, (height or 40) - len(snap.slices()) - 14)
        parts.append(_hosts(snap.outliers(room), width, title="outliers (worst first)"))
    else:
        parts.append(_hosts(snap.rows, width))
    parts += _verdicts(snap)
    return Group(*parts)


def _header(snap: FleetSnapshot) -> Text:
    text = Text(f"multihost top  {snap.run}", style="bold")
    counts: dict[str, int] = {}
    for row in snap.rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    text.append(f"  {len(snap.rows)} hosts: ", style="dim")
    for i, (state, n) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1])):
        text.append(f"{n} {state}", style=STATE_STYLE.get(state, ""))
        if i < len(counts) - 1:
            text.append(" · ", style="dim")
    if snap.median_step_s is not None:
        text.append(f"  step {_s(snap.median_step_s)}", style="bold")
        if snap.median_own_s is not None:
            text.append(f" (own {_s(snap.median_own_s)})", style="dim")
    text.append(time.strftime("  %H:%M:%S", time.localtime(snap.at)), style="dim")
    return text


# A host's columns: (name, its cells' width at most, the cell). The last output takes what is
# left; on a narrow terminal the optional columns go first, in DROPPED's order.
Cell = Callable[[HostRow], "str | Text"]
COLUMNS: tuple[tuple[str, int, Cell], ...] = (
    ("steps", 7, lambda r: "-" if r.steps is None else str(r.steps)),
    ("last", 8, lambda r: _s(r.last_step_s)),
    ("median", 8, lambda r: _s(r.median_step_s)),
    ("own", 8, lambda r: Text(_s(r.own_s), style="bold red" if r.slow else "")),
    ("cpu", 5, lambda r: "-" if r.cpu_pct is None else f"{r.cpu_pct:.0f}%"),
    ("rss", 7, lambda r: _bytes(r.rss_bytes)),
    ("free mem", 8, lambda r: _bytes(r.mem_available)),
    ("accel mem", 13, lambda r: _accel_memory(r)),
    ("busy", 5, lambda r: _busy(r)),
)
DROPPED = ("busy", "accel mem", "last", "free mem", "rss", "cpu")
ROOM = 24  # what the last output keeps at least before a column goes


def _columns(rows: tuple[HostRow, ...], width: int) -> list[tuple[str, int, Cell]]:
    shown = list(COLUMNS)
    if all(r.accelerator is None for r in rows):  # said once, below: no column of dashes
        shown = [c for c in shown if c[0] not in ("accel mem", "busy")]
    used = max((len(r.host.name) for r in rows), default=5) + 14  # host, state
    for name in DROPPED:
        if used + sum(w + 2 for _, w, _ in shown) + ROOM <= width:
            break
        shown = [c for c in shown if c[0] != name]
    return shown


def _hosts(rows: tuple[HostRow, ...], width: int, *, title: str | None = None) -> Table:
    # the last column takes what the others leave (``ratio``), cut with an ellipsis
    t = Table(title=title, title_justify="left", box=None, pad_edge=False, expand=True)
    t.add_column("host", no_wrap=True)
    t.add_column("state", no_wrap=True)
    columns = _columns(rows, width)
    for name, _, _ in columns:
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("last output / why", no_wrap=True, overflow="ellipsis", ratio=1)
    last_slice = None
    for row in rows:
        if title is None and last_slice is not None and row.host.slice_id != last_slice:
            t.add_section()
        last_slice = row.host.slice_id
        t.add_row(
            Text(row.host.name, style="bold red" if row.slow else ""),
            Text(row.state + (" slow" if row.slow else ""), style=_style(row)),
            *(cell(row) for _, _, cell in columns),
            _why(row),
        )
    return t


def _accel_memory(row: HostRow) -> str:
    acc = row.accelerator
    return "-" if acc is None else _fraction(acc.memory_used, acc.memory_total)


def _busy(row: HostRow) -> str:
    acc = row.accelerator
    return "-" if acc is None or acc.busy_pct is None else f"{acc.busy_pct:.0f}%"


def _style(row: HostRow) -> str:
    return "bold red" if row.slow else STATE_STYLE.get(row.state, "")


def _why(row: HostRow) -> Text:
    if row.state in ("stuck", "stopped", "failed", "unreachable", "missing") and row.detail:
        return Text(safe_text(row.detail), style="yellow")
    if row.accelerator is not None and row.accelerator.error and not row.last_line:
        return Text(safe_text(row.accelerator.error), style="dim")
    return Text(safe_text(row.last_line or row.detail))


def _slices(slices: tuple[SliceSummary, ...]) -> Table:
    t = Table(title="slices", title_justify="left", box=None, pad_edge=False)
    t.add_column("slice")
    t.add_column("hosts", justify="right")
    t.add_column("states")
    t.add_column("steps", justify="right")
    t.add_column("median", justify="right")
    t.add_column("own", justify="right")
    t.add_column("slowest (own)")
    for s in slices:
        states = ", ".join(f"{n} {state}" for state, n in s.states)
        steps = (
            "-"
            if s.steps_min is None
            else (
                str(s.steps_min) if s.steps_min == s.steps_max else f"{s.steps_min}-{s.steps_max}"
            )
        )
        slowest = "-" if s.slowest is None else f"{s.slowest.name} ({_s(s.slowest_own_s)})"
        t.add_row(
            f"s{s.slice_id}",
            str(s.hosts),
            states,
            steps,
            _s(s.median_step_s),
            _s(s.median_own_s),
            slowest,
        )
    return t


def _verdicts(snap: FleetSnapshot) -> list[RenderableType]:
    lines: list[RenderableType] = []
    row = snap.straggler_row
    if row is not None:
        others = "" if snap.others_own_s is None else f"; the others {_s(snap.others_own_s)}"
        lines.append(
            Text(
                f"straggler: {row.host.name}: its own time per step {_s(row.own_s)}{others} "
                f"(the others wait for it in every collective)",
                style="bold red",
            )
        )
    for note in snap.notes:
        style = "bold red" if note.startswith("stuck") else "dim"
        lines.append(Text(note, style=style))
    return lines


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.1f}ms" if value >= 0.0001 else "0.0ms"
    return f"{value:.2f}s"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value >> 10}K"


def _fraction(used: int | None, total: int | None) -> str:
    if used is None:
        return "-"
    return f"{_bytes(used)}/{_bytes(total)}" if total else _bytes(used)


def cmd_plot(args: argparse.Namespace, err: Console) -> int:
    from multihost.live.plot import picture

    run_dir, record = past.find_run(log_dir(args.log_dir), args.run)
    record = chosen_hosts(record, args.workers, args.exclude_workers)
    options = record_options(record, args.log_dir, args.ssh_config)
    dirs = {pid: paths.run for pid, paths in past.record_paths(record).items()}
    path = Path(args.out).expanduser() if args.out else run_dir / "steps.png"
    made = blocking(
        lambda: picture(
            args.run, record.fleet, dirs, options.ssh, path, limit=options.connect_limit
        )
    )
    for r in made.hosts:
        if r.error:
            err.print(f"multihost: {r.host.name}: {r.error}", style="yellow", markup=False)
    if made.path is None or made.table is None:
        err.print(f"multihost: {made.problem}", markup=False, highlight=False)
        return 1
    steps = made.table
    print(made.path)
    err.print(
        f"step times of {len(steps.hosts)} host(s) ({host_ranges(steps.hosts)}), "
        f"{steps.last_step} steps: above each step's time (a slow step: a bright column), "
        "below each host's own time per step (a slow host: a bright row)",
        style="dim",
        markup=False,
        highlight=False,
    )
    return 0
