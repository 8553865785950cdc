"""Argument parsing and wiring only: every decision lives in the modules it calls."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.live import Live
from rich.text import Text

from multihost import fleetops, report, runs
from multihost.errors import MultihostError, UsageError
from multihost.inventory import local_fleet, resolve_hosts
from multihost.manifest import host_from_json
from multihost.model import Fleet, Job, RunResult, State
from multihost.plan import check_run_name, job_script, parse_env, plan_hosts
from multihost.preflight import PACKAGES, mismatches
from multihost.runner import Event, HostEvent, Note, Run, RunOptions, default_log_dir
from multihost.stage import pack
from multihost.stale import DEVICE_GLOB_ENV
from multihost.stream import Line
from multihost.sweep import Sweep, SweepSpec
from multihost.sweep_grid import (
    Where,
    check_template,
    expand,
    load_grid_file,
    merge_grids,
    parse_grid_args,
)
from multihost.sweep_results import Record, latest, summarize, write_chart
from multihost.tpu import IP_MODES, discover, fleet_rows
from multihost.transport import HostKeyPolicy, SSHOptions, forget

GOOGLE_KEY = "~/.ssh/google_compute_engine"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line and exit 2, never the usage dump."""
        raise UsageError(f"{message} (see {self.prog} --help)")


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse


