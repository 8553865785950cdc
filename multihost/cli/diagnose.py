"""Commands that diagnose a running job: stack."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rich.console import Console

from multihost import runs
from multihost.bridge import blocking
from multihost.cli.wiring import log_dir_of, record_options
from multihost.diagnose.collect import take
from multihost.diagnose.render import stack_report
from multihost.errors import UsageError
from multihost.gather import host_ranges


def cmd_stack(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = runs.find_run(log_dir_of(args), args.run)
    if record.state != "running":
        raise UsageError(f"run {args.run} is {record.state}: there are no stacks to take")
    options = record_options(args, record)
    dirs = {pid: paths.run for pid, paths in runs.record_paths(record).items()}
    report, folder = blocking(
        lambda: take(record.fleet.hosts, dirs, options.ssh, run_dir, native=args.native,
                     all_threads=args.all, limit=options.connect_limit)
    )  # fmt: skip
    if args.json:
        print(json.dumps({
            "groups": [{"hosts": host_ranges(g.hosts), "size": g.size, "label": g.label,
                        "frames": [asdict(f) for f in g.frames]} for g in report.groups],
            "stragglers": host_ranges(report.stragglers),
            "errors": {e.host.name: e.error for e in report.errors},
            "saved": str(folder),
        }, indent=1))  # fmt: skip
    else:
        title = f"stacks of {args.run}: {len(record.hosts)} host(s), {len(report.groups)} group(s)"
        Console(highlight=False).print(stack_report(report, title=title))
        err.print(f"raw dumps: {folder}", style="dim", markup=False, highlight=False)
    return 1 if report.errors else 0
