"""``multihost trace``: a profiler trace of every JAX process of a running run, and its table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from multihost import runs
from multihost.bridge import blocking
from multihost.cli.wiring import log_dir_of, record_options
from multihost.diagnose.capture import Capture, capture
from multihost.diagnose.traces import slowest
from multihost.errors import UsageError

OPEN_HINT = (
    "open with: xprof --logdir {folder} (pip install xprof), tensorboard --logdir {folder} "
    "(pip install tensorboard-plugin-profile), or any *.trace.json.gz at ui.perfetto.dev"
)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def rows(result: Capture) -> list[dict[str, Any]]:
    """One dict per host (the --json rows and what the table shows)."""
    out = []
    for h in result.hosts:
        row = h.row
        stats = row.stats if row is not None else None
        out.append({
            "host": h.host.name,
            "ok": stats is not None,
            "span_s": stats.span_s if stats else None,
            "step_name": stats.step_name if stats else None,
            "steps": stats.steps if stats else 0,
            "median_step_s": stats.median_step_s if stats else None,
            "xla_busy": stats.busy if stats else None,
            "files": list(row.files) if row else [],
            "error": row.error if row else h.error,
            "skipped": [{"pid": p.pid, "command": p.detail}
                        for p in h.processes if p.state == "nojax"],
        })  # fmt: skip
    return out


def table(result: Capture) -> Table:
    """The per-host table of one capture."""
    t = Table(title=f"trace {result.name}: {result.seconds:g} s on {len(result.hosts)} host(s)",
              title_justify="left", box=None, pad_edge=False)  # fmt: skip
    t.add_column("host")
    for name in ("span", "steps", "median step", "XLA busy"):
        t.add_column(name, justify="right")
    t.add_column("")
    for r in rows(result):
        busy = "-" if r["xla_busy"] is None else f"{r['xla_busy']:.0%}"
        note = Text(r["error"], style="red") if r["error"] else Text("")
        if r["skipped"] and not r["error"]:
            note = Text(f"{len(r['skipped'])} process(es) without jax skipped", style="dim")
        t.add_row(r["host"], _seconds(r["span_s"]), str(r["steps"]),
                  _seconds(r["median_step_s"]), busy, note)  # fmt: skip
    return t


def summary_lines(result: Capture) -> list[str]:
    """The slowest host (when it stands out), and how to open the traces."""
    lines = []
    worst = slowest([h.row for h in result.hosts if h.row is not None])
    if worst is not None:
        lines.append(f"slowest: {worst[0]}, median step {worst[1]:.0%} over the hosts' median")
    lines.append(OPEN_HINT.format(folder=result.folder))
    return lines


def report(result: Capture, as_json: bool, err: Console) -> int:
    """Print a capture (table or JSON); 1 when any host has no trace."""
    failed = any(h.row is None or h.row.stats is None for h in result.hosts)
    if as_json:
        worst = slowest([h.row for h in result.hosts if h.row is not None])
        print(json.dumps({"capture": result.name, "folder": str(result.folder),
                          "seconds": result.seconds, "hosts": rows(result),
                          "slowest": {"host": worst[0], "gap": worst[1]} if worst else None},
                         indent=1))  # fmt: skip
        return 1 if failed else 0
    Console(highlight=False).print(table(result))
    for line in summary_lines(result):
        err.print(line, style="dim", markup=False, highlight=False)
    return 1 if failed else 0


def cmd_trace(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = runs.find_run(log_dir_of(args), args.run)
    if record.state != "running":
        raise UsageError(f"run {args.run} is {record.state}: there is nothing to trace")
    options = record_options(args, record)
    dirs = {pid: paths.run for pid, paths in runs.record_paths(record).items()}
    err.print(f"tracing {len(record.hosts)} host(s) for {args.seconds:g} s…", style="dim",
              markup=False, highlight=False)  # fmt: skip
    result = blocking(
        lambda: capture(record.fleet.hosts, dirs, run_dir, seconds=args.seconds, name=args.name,
                        ssh=options.ssh, limit=options.connect_limit)
    )  # fmt: skip
    return report(result, args.json, err)
