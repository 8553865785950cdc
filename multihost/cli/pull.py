"""``multihost pull``: files back from every host of a run (also ``run --pull``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.live import Live

from multihost.bridge import blocking
from multihost.cli import report
from multihost.cli.progress import TransferView
from multihost.cli.wiring import chosen_hosts, record_options
from multihost.events import Event, Transfer
from multihost.results.records import PullResult
from multihost.runs import past
from multihost.runs.pull import check_dest, check_patterns, default_dest, pull_run
from multihost.runs.record import RunRecord
from multihost.settings.checks import log_dir
from multihost.transport import SSHOptions


def cmd_pull(args: argparse.Namespace, err: Console) -> int:
    patterns = check_patterns(args.paths)
    _, record = past.find_run(log_dir(args.log_dir), args.run)
    record = chosen_hosts(record, args.workers, args.exclude_workers)
    options = record_options(record, args.log_dir, args.ssh_config)
    dest = check_dest(args.to if args.to is not None else default_dest(args.run))
    return pull_and_report(record, patterns, dest, options.ssh, args.limit, err, json_out=args.json)


def pull_and_report(
    record: RunRecord,
    patterns: Sequence[str],
    dest: Path,
    ssh: SSHOptions,
    limit: int,
    err: Console,
    *,
    json_out: bool = False,
) -> int:
    """Pull with progress on a terminal (not with ``json_out``), then say what arrived;
    returns 1 if any host failed."""
    view = TransferView("pulling", len(record.fleet), per_host=True)

    def on_event(event: Event) -> None:
        if isinstance(event, Transfer):
            view.update(event)

    async def go() -> list[PullResult]:
        return await pull_run(record, patterns, dest, ssh, limit=limit, on_event=on_event)

    if err.is_terminal and not json_out:
        with Live(
            get_renderable=view.renderable,
            console=err,
            refresh_per_second=4,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        ):
            results = blocking(go)
    else:
        results = blocking(go)
    if json_out:
        print(json.dumps([_row(r) for r in results], indent=1))
    else:
        for line in report.pull_lines(results, dest, all_hosts=len(results) <= 32):
            print(line)
    return 0 if all(r.ok for r in results) else 1


def _row(r: PullResult) -> dict[str, object]:
    return {
        "host": r.host.name,
        "dir": str(r.local_dir),
        "files": r.files,
        "skipped": r.skipped,
        "bytes": r.bytes,
        "errors": list(r.errors),
        "ok": r.ok,
    }
