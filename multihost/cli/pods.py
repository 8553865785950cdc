"""``multihost up``, ``down``, ``pods``, ``gc`` and ``autodown``: the arguments read, the
library's functions called (``multihost.api.pods``, as ``multihost.up`` and the others are)
and what they say and return printed."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from multihost.api import pods as api
from multihost.api.keywords import configured
from multihost.pods import prices


def say_on(err: Console) -> Callable[[str], None]:
    """Where the library's ``say`` goes on the command line: ``multihost: TEXT`` on stderr."""
    return lambda text: err.print(f"multihost: {escape(text)}", highlight=False)


def cmd_up(args: argparse.Namespace, err: Console) -> int:
    config = configured(args.config.values if args.config else None)
    api.make(args.name, vars(args), config, say_on(err))
    return 0


def cmd_down(args: argparse.Namespace, err: Console) -> int:
    api.down(
        args.name, wait=not args.no_wait, zone=args.zone, project=args.project, say=say_on(err)
    )
    return 0


def cmd_pods(args: argparse.Namespace, err: Console) -> int:
    found = api.listed(vars(args), say_on(err))
    if args.json:
        print(json.dumps([p.row() for p in found], indent=1))
        return 0
    if not found:
        where = f" in {','.join(args.zones)}" if args.zones else ""
        where = where or " (--zones A,B also looks in those zones)"
        say_on(err)(f"no pods: none recorded here and none labelled{where}")
        return 0
    table = Table(
        "pod", "zone", "type", "capacity", "state", "age", "$/h", "cost so far", "autodown"
    )
    for p in found:
        state = p.state + (f" ({p.reason})" if p.reason else "")
        state += "" if p.recorded else " (no record here)"
        table.add_row(
            p.name,
            p.zone,
            f"{p.num_slices} x {p.tpu_type}",
            p.capacity,
            escape(state),
            f"{p.age_s} s",
            prices.money(p.price_per_hour),
            prices.money(p.cost_so_far),
            escape(str(p.row()["autodown"] or "off")),
        )
    Console(highlight=False, width=200).print(table)
    return 0


def cmd_gc(args: argparse.Namespace, err: Console) -> int:
    api.gc(dry_run=args.dry_run, zones=args.zones, project=args.project, say=say_on(err))
    return 0


def cmd_autodown(args: argparse.Namespace, err: Console) -> int:
    api.arm(args.name, args.duration, vars(args), say_on(err))
    return 0