def _add_fleet_args(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="comma list of [user@]host[:port], or a TOML inventory")
    where.add_argument("--local", type=_positive(int), metavar="N", help="N workers here")
    where.add_argument("--prefix", help="Cloud TPU node or queued resource name")
    p.add_argument("--project", help="with --prefix: gcloud project (default: gcloud's)")
    p.add_argument("--zone", help="with --prefix: gcloud zone (default: gcloud's)")
    p.add_argument("--ip", choices=IP_MODES, default="auto",
                   help="with --prefix: address to connect to (auto: external if any)")  # fmt: skip
    p.add_argument("--user", help="ssh user for every host (overrides ssh config)")
    p.add_argument("--ssh-config", type=Path, help="ssh config file (default ~/.ssh/config)")
    p.add_argument(
        "--host-keys",
        choices=("strict", "accept-new"),
        default=None,
        help="strict: known_hosts only; accept-new: trust on first use, refuse a changed key "
        "(default: strict, accept-new with --prefix)",
    )
    p.add_argument("--connect-timeout", type=_positive(float), default=20.0, metavar="S")
    p.add_argument("--connect-limit", type=_positive(int), default=64, metavar="N",
                   help="handshakes in flight at once (default 64)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="multihost", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="stage code and run a command on every host at once")
    _add_fleet_args(run)
    run.add_argument("--cmd", required=True, help="command to run under sh -c on every host")
    run.add_argument("--script-dir", type=Path, default=Path("."), help="code to stage (default .)")
    run.add_argument("--exclude", action="append", default=[], metavar="PATTERN")
    run.add_argument("--env", action="append", default=[], metavar="K=V")
    run.add_argument(
        "--log-dir", type=Path, default=None, help="local logs (default ~/multihost-logs)"
    )
    run.add_argument("--run-name", help="default: a timestamp")
    run.add_argument("--remote-dir", default="~/.multihost", help="staging base on each host")
    run.add_argument("--stream", choices=("host0", "all", "none"), default="host0")
    run.add_argument("--no-fail-fast", dest="fail_fast", action="store_false")
    run.add_argument("--grace", type=_positive(float), default=10.0, metavar="S")
    run.add_argument("--timeout", type=_positive(float), metavar="S", help="bound the whole run")
    run.add_argument("--reconnect-timeout", type=float, default=300.0, metavar="S")
    run.add_argument("--coordinator-port", type=int, default=8476)
    run.add_argument("--megascale-port", type=int, default=8081)
    run.add_argument("--dry-run", action="store_true", help="print each host's command and env")
    run.add_argument("--detach", action="store_true",
                     help="exit once every host has started; follow later with attach")  # fmt: skip
    run.add_argument("--kill-stale", action="store_true",
                     help="stop accelerator device holders before launching")  # fmt: skip

    hosts = sub.add_parser("hosts", help="print the resolved fleet (and --check each host)")
    _add_fleet_args(hosts)
    hosts.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    hosts.add_argument(
        "--check", action="store_true", help="connect and report versions, disk, port"
    )
    hosts.add_argument("--remote-dir", default="~/.multihost")
    hosts.add_argument("--coordinator-port", type=int, default=8476)

    stale = sub.add_parser("kill-stale", help="stop processes holding accelerator devices")
    _add_fleet_args(stale)

    forget = sub.add_parser("forget", help="forget recorded host keys (after re-creating VMs)")
    _add_fleet_args(forget)

    def run_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("run", metavar="RUN", help="run name (see multihost ls)")
        p.add_argument("--log-dir", type=Path, default=None)
        p.add_argument("--ssh-config", type=Path, help="override the run's ssh config")
        return p

    attach = run_command("attach", "follow a run again from where the local logs end")
    attach.add_argument("--stream", choices=("host0", "all", "none"), default="host0")
    attach.add_argument("--reconnect-timeout", type=float, default=300.0, metavar="S")
    status = run_command("status", "per-host state of a run")
    status.add_argument("--refresh", action="store_true", help="ask the hosts even if finished")
    status.add_argument("--json", action="store_true")
    logs = run_command("logs", "bring a run's local logs up to date (and print or follow them)")
    logs.add_argument("--host", metavar="sS/wW", help="print this host's log")
    logs.add_argument("--follow", action="store_true", help="follow every host's log")
    kill = run_command("kill", "stop a run on every host")
    kill.add_argument("--signal", default="TERM", choices=("TERM", "INT", "HUP", "KILL", "USR1"))
    kill.add_argument("--grace", type=_positive(float), default=10.0, metavar="S")

    sweep = sub.add_parser("sweep", help="run a command over a grid of configs and rank them")
    _add_fleet_args(sweep)
    sweep.add_argument("--cmd", help="command template with {name} fields (or cmd in --grid-file)")
    sweep.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...")
    sweep.add_argument("--grid-file", type=Path, help="TOML with a [grid] table (where/cmd/metric)")
    sweep.add_argument("--where", help="keep points where this expression holds, e.g. 'a*b == 8'")
    sweep.add_argument("--metric", help="result field to rank by (default tflops_per_device)")
    sweep.add_argument("--minimize", action="store_true", help="smaller metric is better")
    sweep.add_argument("--repeat", type=_positive(int), default=1)
    sweep.add_argument("--point-timeout", type=_positive(float), metavar="S")
    sweep.add_argument(
        "--resume", action="store_true", help="skip points already ok (needs --run-name)"
    )
    sweep.add_argument("--parallel", default="none", metavar="slice|hosts:K",
                       help="points at once: one per slice or K-host group")  # fmt: skip
    sweep.add_argument("--script-dir", type=Path, default=Path("."))
    sweep.add_argument("--exclude", action="append", default=[], metavar="PATTERN")
    sweep.add_argument("--env", action="append", default=[], metavar="K=V")
    sweep.add_argument("--log-dir", type=Path, default=None)
    sweep.add_argument("--run-name", help="sweep name (default: sweep-<timestamp>)")
    sweep.add_argument("--remote-dir", default="~/.multihost")
    sweep.add_argument("--grace", type=_positive(float), default=10.0, metavar="S")
    sweep.add_argument("--coordinator-port", type=int, default=8476)
    sweep.add_argument("--megascale-port", type=int, default=8081)
    sweep.add_argument("--kill-stale", action="store_true")

    ls = sub.add_parser("ls", help="runs under the log dir")
    ls.add_argument("--log-dir", type=Path, default=None)
    clean = sub.add_parser("clean", help="remove old finished runs, locally and on their hosts")
    clean.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 7d, 12h")
    clean.add_argument("--log-dir", type=Path, default=None)
    clean.add_argument("--dry-run", action="store_true")
    return parser


def fleet_from_args(args: argparse.Namespace, err: Console | None = None) -> Fleet:
    if args.local:
        fleet = local_fleet(args.local)
    elif args.prefix:
        found = discover(
            args.prefix, project=args.project, zone=args.zone, ip=args.ip,
            gcloud=os.environ.get("MULTIHOST_GCLOUD", "gcloud"),
        )  # fmt: skip
        for warning in found.warnings:
            if err is not None:
                err.print(f"multihost: warning: {warning}", style="yellow", markup=False)
        fleet = found.fleet
    else:
        fleet = resolve_hosts(args.hosts)
    if args.user:
        fleet = Fleet(tuple(replace(h, user=args.user) for h in fleet))
    return fleet


def ssh_options(args: argparse.Namespace) -> SSHOptions:
    config: tuple[Path, ...] = ()
    if args.ssh_config is not None:
        if not args.ssh_config.is_file():
            raise UsageError(f"ssh config {args.ssh_config} does not exist")
        config = (args.ssh_config,)
    policy: HostKeyPolicy = args.host_keys or ("accept-new" if args.prefix else "strict")
    return SSHOptions(
        config=config,
        host_keys=policy,
        connect_timeout=args.connect_timeout,
        fallback_identity=GOOGLE_KEY if args.prefix else None,
    )


def job_from_args(args: argparse.Namespace) -> Job:
    name = args.run_name or time.strftime("%Y%m%d-%H%M%S")
    return Job(
        command=args.cmd,
        run_name=check_run_name(name),
        env=parse_env(args.env),
        remote_dir=args.remote_dir,
        coordinator_port=args.coordinator_port,
        megascale_port=args.megascale_port,
    )


def run_options(args: argparse.Namespace, ssh: SSHOptions) -> RunOptions:
    if not args.script_dir.is_dir():
        raise UsageError(f"script dir {args.script_dir} does not exist or is not a directory")
    return RunOptions(
        script_dir=args.script_dir,
        excludes=tuple(args.exclude),
        log_dir=(args.log_dir or default_log_dir()).expanduser(),
        ssh=ssh,
        connect_limit=args.connect_limit,
        fail_fast=args.fail_fast,
        grace=args.grace,
        timeout=args.timeout,
        reconnect_timeout=args.reconnect_timeout,
        stale="kill" if args.kill_stale else ("warn" if args.prefix else "off"),
        device_glob=os.environ.get(DEVICE_GLOB_ENV),
    )


class Display:
    """Turns run events into terminal output: host lines on stdout, status on stderr."""

    def __init__(self, fleet: Fleet, run_name: str, stream: str, err: Console) -> None:
        self.run_name, self.stream, self.err = run_name, stream, err
        self.out = Console(highlight=False, soft_wrap=True)
        self.states = {h.process_id: State.PENDING for h in fleet}
        self.started = time.monotonic()
        self.live: Live | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, Line):
            if self.stream == "all":
                self.out.print(report.host_prefix(event.host).append(event.text))
            elif self.stream == "host0" and event.host.process_id == 0:
                self.out.print(event.text, markup=False)
        elif isinstance(event, HostEvent):
            self.states[event.host.process_id] = event.state
            if self.live is not None:
                self.live.update(self.status())
        elif isinstance(event, Note):
            style = "bold red" if event.level == "error" else "dim"
            self.err.print(f"multihost: {event.text}", style=style, markup=False, highlight=False)

    def status(self) -> Text:
        return report.status_line(self.run_name, self.states, time.monotonic() - self.started)


