"""``multihost trace``: a profiler trace of every JAX process of a running run, and its table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from multihost.bridge import blocking
from multihost.cli.wiring import record_options
from multihost.diagnose.capture import capture
from multihost.diagnose.captured import Capture, summary
from multihost.errors import UsageError
from multihost.runs import past
from multihost.settings.checks import log_dir

OPEN_HINT = (
    "open with: xprof --logdir {folder} (pip install xprof), tensorboard --logdir {folder} "
    "(pip install tensorboard-plugin-profile), or any *.trace.json.gz at ui.perfetto.dev"
)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def table(data: dict[str, Any]) -> Table:
    """The per-host table of one capture (its :func:`summary` data)."""
    hosts = data["hosts"]
    t = Table(
        title=f"trace {data['capture']}: {data['seconds']:g} s on {len(hosts)} host(s)",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    t.add_column("host")
    for name in ("span", "steps", "median step", "XLA busy"):
        t.add_column(name, justify="right")
    t.add_column("")
    for r in hosts:
        busy = "-" if r["xla_busy"] is None else f"{r['xla_busy']:.0%}"
        note = Text(r["error"], style="red") if r["error"] else Text("")
        if r["skipped"] and not r["error"]:
            note = Text(f"{len(r['skipped'])} process(es) without jax skipped", style="dim")
        if r.get("cut") and not r["error"]:  # summaries of older captures have no "cut"
            note = Text(f"the job ended {r['traced_s']:.1f} s in", style="yellow")
        t.add_row(
            r["host"],
            _seconds(r["span_s"]),
            str(r["steps"]),
            _seconds(r["median_step_s"]),
            busy,
            note,
        )
    return t


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The slowest host (when it stands out), and how to open the traces."""
    lines = []
    worst = data.get("slowest")
    if worst:
        lines.append(
            f"slowest: {worst['host']}, median step {worst['gap']:.0%} over the hosts' median"
        )
    lines.append(OPEN_HINT.format(folder=data["folder"]))
    return lines


def show(data: dict[str, Any], err: Console) -> None:
    """The table on stdout, the hints on stderr."""
    Console(highlight=False).print(table(data))
    for line in summary_lines(data):
        err.print(line, style="dim", markup=False, highlight=False)


def report(result: Capture, as_json: bool, err: Console) -> int:
    """Print a capture (table or JSON); 1 when any host has no trace."""
    data = summary(result)
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        show(data, err)
    return 1 if any(not h["ok"] for h in data["hosts"]) else 0


def cmd_trace(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = past.find_run(log_dir(args.log_dir), args.run)
    if record.state != "running":
        raise UsageError(f"run {args.run} is {record.state}: there is nothing to trace")
    options = record_options(record, args.log_dir, args.ssh_config)
    dirs = {pid: paths.run for pid, paths in past.record_paths(record).items()}
    err.print(
        f"tracing {len(record.hosts)} host(s) for {args.seconds:g} s…",
        style="dim",
        markup=False,
        highlight=False,
    )
    result = blocking(
        lambda: capture(
            record.fleet.hosts,
            dirs,
            run_dir,
            seconds=args.seconds,
            name=args.name,
            ssh=options.ssh,
            limit=options.connect_limit,
        )
    )
    return report(result, args.json, err)
