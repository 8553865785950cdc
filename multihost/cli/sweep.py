"""The sweep command: grid and filter from flags, the sweep, the ranked table and chart."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from multihost.api.keywords import wants_pod
from multihost.cli import report, terminal
from multihost.cli.wiring import kill_line, plan_args, raise_nofile_limit, signals
from multihost.defaults import DEFAULTS as D
from multihost.errors import UsageError
from multihost.events import Event, Note
from multihost.options import default_run_name
from multihost.remote.commands import check_run_name
from multihost.sweep.grid import (
    check_template,
    expand,
    load_grid_file,
    merge_grids,
    parse_grid_args,
)
from multihost.sweep.results import Record, ResultsStore
from multihost.sweep.run import SWEEP_SETTINGS, Sweep, SweepSpec

if TYPE_CHECKING:
    from multihost.api.sweep import SweepResult
from multihost.sweep.where import Where


def sweep_spec(args: argparse.Namespace) -> SweepSpec:
    """Grid, template, filter and metric from the flags and an optional grid file."""
    grid_file = load_grid_file(args.grid_file) if args.grid_file else None
    grid = merge_grids(grid_file.grid if grid_file else {}, parse_grid_args(args.grid))
    template = args.cmd or (grid_file.cmd if grid_file else None)
    if not template:
        raise UsageError("sweep needs --cmd (or cmd = ... in the --grid-file)")
    check_template(template, grid)
    where_text = args.where or (grid_file.where if grid_file else None)
    where = Where.compile(where_text, list(grid)) if where_text else None
    if args.resume and not args.run_name:
        raise UsageError("--resume needs the --run-name of the sweep to resume")
    name = check_run_name(args.run_name or default_run_name("sweep"))
    return SweepSpec(
        name=name,
        template=template,
        points=tuple(expand(grid, where)),
        grid_names=tuple(grid),
        metric=args.metric or (grid_file.metric if grid_file else None) or "tflops_per_device",
        higher_is_better=not args.minimize,
        repeat=args.repeat,
        point_timeout=args.point_timeout,
        resume=args.resume,
        parallel=args.parallel,
        warm=args.warm,
    )


def sweep_settings(args: argparse.Namespace, name: str) -> dict[str, object]:
    """What the sweep's base run is planned from: its flags, as ``run_sweep``'s keywords are
    (``multihost.api.sweep.plan_sweep``)."""
    return {**vars(args), "cmd": "", "run_name": name, **SWEEP_SETTINGS}


def reproduce(args: argparse.Namespace, command: str) -> str:
    """The ``multihost run`` line that runs one point again (in the same environment)."""
    parts = ["multihost", "run"]
    for flag in (
        "hosts",
        "local",
        "prefix",
        "project",
        "zone",
        "ssh_config",
        "user",
        "requirements",
        "workers",
        "exclude_workers",
    ):
        value = getattr(args, flag, None)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    for flag in ("env", "secret", "extra", "group"):
        for item in getattr(args, flag, None) or ():
            parts += [f"--{flag}", item]
    parts += [
        f"--{f.replace('_', '-')}"
        for f in ("all_extras", "no_dev", "no_sync")
        if getattr(args, f, False)
    ]
    if getattr(args, "stage_via", D.stage_via) != D.stage_via:
        parts += ["--stage-via", args.stage_via]
    if getattr(args, "stage_bucket", D.stage_bucket):
        parts += ["--stage-bucket", args.stage_bucket]
    if args.script_dir != Path("."):
        parts += ["--script-dir", str(args.script_dir)]
    return shlex.join([*parts, "--cmd", command])


def trial_notes(err: Console) -> Callable[[Event], None]:
    """What a sweep's trials say beyond their record lines: warnings (a failing host is in its
    record line), and the locked environment's line the first time and whenever a trial built
    or installed it."""
    first = True

    def on_event(event: Event) -> None:
        nonlocal first
        if not isinstance(event, Note) or event.level == "error":
            return
        if event.level != "info":
            err.print(terminal.warning(event.text))
        elif event.text.startswith("environment from ") and (first or not _warm(event.text)):
            first = False
            err.print(f"multihost: {event.text}", style="dim", markup=False, highlight=False)

    return on_event


def _warm(text: str) -> bool:
    """An environment line that says only that every host had it."""
    return "built on" not in text and "installed on" not in text


def cmd_sweep(args: argparse.Namespace, err: Console) -> int:
    if wants_pod(vars(args)):  # a pod's flags: the pod made, checked or deleted around it
        from multihost.cli.fleet import around_pod

        return around_pod(args, err, lambda: _sweep(args, err))
    return _sweep(args, err)


def _sweep(args: argparse.Namespace, err: Console) -> int:
    from multihost.api.sweep import execute

    spec = sweep_spec(args)
    run = plan_args(sweep_settings(args, spec.name), err)
    raise_nofile_limit()
    done = total = 0

    def on_record(record: Record) -> None:
        nonlocal done
        done += 1
        err.print(report.record_line(done, total, record, spec.metric))

    def on_start(sweep: Sweep) -> None:
        nonlocal total
        total = len(sweep.todo())
        err.print(
            f"multihost: sweep {spec.name}: {len(spec.points)} point(s) × {spec.repeat}, "
            f"{total} to run on {len(sweep.groups)} group(s)"
            f"{' in warm processes' if spec.warm else ''}; results in {sweep.dir}",
            style="dim",
            markup=False,
        )

    kill = kill_line("RUN", run.options.log_dir)
    behind = (
        f"its trials may still be running on the hosts (stop each with: {kill}; RUN as "
        "multihost ls shows it)"
    )
    result = execute(
        run,
        spec,
        on_record,
        trial_notes(err),
        on_staged=lambda staging: err.print(report.staging_line(staging)),
        on_start=on_start,
        interrupt=lambda sweep: signals(err, sweep.interrupt, "stopping the sweep", left=behind),
    )
    return shown(args, result, err)


def shown(args: argparse.Namespace, result: SweepResult, err: Console) -> int:
    """The sweep's end, printed: why it stopped, the ranked table, the best point and how to
    run it again, where the results are; the exit code."""
    if result.env_failure is not None:
        left = sum(1 for r in result.records if r.status.startswith("not run"))
        err.print(
            f"multihost: the sweep stopped: {result.env_failure}; {left} trial(s) not run",
            style="bold red",
            markup=False,
            highlight=False,
        )
    if not result.summary:  # interrupted (or stopped) before any point finished
        err.print(
            f"multihost: no point finished: no results in {result.dir}",
            style="bold red" if not result.interrupted else "",
            markup=False,
            highlight=False,
        )
        return 130 if result.interrupted else 1
    summary = list(result.summary)
    Console(highlight=False).print(report.sweep_table(summary, result.metric, result.grid_names))
    if result.chart_problem:
        err.print(terminal.warning(f"no sweep.png: {result.chart_problem}"))
    top = result.best
    if top is not None:
        print(f"best: {top['label']}  {result.metric}={top['metric']}")
        print(f"reproduce: {reproduce(args, top['command'])}")
    store = ResultsStore(result.dir)
    print(
        f"results: {store.path}, {store.csv_path}"
        + ("" if result.chart_problem else f", {result.dir / 'sweep.png'}")
    )
    if result.interrupted:
        return 130
    return 0 if all(row["status"] == "ok" for row in summary) else 1
