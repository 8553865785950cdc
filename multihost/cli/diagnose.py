"""Commands that diagnose a running job: stack."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rich.console import Console, Group, RenderableType
from rich.text import Text

from multihost.bridge import blocking
from multihost.cli.wiring import chosen_hosts, record_options
from multihost.diagnose.collect import take
from multihost.diagnose.stacks import StackReport
from multihost.errors import UsageError
from multihost.model import host_ranges
from multihost.runs import past
from multihost.settings.checks import log_dir


def cmd_stack(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = past.find_run(log_dir(args.log_dir), args.run)
    if record.state != "running":
        raise UsageError(f"run {args.run} is {record.state}: there are no stacks to take")
    record = chosen_hosts(record, args.workers, args.exclude_workers)
    options = record_options(record, args.log_dir, args.ssh_config)
    dirs = {pid: paths.run for pid, paths in past.record_paths(record).items()}
    report, folder = blocking(
        lambda: take(
            record.fleet.hosts,
            dirs,
            options.ssh,
            run_dir,
            native=args.native,
            all_threads=args.all,
            limit=options.connect_limit,
        )
    )
    if args.json:
        print(
            json.dumps(
                {
                    "groups": [
                        {
                            "hosts": host_ranges(g.hosts),
                            "size": g.size,
                            "label": g.label,
                            "frames": [asdict(f) for f in g.frames],
                        }
                        for g in report.groups
                    ],
                    "stragglers": host_ranges(report.stragglers),
                    "errors": {e.host.name: e.error for e in report.errors},
                    "saved": str(folder),
                },
                indent=1,
            )
        )
    else:
        title = f"stacks of {args.run}: {len(record.hosts)} host(s), {len(report.groups)} group(s)"
        Console(highlight=False).print(stack_report(report, title=title))
        err.print(f"raw dumps: {folder}", style="dim", markup=False, highlight=False)
    return 1 if report.errors else 0


def stack_report(report: StackReport, *, title: str = "", max_frames: int = 40) -> Group:
    """Odd ones out first, each group headed ``[hosts] ×N``, frames most recent first."""
    parts: list[RenderableType] = []
    if title:
        parts.append(Text(title, style="bold"))
    stragglers = report.stragglers
    if stragglers:
        parts.append(Text(f"straggler(s): {host_ranges(stragglers)}", style="bold red"))
    for group in report.groups:
        odd = bool(stragglers) and group is not report.groups[-1]
        head = Text(
            f"[{host_ranges(group.hosts)}] ×{group.size}", style="bold red" if odd else "bold"
        )
        if group.label:
            head.append(f"  {group.label}", style="dim")
        parts.append(head)
        frames = group.frames[:max_frames]
        for frame in frames:
            parts.append(Text(f"  {frame}"))
        if len(group.frames) > max_frames:
            parts.append(Text(f"  … {len(group.frames) - max_frames} more frames", style="dim"))
        if not group.frames:
            parts.append(Text("  (no Python frames)", style="dim"))
    for item in report.errors:
        parts.append(Text(f"{item.host.name}: {item.error}", style="yellow"))
    return Group(*parts)
