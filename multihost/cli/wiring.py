"""CLI wiring shared by the commands: flags to fleets, jobs and options; display; signals."""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.live import Live
from rich.text import Text

from multihost import report, runs
from multihost.errors import UsageError
from multihost.fleetops.stale import DEVICE_GLOB_ENV
from multihost.model import Fleet, Job, RunResult, State
from multihost.plan import check_run_name, parse_env
from multihost.record import RunRecord
from multihost.runner import Attach, Run
from multihost.runstate import Event, HostEvent, Note, RunOptions, default_log_dir
from multihost.sources import FleetSpec, resolve, spec_fields
from multihost.stream import Line
from multihost.transport import HostKeyPolicy, SSHOptions

GOOGLE_KEY = "~/.ssh/google_compute_engine"
T = TypeVar("T")


def fleet_spec(args: argparse.Namespace) -> FleetSpec:
    """The fleet flags (``--hosts/--local/--prefix`` and their options) as a FleetSpec."""
    given: dict[str, Any] = {n: getattr(args, n) for n in spec_fields() if hasattr(args, n)}
    return FleetSpec(**given)


def fleet_from_args(args: argparse.Namespace, err: Console | None = None) -> Fleet:
    found = resolve(fleet_spec(args))
    for warning in found.warnings:
        if err is not None:
            err.print(f"multihost: warning: {warning}", style="yellow", markup=False)
    return found.fleet


def ssh_options(args: argparse.Namespace) -> SSHOptions:
    config: tuple[Path, ...] = ()
    if args.ssh_config is not None:
        if not args.ssh_config.is_file():
            raise UsageError(f"ssh config {args.ssh_config} does not exist")
        config = (args.ssh_config,)
    cloud = fleet_spec(args).cloud
    policy: HostKeyPolicy = args.host_keys or ("accept-new" if cloud else "strict")
    return SSHOptions(
        config=config,
        host_keys=policy,
        connect_timeout=args.connect_timeout,
        fallback_identity=GOOGLE_KEY if cloud else None,
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
        stale="kill" if args.kill_stale else ("warn" if fleet_spec(args).cloud else "off"),
        device_glob=os.environ.get(DEVICE_GLOB_ENV),
        record_env=getattr(args, "record_env", False),
        hang_timeout=args.hang_timeout,
        on_hang=args.on_hang,
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


def run_interruptibly(
    coro: Coroutine[Any, Any, T], stop: Callable[[], None], err: Console, what: str
) -> T:
    """asyncio.run with Ctrl-C, SIGTERM and SIGHUP asking ``stop`` to stop everything; a second
    signal exits at once."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        presses = 0

        def on_signal(signum: int) -> None:
            nonlocal presses
            presses += 1
            name = signal.Signals(signum).name
            if presses > 1:
                err.print(f"multihost: second {name}: exiting now; jobs may still be running "
                          "on the hosts", style="bold red")  # fmt: skip
                os._exit(130)
            err.print(f"multihost: {name}: {what}", style="bold red")
            stop()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


def execute_run(run: Run | Attach, display: Display) -> RunResult:
    """Run with the live status line (on a terminal) and signal handling."""

    async def go() -> RunResult:
        if display.err.is_terminal:
            with Live(display.status(), console=display.err, refresh_per_second=4,
                      redirect_stdout=True, transient=True) as live:  # fmt: skip
                display.live = live
                return await run.execute()
        return await run.execute()

    return run_interruptibly(go(), run.interrupt, display.err, "stopping every host")


def finish(result: RunResult, err: Console, n: int) -> int:
    """The summary table, the verdict, where the logs are; returns the exit code."""
    err.print(report.summary_table(result, all_hosts=n <= 32 or not result.ok))
    err.print(report.verdict(result))
    err.print(f"logs: {result.log_dir}", style="dim", markup=False, highlight=False)
    return result.exit_code


def record_options(args: argparse.Namespace, record: RunRecord, **kw: object) -> RunOptions:
    opts = runs.options_from_record(record, log_dir_of(args), **kw)
    if args.ssh_config is not None:
        opts = replace(opts, ssh=replace(opts.ssh, config=ssh_options(args).config))
    return opts


def log_dir_of(args: argparse.Namespace) -> Path:
    """The local log dir: --log-dir, $MULTIHOST_LOG_DIR or ~/multihost-logs."""
    return Path(args.log_dir or default_log_dir()).expanduser()