def raise_nofile_limit() -> None:
    """One file descriptor per connection: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def _execute(run: Run, display: Display) -> RunResult:
    loop = asyncio.get_running_loop()
    presses = 0

    def on_signal(signum: int) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            display.err.print(
                f"multihost: second {signal.Signals(signum).name}: exiting without stopping; "
                "jobs may still be running on the hosts", style="bold red",
            )  # fmt: skip
            os._exit(130)
        display.err.print(
            f"multihost: {signal.Signals(signum).name}: stopping every host", style="bold red"
        )
        run.interrupt()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        if display.err.is_terminal:
            with Live(display.status(), console=display.err, refresh_per_second=4,
                      redirect_stdout=True, transient=True) as live:  # fmt: skip
                display.live = live
                return await run.execute()
        return await run.execute()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def cmd_run(args: argparse.Namespace, err: Console) -> int:
    fleet = fleet_from_args(args, err)
    job = job_from_args(args)
    options = run_options(args, ssh_options(args))
    if args.dry_run:
        return dry_run(fleet, job, options)
    raise_nofile_limit()
    options = replace(options, detach=args.detach)
    display = Display(fleet, job.run_name, args.stream, err)
    result = asyncio.run(_execute(Run(fleet, job, options, display), display))
    if args.detach:
        started = [r for r in result.hosts if r.state is State.RUNNING]
        if len(started) == len(result.hosts):
            print(f"run {job.run_name} started on {len(started)} host(s)")
            print(f"attach: multihost attach {job.run_name} --log-dir {options.log_dir}")
            return 0
        err.print(report.summary_table(result, all_hosts=False))
        return 1
    return finish(result, err, len(fleet))


def finish(result: RunResult, err: Console, n: int) -> int:
    """The summary table, the verdict, where the logs are; returns the exit code."""
    err.print(report.summary_table(result, all_hosts=n <= 32 or not result.ok))
    err.print(report.verdict(result))
    err.print(f"logs: {result.log_dir}", style="dim", markup=False, highlight=False)
    return result.exit_code


def _log_dir(args: argparse.Namespace) -> Path:
    return Path(args.log_dir or default_log_dir()).expanduser()


def _record_options(
    args: argparse.Namespace, record: dict[str, object], **kw: object
) -> RunOptions:
    opts = runs.options_from_record(record, _log_dir(args), **kw)
    if args.ssh_config is not None:
        opts = replace(opts, ssh=replace(opts.ssh, config=ssh_options(args).config))
    return opts


def cmd_attach(args: argparse.Namespace, err: Console) -> int:
    _, record = runs.find_run(_log_dir(args), args.run)
    options = _record_options(args, record, reconnect_timeout=args.reconnect_timeout)
    raise_nofile_limit()
    fleet = runs.record_fleet(record)
    display = Display(fleet, args.run, args.stream, err)
    result = asyncio.run(_execute(Run.attach(record, options, display), display))
    return finish(result, err, len(fleet))


def cmd_kill(args: argparse.Namespace, err: Console) -> int:
    _, record = runs.find_run(_log_dir(args), args.run)
    options = _record_options(args, record, grace=args.grace, reconnect_timeout=0.0)
    fleet = runs.record_fleet(record)
    display = Display(fleet, args.run, "none", err)
    run = Run.attach(record, options, display)
    run.stop_signal = args.signal
    run.interrupt()
    result = asyncio.run(_execute(run, display))
    err.print(report.summary_table(result))
    return 1 if any(r.state is State.LOST for r in result.hosts) else 0


def cmd_status(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = runs.find_run(_log_dir(args), args.run)
    rows: list[dict[str, object]] = []
    asked = args.refresh or runs.run_state(record) == "running"
    if asked:
        options = _record_options(args, record)
        statuses = asyncio.run(runs.host_statuses(record, options.ssh))
        runs.mark_states(run_dir, record, statuses)
        for o in statuses:
            rows.append(report.status_row(o.host, o.value, o.error.message if o.error else None))
    else:
        for h in record["hosts"]:
            rows.append(report.record_row(h))
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        Console(highlight=False).print(report.fleet_table(rows))
        if not asked:
            err.print("(from run.json: the run is finished; --refresh asks the hosts)", style="dim")
    return 0


def cmd_ls(args: argparse.Namespace, err: Console) -> int:
    rows = [report.ls_row(name, record) for name, record in runs.all_runs(_log_dir(args))]
    if rows:
        Console(highlight=False).print(report.fleet_table(rows))
    else:
        err.print(f"no runs in {_log_dir(args)}")
    return 0


def cmd_logs(args: argparse.Namespace, err: Console) -> int:
    run_dir, record = runs.find_run(_log_dir(args), args.run)
    options = _record_options(args, record)
    if args.follow:
        fleet = runs.record_fleet(record)
        display = Display(fleet, args.run, "all", err)
        run = Run.attach(record, replace(options, fail_fast=False), display)
        run.observe_only = True
        result = asyncio.run(_execute(run, display))
        return 0 if not result.interrupted else 130
    for o in asyncio.run(runs.sync_logs(run_dir, record, options.ssh)):
        if o.error:
            err.print(f"multihost: {o.host.name}: {o.error.message}", style="yellow", markup=False)
    if args.host:
        hosts = {host_from_json(h["host"]).name: h["log"] for h in record["hosts"]}
        if args.host not in hosts:
            raise UsageError(f"no host {args.host} in run {args.run} (hosts: {', '.join(hosts)})")
        sys.stdout.write((run_dir / hosts[args.host]).read_text(errors="replace"))
    else:
        print(f"logs of {args.run} up to date in {run_dir}")
    return 0


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
    name = check_run_name(args.run_name or time.strftime("sweep-%Y%m%d-%H%M%S"))
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
    )


def reproduce(args: argparse.Namespace, command: str) -> str:
    """The ``multihost run`` line that runs one point again."""
    parts = ["multihost", "run"]
    for flag in ("hosts", "local", "prefix", "project", "zone", "ssh_config", "user"):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    for item in args.env:
        parts += ["--env", item]
    if args.script_dir != Path("."):
        parts += ["--script-dir", str(args.script_dir)]
    return shlex.join([*parts, "--cmd", command])


def cmd_sweep(args: argparse.Namespace, err: Console) -> int:
    spec = sweep_spec(args)
    fleet = fleet_from_args(args, err)
    args.kill_stale = getattr(args, "kill_stale", False)
    base = Job(
        command="", run_name=spec.name, env=parse_env(args.env), remote_dir=args.remote_dir,
        coordinator_port=args.coordinator_port, megascale_port=args.megascale_port,
    )  # fmt: skip
    args.timeout, args.reconnect_timeout, args.fail_fast = None, 300.0, True
    options = run_options(args, ssh_options(args))
    raise_nofile_limit()
    done = 0

    def on_record(record: Record) -> None:
        nonlocal done
        done += 1
        err.print(report.record_line(done, total, record, spec.metric))

    sweep = Sweep(fleet, spec, base, options, on_record)
    groups = len(sweep.groups)
    todo = total = len(sweep.todo())
    err.print(
        f"multihost: sweep {spec.name}: {len(spec.points)} point(s) × {spec.repeat}, "
        f"{todo} to run on {groups} group(s); results in {sweep.dir}", style="dim",
    )  # fmt: skip
    asyncio.run(_execute_sweep(sweep, err))
    rows = sweep.store.load()
    sweep.store.write_csv(latest(rows), list(spec.grid_names))
    summary = summarize(rows, spec.metric, spec.grid_names, spec.higher_is_better)
    Console(highlight=False).print(report.sweep_table(summary, spec.metric, spec.grid_names))
    problem = write_chart(sweep.dir / "sweep.png", summary, spec.metric, spec.grid_names,
                          spec.higher_is_better)  # fmt: skip
    if problem:
        err.print(f"multihost: no sweep.png: {problem}", style="yellow")
    top = summary[0] if summary and summary[0]["best"] else None
    if top is not None:
        print(f"best: {top['label']}  {spec.metric}={top['metric']}")
        print(f"reproduce: {reproduce(args, top['command'])}")
    print(f"results: {sweep.store.path}, {sweep.store.csv_path}"
          + ("" if problem else f", {sweep.dir / 'sweep.png'}"))  # fmt: skip
    if sweep.interrupted:
        return 130
    return 0 if all(row["status"] == "ok" for row in summary) else 1


async def _execute_sweep(sweep: Sweep, err: Console) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if sweep.interrupted:
            os._exit(130)
        err.print(f"multihost: {signal.Signals(signum).name}: stopping the sweep", style="bold red")
        sweep.interrupt()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await sweep.execute()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def cmd_clean(args: argparse.Namespace, err: Console) -> int:
    age = runs.parse_age(args.older_than)
    said = asyncio.run(runs.clean(_log_dir(args), age, None, dry_run=args.dry_run))
    for line in said or [f"nothing older than {args.older_than} in {_log_dir(args)}"]:
        print(line)
    return 0


def dry_run(fleet: Fleet, job: Job, options: RunOptions) -> int:
    """Print, per host, the exact remote launch script and env; connect to nothing."""
    archive = pack(options.script_dir, options.excludes)
    print(f"# code {archive.short}: {archive.files} files, {len(archive.data)} bytes")
    for plan in plan_hosts(fleet, job, archive.short):
        print(f"### {plan.host.name} ({plan.host.target}) process {plan.host.process_id}")
        for k, v in plan.env.items():
            print(f"# {k}={v}")
        print(f"# job.sh, started detached in {plan.paths.run}:")
        print(job_script(plan.paths, plan.env, job.command))
        print("# sent to `sh -s` on the host:")
        print(plan.launch)
    return 0


def cmd_hosts(args: argparse.Namespace, err: Console) -> int:
    fleet = fleet_from_args(args, err)
    rows: list[dict[str, object]] = [dict(r) for r in fleet_rows(fleet)]
    code = 0
    if args.check:
        outcomes = asyncio.run(
            fleetops.check(fleet, ssh_options(args), args.remote_dir, args.coordinator_port)
        )
        for row, o in zip(rows, outcomes, strict=True):
            row.update(o.value or {"error": o.error.message if o.error else "failed"})
            code = code or (0 if o.ok else 1)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        keys = ["python", *PACKAGES] if args.check else []
        differ = mismatches([{k: str(v) for k, v in r.items()} for r in rows], keys)
        Console(highlight=False).print(report.fleet_table(rows, flagged=differ))
        if differ:
            err.print(f"multihost: versions differ across hosts: {', '.join(sorted(differ))}",
                      style="bold red")  # fmt: skip
    return code


def cmd_kill_stale(args: argparse.Namespace, err: Console) -> int:
    fleet = fleet_from_args(args, err)
    glob = os.environ.get(DEVICE_GLOB_ENV)
    code = 0
    for o in asyncio.run(fleetops.kill_stale(fleet, ssh_options(args), device_glob=glob)):
        if o.value is not None:
            print(f"{o.host.name} ({o.host.target}): {o.value.summary()}")
            code = code or (1 if o.value.remaining else 0)
        else:
            print(f"{o.host.name} ({o.host.target}): error: {o.error.message if o.error else '?'}")
            code = 1
    return code


def cmd_forget(args: argparse.Namespace, err: Console) -> int:
    fleet = fleet_from_args(args, err)
    addresses = {a for h in fleet for a in (h.address, h.internal_address) if a}
    trust = ssh_options(args).trust_file
    dropped = forget(sorted(addresses), trust)
    print(
        f"forgot {len(dropped)} key(s) in {trust}" + (f": {', '.join(dropped)}" if dropped else "")
    )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "run": cmd_run, "hosts": cmd_hosts, "kill-stale": cmd_kill_stale, "forget": cmd_forget,
    "attach": cmd_attach, "status": cmd_status, "ls": cmd_ls, "logs": cmd_logs,
    "kill": cmd_kill, "clean": cmd_clean, "sweep": cmd_sweep,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> NoReturn:
    err = Console(stderr=True, highlight=False)
    try:
        args = build_parser().parse_args(argv)
        code = COMMANDS[args.command](args, err)
    except UsageError as exc:
        print(f"multihost: error: {exc}", file=sys.stderr)
        code = 2
    except MultihostError as exc:
        print(f"multihost: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
