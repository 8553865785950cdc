"""Commands on a fleet: run, hosts (and --check), envs, kill-stale, forget."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from multihost import fleetops
from multihost.api.keywords import configured
from multihost.api.runs import execute
from multihost.bridge import blocking
from multihost.cli import report
from multihost.cli.reaching import reach_args
from multihost.cli.wiring import (
    Display,
    execute_run,
    finish,
    note,
    progress,
    raise_nofile_limit,
    run_line,
    warn,
)
from multihost.core import Run
from multihost.core.postrun import pull_dest
from multihost.events import Event
from multihost.fleetops.preflight import PACKAGES, mismatches
from multihost.model import State
from multihost.options import RunOptions
from multihost.planner import DryRun, Plan, preview_hosts
from multihost.results.faces import size
from multihost.results.records import RunResult
from multihost.settings.checks import device_glob
from multihost.staging.archive import pack
from multihost.transport import forget


def cmd_run(args: argparse.Namespace, err: Console) -> int:
    view = RunView(err, args.stream, detach=args.detach, gather=args.gather)
    config = configured(args.config.values if args.config else None)
    # the settings as the parser made them, the config files already under them (no profile
    # to layer again); the library runs it, the view shows it
    execute({**vars(args), "profile": None}, view, config=config)
    return view.code


class RunView:
    """``multihost run``'s view of a run (``multihost.api.runs.RunView``): the plan's
    warnings, the live display and its interrupt policy, a dry run printed host after host,
    and at the end the summary, the work after the run and the exit code (``code``)."""

    def __init__(self, err: Console, stream: str, *, detach: bool, gather: bool = False) -> None:
        self.err, self.stream, self.detach, self.gather = err, stream, detach, gather
        self.display: Display | None = None
        self.options: RunOptions | None = None
        self.code = 0

    def say(self, text: str) -> None:
        self.err.print(f"multihost: {escape(text)}", highlight=False)

    @property
    def progress(self) -> Callable[[str], None]:
        return progress(self.err)

    def planned(self, plan: Plan) -> None:
        warn(self.err, plan.warnings)
        note(self.err, plan.notes)
        self.display = Display(
            plan.fleet, plan.job.run_name, self.stream, self.err, gather=self.gather
        )
        self.options = plan.options

    def event(self, event: Event) -> None:
        if self.display is not None:
            self.display(event)

    def execute(self, run: Run) -> RunResult:
        assert self.display is not None
        raise_nofile_limit()
        return execute_run(run, self.display)

    def dry(self, plan: Plan) -> None:
        self.code = dry_run(plan)

    def finished(self, result: RunResult) -> None:
        assert self.options is not None
        if self.detach:
            started = [r for r in result.hosts if r.state is State.RUNNING]
            if len(started) == len(result.hosts):
                print(f"run {result.run_name} started on {len(started)} host(s)")
                print(f"attach: {run_line('attach', result.run_name, self.options.log_dir)}")
                return
            self.err.print(report.summary_table(result, all_hosts=False))
            self.code = 1
            return
        code = finish(result, self.err, len(result.hosts))
        pulled = after_run(result, self.options, self.err)
        self.code = code or pulled


def around_pod(args: argparse.Namespace, err: Console, work: Callable[[], int]) -> int:
    """``sweep --prefix NAME`` with a pod's flags: ``work`` inside the pod's life
    (``multihost.api.pods.around``, as ``run_sweep(up=True, down=True)``); a pod that --down
    could not delete makes the exit 1 (the sweep's own failure wins)."""
    from multihost.api.pods import around
    from multihost.cli.pods import say_on

    config = configured(args.config.values if args.config else None)
    with around(vars(args), say_on(err), config=config, strict=False) as box:
        code = work()
        if box is not None:
            box.ending = f"exit {code}"
    return code or (1 if box is not None and box.deleted is False else 0)


def after_run(result: RunResult, options: RunOptions, err: Console) -> int:
    """What the work after the run brought back (``multihost.core.postrun``), said: the
    traces' tables, where the TPU logs are, what each host's pull gave; 1 if a pull failed."""
    if result.traces:  # the trace tables' modules only when there are traces
        from multihost.cli.trace import show

        for data in result.traces:
            show(dict(data), err)
    if result.tpu_logs and result.log_dir is not None:
        from multihost.diagnose.tpu_logs import summary

        for line in summary(result.tpu_logs, result.log_dir):
            err.print(line, style="dim", markup=False, highlight=False)
    if not options.pull:
        return 0
    dest = pull_dest(options, result.run_name)
    for line in report.pull_lines(result.pulled, dest, all_hosts=len(result.pulled) <= 32):
        print(line)
    return 0 if all(r.ok for r in result.pulled) else 1


def dry_run(run: Plan) -> int:
    """Print what the run would send each host (``planner.DryRun``'s lines, the API's
    ``dry_run=True`` value), host after host as each is planned; connect to nothing."""
    archive = pack(run.options.script_dir, run.options.excludes)
    head = DryRun(
        run.job.run_name, run.job.command, archive.short, archive.files, len(archive.data), ()
    )
    print(head.header)
    for host in preview_hosts(run, archive.short):  # one at a time
        print("\n".join(host.lines()))
    return 0


def cmd_hosts(args: argparse.Namespace, err: Console) -> int:
    where = reach_args(args, err, add_key=bool(args.check))
    fleet = where.fleet
    from multihost.sources.tpu import fleet_rows  # the cloud modules: not on a run's path

    rows: list[dict[str, object]] = [dict(r) for r in fleet_rows(fleet)]
    code = 0
    if args.check:
        outcomes = blocking(
            lambda: fleetops.check(
                fleet,
                where.ssh,
                args.remote_dir,
                args.coordinator_port,
                limit=args.connect_limit,
            )
        )
        for row, o in zip(rows, outcomes, strict=True):
            row.update(o.value or {"error": o.error.message if o.error else "failed"})
            code = code or (0 if o.ok else 1)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        keys = ["python", *PACKAGES] if args.check else []
        differ = mismatches([{k: str(v) for k, v in r.items()} for r in rows], keys)
        out = Console(highlight=False)
        table_rows = [
            {"host": h.name, **r, "address": h.target} for h, r in zip(fleet, rows, strict=True)
        ]
        for r in table_rows:  # the host name says slice, worker and process
            for key in ("slice", "worker", "process"):
                r.pop(key, None)
        first = [
            "address",
            "error",
            "state",
            "python",
            "jax",
            "jaxlib",
            "libtpu",
            "disk_free",
            "coordinator_port",
        ]
        out.print(report.fleet_table(table_rows, flagged=differ, width=out.width, prefer=first))
        if differ:
            err.print(
                f"multihost: versions differ across hosts: {', '.join(sorted(differ))}",
                style="bold red",
                markup=False,
            )
    return code


def cmd_envs(args: argparse.Namespace, err: Console) -> int:
    """Per host, each locked environment it holds; exit 1 when a host could not be asked."""
    from multihost.envsync.store import held_envs

    where = reach_args(args, err)
    outcomes = blocking(
        lambda: held_envs(where.fleet, where.ssh, args.remote_dir, limit=args.connect_limit)
    )
    rows = [
        row
        for o in outcomes
        for row in report.env_rows(o.host, o.value, o.error.message if o.error else None)
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        out = Console(highlight=False)
        cells = [report.env_cells(r) for r in rows]
        first = ["key", "state", "size", "last use", "runs", "error"]
        out.print(report.fleet_table(cells, width=out.width, prefer=first))
        held = [e for o in outcomes if o.value for e in o.value.envs]
        star = any(u.running for e in held for u in e.runs)
        err.print(
            f"{len({e.key for e in held})} environment(s) on "
            f"{sum(1 for o in outcomes if o.value and o.value.envs)} host(s), "
            f"{size(sum(e.bytes for e in held))} in all"
            + (" (run*: still running or preparing)" if star else ""),
            style="dim",
            markup=False,
            highlight=False,
        )
    return 0 if all(o.ok for o in outcomes) else 1


def cmd_kill_stale(args: argparse.Namespace, err: Console) -> int:
    where = reach_args(args, err)
    code = 0
    glob = device_glob()
    for o in blocking(
        lambda: fleetops.kill_stale(
            where.fleet, where.ssh, device_glob=glob, limit=args.connect_limit
        )
    ):
        if o.value is not None:
            print(f"{o.host.name} ({o.host.target}): {o.value.summary()}")
            code = code or (1 if o.value.remaining else 0)
        else:
            print(f"{o.host.name} ({o.host.target}): error: {o.error.message if o.error else '?'}")
            code = 1
    return code


def cmd_forget(args: argparse.Namespace, err: Console) -> int:
    where = reach_args(args, err)
    addresses = {a for h in where.fleet for a in (h.address, h.internal_address) if a}
    trust = where.ssh.trust_file
    dropped = forget(sorted(addresses), trust)
    print(
        f"forgot {len(dropped)} key(s) in {trust}" + (f": {', '.join(dropped)}" if dropped else "")
    )
    return 0
