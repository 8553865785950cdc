"""``multihost up``, ``down``, ``pods``, ``gc``, ``autodown`` and ``run/sweep --prefix NAME``
with a pod's flags (``--up``, ``--down``, ``--autodown``, ...): the arguments read and what
the library says printed; a pod's life itself is ``multihost.pods.ops``."""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable
from types import FrameType

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from multihost.pods import ops, prices
from multihost.pods.plan import PodFlags


def _say(err: Console) -> Callable[[str], None]:
    return lambda text: err.print(f"multihost: {escape(text)}", highlight=False)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _signals() -> None:
    """SIGTERM and SIGHUP end ``up`` (and a run around a pod) like Ctrl-C: nothing left."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


def cmd_up(args: argparse.Namespace, err: Console) -> int:
    flags = PodFlags.of(vars(args))
    _signals()
    ops.up(args.name, flags, vars(args), _say(err))
    return 0


def cmd_down(args: argparse.Namespace, err: Console) -> int:
    _signals()
    done = ops.delete(
        args.name, _say(err), wait=not args.no_wait, zone=args.zone, project=args.project
    )
    _say(err)(done.line)
    return 0


def _zones(args: argparse.Namespace) -> tuple[str, ...]:
    """``--zones A,B``: where ``pods`` and ``gc`` also look for labelled requests."""
    return tuple(z.strip() for z in (args.zones or "").split(",") if z.strip())


def cmd_pods(args: argparse.Namespace, err: Console) -> int:
    rows = ops.listing(vars(args), _say(err), zones=_zones(args), project=args.project)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        where = f" in {args.zones}" if args.zones else " (--zones A,B also looks in those zones)"
        _say(err)(f"no pods: none recorded here and none labelled{where}")
        return 0
    table = Table(
        "pod", "zone", "type", "capacity", "state", "age", "$/h", "cost so far", "autodown"
    )
    for row in rows:
        state = str(row["state"]) + (f" ({row['reason']})" if row["reason"] else "")
        state += "" if row["recorded"] else " (no record here)"
        table.add_row(
            str(row["name"]),
            str(row["zone"]),
            f"{row['num_slices']} x {row['tpu_type']}",
            str(row["capacity"]),
            escape(state),
            f"{row['age_s']} s",
            prices.money(row["price_per_hour"]),  # type: ignore[arg-type]
            prices.money(row["cost_so_far"]),  # type: ignore[arg-type]
            escape(str(row["autodown"] or "off")),
        )
    Console(highlight=False, width=200).print(table)
    return 0


def cmd_gc(args: argparse.Namespace, err: Console) -> int:
    ops.collect(_say(err), dry_run=args.dry_run, zones=_zones(args), project=args.project)
    return 0


def cmd_autodown(args: argparse.Namespace, err: Console) -> int:
    ops.set_autodown(args.name, args.duration, vars(args), _say(err))
    return 0


def with_pod(args: argparse.Namespace, err: Console, inner: Callable[[], int]) -> int:
    """``run``/``sweep --prefix NAME`` with a pod's flags (``multihost.pods.ops.around``)."""
    flags = PodFlags.of(vars(args))
    _signals()
    return ops.around(
        args.prefix,
        flags,
        inner,
        vars(args),
        _say(err),
        make_it=args.up,
        delete_after=args.down,
    )
