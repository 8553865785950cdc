"""Commands on a run after the fact: attach, status, ls, logs, kill, clean."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from multihost.bridge import Detached, blocking
from multihost.cli import report, terminal
from multihost.cli.wiring import (
    Display,
    chosen_hosts,
    execute_run,
    finish,
    kill_line,
    raise_nofile_limit,
    record_options,
)
from multihost.core import Attach, Stop
from multihost.defaults import DEFAULTS as D
from multihost.errors import UsageError
from multihost.model import Host, State, host_ranges
from multihost.results.phases import startup_line
from multihost.results.records import HostResult
from multihost.runs import past
from multihost.runs.gather import gather, read_tail, render
from multihost.runs.stream import MAX_LINE
from multihost.settings.checks import log_dir


def cmd_attach(args: argparse.Namespace, err: Console) -> int:
    """Follow a run again. A run outlives its runner: Ctrl-C (SIGTERM, SIGHUP) detaches and
    leaves it running, unless ``--stop-on-interrupt``."""
    _, record = past.find_run(log_dir(args.log_dir), args.run)
    options = record_options(
        record, args.log_dir, args.ssh_config, reconnect_timeout=args.reconnect_timeout
    )
    raise_nofile_limit()
    fleet = record.fleet
    display = Display(fleet, args.run, args.stream, err, gather=args.gather)
    attach = Attach(record, options, display)
    if args.stop_on_interrupt:
        return finish(execute_run(attach, display), err, len(fleet))
    what = f"detached; the run goes on (stop it with: {kill_line(args.run, log_dir(args.log_dir))})"
    try:
        result = execute_run(attach, display, what=what, detach=True)
    except Detached:
        return 130
    return finish(result, err, len(fleet))


def cmd_kill(args: argparse.Namespace, err: Console) -> int:
    """Stop a run on every host; one its record shows ended everywhere is left alone and said
    so (a host that was lost may still run its job: then every host is asked)."""
    _, record = past.find_run(log_dir(args.log_dir), args.run)
    if all(h.state in _ENDED for h in record.hosts):
        err.print(
            f"multihost: run {args.run} had already ended ({record.state}): nothing to stop",
            markup=False,
            highlight=False,
        )
        return 0
    options = record_options(
        record, args.log_dir, args.ssh_config, grace=args.grace, reconnect_timeout=0.0
    )
    fleet = chosen_hosts(record, args.workers, args.exclude_workers).fleet
    display = Display(fleet, args.run, "none", err)
    only = {h.process_id for h in fleet}
    result = execute_run(Stop(record, options, display, signal=args.signal, only=only), display)
    err.print(report.summary_table(result))
    return 1 if any(r.state is State.LOST for r in result.hosts) else 0


# a host in these has no job left to stop
_ENDED = frozenset(
    {State.DONE, State.FAILED, State.KILLED, State.ERROR, State.VANISHED, State.MISSING}
)


def cmd_status(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = past.find_run(log_dir(args.log_dir), args.run)
    rows: list[dict[str, object]] = []
    asked = args.refresh or record.state == "running"
    known: list[HostResult] = []
    if asked:
        options = record_options(record, args.log_dir, args.ssh_config)
        some = chosen_hosts(record, args.workers, args.exclude_workers)
        statuses = blocking(lambda: past.host_statuses(some, options.ssh))
        past.mark_states(run_dir, record, statuses)  # the whole record, the asked hosts' news
        for o in statuses:
            rows.append(report.status_row(o.host, o.value, o.error.message if o.error else None))
            known += [o.value] if o.value is not None else []
    else:
        for h in chosen_hosts(record, args.workers, args.exclude_workers).hosts:
            rows.append(report.record_row(h))
            known.append(h)
    if args.json:
        for row, found in zip(rows, _by_name(known, rows), strict=True):
            row["startup"] = dict(found.startup) if found else {}  # seconds from its start
        print(json.dumps(rows, indent=1, default=str))
    else:
        out = Console(highlight=False)
        out.print(report.fleet_table(rows, width=out.width))
        if line := startup_line([(h.host.name, h.startup) for h in known]):
            out.print(line, markup=False, highlight=False)
        if not asked:
            err.print("(from run.json: the run is finished; --refresh asks the hosts)", style="dim")
    return 0


def _by_name(known: list[HostResult], rows: list[dict[str, object]]) -> list[HostResult | None]:
    """The host result of each row (None for a host that could not be asked)."""
    by = {h.host.name: h for h in known}
    return [by.get(str(row["host"])) for row in rows]


def cmd_ls(args: argparse.Namespace, err: Console) -> int:
    found, unreadable = past.scan_runs(log_dir(args.log_dir))
    rows = [report.ls_row(name, record) for name, record in found]
    if args.json:
        rows += [{"run": name, "state": "unreadable", "error": why} for name, why in unreadable]
        print(json.dumps(rows, indent=1, default=str))
    elif rows:
        out = Console(highlight=False)
        out.print(report.fleet_table(rows, width=out.width))
    elif not unreadable:
        err.print(f"no runs in {log_dir(args.log_dir)}", markup=False)
    if not args.json:
        for name, why in unreadable:
            err.print(f"{name}: unreadable run record ({why})", markup=False, highlight=False)
    return 1 if unreadable else 0


def cmd_logs(args: argparse.Namespace, err: Console) -> int:
    some = args.workers or args.exclude_workers
    if args.follow and (args.host or args.tail or args.grep or args.gather):
        raise UsageError(
            "--follow shows every host's new lines; it takes no --host, --tail, "
            "--grep or --gather (print those without --follow)"
        )
    if args.gather and (args.host or args.all):
        raise UsageError("--gather compares every host's log: it takes no --host or --all")
    if args.json and not args.gather:
        raise UsageError("--json goes with --gather")
    run_dir, record = past.find_run(log_dir(args.log_dir), args.run)
    if args.host and some:
        raise UsageError("--host prints one host's log: it takes no --workers (use --all)")
    whole, record = record, chosen_hosts(record, args.workers, args.exclude_workers)
    options = record_options(record, args.log_dir, args.ssh_config)
    pattern = _pattern(args.grep)
    if args.follow:
        display = Display(record.fleet, args.run, "all", err)
        only = {h.host.process_id for h in record.hosts}
        follow = Attach(whole, replace(options, fail_fast=False), display, observe=True, only=only)
        what = (
            "stopped following; the run goes on (stop it with: "
            f"{kill_line(args.run, log_dir(args.log_dir))})"
        )
        result = execute_run(follow, display, what=what)
        return 0 if not result.interrupted else 130
    for o in blocking(lambda: past.sync_logs(run_dir, record, options.ssh)):
        if o.error:
            err.print(f"multihost: {o.host.name}: {o.error.message}", style="yellow", markup=False)
    logs = record.logs(run_dir)
    hosts = {h.host.name: (h.host, logs[h.host.process_id]) for h in record.hosts}
    if args.gather:
        return _gather(list(hosts.values()), args.tail or D.gather_lines, pattern, args.json, err)
    if args.all:
        chosen = list(hosts.values())
    else:
        name = args.host or record.hosts[0].host.name
        if name not in hosts:
            raise UsageError(f"no host {name} in run {args.run} (hosts: {', '.join(hosts)})")
        chosen = [hosts[name]]
    out = sys.stdout
    for host, path in chosen:
        lines = _read_lines(path)
        if pattern is not None:
            lines = [line for line in lines if pattern.search(line)]
        if args.tail:
            lines = lines[-args.tail :]
        prefix = f"[{host.name}] " if args.all else ""
        if lines:  # as on a run's terminal: colour kept, no other control sequence
            out.write(terminal.safe_block(lines, prefix))
    return 0


def _gather(
    chosen: list[tuple[Host, Path]],
    limit: int,
    pattern: re.Pattern[str] | None,
    as_json: bool,
    err: Console,
) -> int:
    """Every host's log (its last ``limit`` lines), identical output shown once with its
    hosts, differences per host group; says on stderr which hosts had more lines."""
    keep = None if pattern is None else (lambda line: pattern.search(line) is not None)
    outputs = [read_tail(host, path, limit, MAX_LINE, keep) for host, path in chosen]
    segments = gather(outputs)
    cut = [o for o in outputs if o.truncated]
    if as_json:
        print(
            json.dumps(
                {
                    "lines_per_host": limit,
                    "truncated": {o.host.name: o.total for o in cut},
                    "groups": [
                        {
                            "hosts": host_ranges(s.hosts),
                            "count": len(s.hosts),
                            "host_names": [h.name for h in s.hosts],
                            "depth": s.depth,
                            "lines": list(s.lines),
                        }
                        for s in segments
                    ],
                },
                indent=1,
            )
        )
        return 0
    if cut:
        most = max(o.total for o in cut)
        err.print(
            f"multihost: the last {limit} lines of each log (--tail N for more); "
            f"{host_ranges([o.host for o in cut])} had more (up to {most})",
            style="dim",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for line in render(segments):
        sys.stdout.write(terminal.safe_text(line) + "\n")
    return 0


def _pattern(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(f"--grep {text!r}: not a regular expression: {exc}") from None


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def cmd_clean(args: argparse.Namespace, err: Console) -> int:
    if args.older_than is None and not args.compile_caches:
        raise UsageError("clean needs --older-than AGE (old runs), --compile-caches, or both")
    logs = log_dir(args.log_dir)
    if args.compile_caches:  # first: the runs' records say which hosts to ask
        for line in blocking(lambda: past.clean_caches(logs, dry_run=args.dry_run)):
            print(line)
    if args.older_than is None:
        return 0
    age = past.parse_age(args.older_than)
    said = blocking(lambda: past.clean(logs, age, None, dry_run=args.dry_run))
    for line in said or [f"nothing older than {args.older_than} in {logs}"]:
        print(line)
    return 0
