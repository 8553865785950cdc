"""CLI wiring shared by the commands: flags to fleets, jobs and options; display; signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shlex
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console, Group, RenderableType
from rich.live import Live

from multihost import report, runs
from multihost.bundled import payload_command, payloads_dir
from multihost.cli.output import stdout
from multihost.cli.progress import TransferView
from multihost.core import Attach, Run
from multihost.defaults import DEFAULTS as D
from multihost.errors import UsageError
from multihost.fleetops.preflight import free_port, port_in_use
from multihost.fleetops.stale import DEVICE_GLOB_ENV
from multihost.model import Fleet, Host, Job, RunResult, State
from multihost.plan import check_run_name, parse_env
from multihost.record import RunRecord
from multihost.runstate import (
    Event,
    HostEvent,
    Note,
    RunOptions,
    Transfer,
    default_log_dir,
    default_run_name,
)
from multihost.sources import FleetSpec, resolve, spec_fields
from multihost.stage import list_files
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


def with_payload(args: argparse.Namespace) -> argparse.Namespace:
    """``run --payload NAME [-- ARGS]``: the installed payloads are the code to stage and
    ``PYTHON NAME.py ARGS`` the command (PYTHON: --python, else this one with --local, else
    python3)."""
    if args.payload is None:
        if args.args:
            raise UsageError(f"unexpected arguments {shlex.join(args.args)}: only --payload "
                             "takes arguments after --")  # fmt: skip
        return args
    configured = args.config.values.get("script-dir", (None,))[0] if args.config else None
    if args.script_dir not in (Path("."), configured):
        raise UsageError("--payload stages the payloads that ship with multihost: leave out "
                         "--script-dir, or run your own code with --cmd")  # fmt: skip
    python = args.python or (sys.executable if args.local is not None else "python3")
    return argparse.Namespace(**{
        **vars(args), "script_dir": payloads_dir(),
        "cmd": payload_command(args.payload, args.args, python),
    })  # fmt: skip


def job_from_args(args: argparse.Namespace) -> Job:
    return Job(
        command=args.cmd,
        run_name=check_run_name(args.run_name or default_run_name()),
        env=parse_env(args.env),
        remote_dir=args.remote_dir,
        coordinator_port=coordinator_port(args),
        megascale_port=args.megascale_port,
    )


def coordinator_port(args: argparse.Namespace) -> int:
    """``--coordinator-port``; else with ``--local`` a free port (two local runs at once must
    not meet at one coordinator), else jax's default. A busy port here is refused up front."""
    port: int | None = args.coordinator_port
    if args.local is None:
        return port or D.coordinator_port
    if port is None:
        return free_port()
    busy = port_in_use(port)
    if busy:
        raise UsageError(
            f"coordinator port {port} is busy on this machine (host 0 of --local): {busy}; "
            "leave out --coordinator-port for a free one"
        )
    return port


def run_options(args: argparse.Namespace, ssh: SSHOptions) -> RunOptions:
    log_dir = (args.log_dir or default_log_dir()).expanduser()
    check_log_dir(log_dir)
    list_files(args.script_dir, tuple(args.exclude), args.max_stage_bytes)  # refuse early
    return RunOptions(
        script_dir=args.script_dir,
        excludes=tuple(args.exclude),
        log_dir=log_dir,
        ssh=ssh,
        connect_limit=args.connect_limit,
        fail_fast=args.fail_fast,
        grace=args.grace,
        timeout=args.timeout,
        reconnect_timeout=args.reconnect_timeout,
        stage_via=getattr(args, "stage_via", D.stage_via),
        stale="kill" if args.kill_stale else ("warn" if fleet_spec(args).cloud else "off"),
        device_glob=os.environ.get(DEVICE_GLOB_ENV),
        record_env=bool(getattr(args, "record_env", False)),
        hang_timeout=args.hang_timeout,
        on_hang=args.on_hang,
    )


def check_log_dir(log_dir: Path) -> None:
    """The log dir must be (or become) a writable directory; nothing is created here."""
    existing = log_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise UsageError(f"log dir {log_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"log dir {log_dir}: {existing} is not writable")


SILENT_AFTER = 60.0  # s without output before the status line names a running host


class Display:
    """Turns run events into terminal output: host lines on stdout, notes on stderr, and on a
    terminal a live status line below the host lines, redrawn at least once a second.

    While the status line is live, everything goes through its console so that host lines
    print above it instead of into it. Host lines carry colour but no other control sequences.
    """

    def __init__(self, fleet: Fleet, run_name: str, stream: str, err: Console) -> None:
        self.run_name, self.stream, self.err = run_name, stream, err
        self.out = Console(file=stdout(), highlight=False, soft_wrap=True)
        self.states = {h.process_id: State.PENDING for h in fleet}
        self.hosts = {h.process_id: h for h in fleet}
        self.started = time.monotonic()
        self.heard: dict[int, float] = {}  # process id -> when it last printed (or started)
        self.live: Live | None = None
        self.quiet = False  # stdout went away (a closed pipe): stop writing host lines
        self._prefixes: dict[int, str] = {}  # process id -> its rendered prefix (a terminal)
        self.tty = self.out.is_terminal
        self.staging = TransferView("staging code", len(fleet))  # drawn only while live
        self._drawn = 0.0  # when a transfer last asked for a redraw

    @property
    def live_console(self) -> Console | None:
        """Where a live status line can go: stdout when it is the terminal, else stderr."""
        if not self.err.is_terminal:
            return None
        return self.out if self.out.is_terminal else self.err

    def __call__(self, event: Event) -> None:
        if isinstance(event, Line):
            self.heard[event.host.process_id] = time.monotonic()
            self._host_line(event)
        elif isinstance(event, HostEvent):
            if event.state is State.RUNNING and event.host.process_id not in self.heard:
                self.heard[event.host.process_id] = time.monotonic()
            self.states[event.host.process_id] = event.state
            if self.live is not None:
                self.live.refresh()
        elif isinstance(event, Transfer):
            self.staging.update(event)
            now = time.monotonic()
            if self.live is not None and (now - self._drawn >= 0.1 or event.finished):
                self._drawn = now
                self.live.refresh()
        elif isinstance(event, Note):
            style = "bold red" if event.level == "error" else "dim"
            console = self.live.console if self.live is not None else self.err
            console.print(f"multihost: {event.text}", style=style, markup=False, highlight=False,
                          soft_wrap=False)  # fmt: skip

    def _host_line(self, event: Line) -> None:
        if self.quiet or self.stream == "none":
            return
        if self.stream == "host0" and event.host.process_id != 0:
            return
        host = event.host if self.stream == "all" else None
        try:
            if self.tty:  # above the live status line when there is one
                block = report.safe_block(event.texts, self._prefix(host))
                if "\x1b" in block:  # a host's colour never reaches the status line
                    block = block[:-1] + "\x1b[0m\n"
                self.out.print(report.Raw(block), end="")
            else:  # a pipe or file: plain text, colour codes kept, nothing else
                prefix = f"[{host.name}] " if host else ""
                self.out.file.write(report.safe_block(event.texts, prefix))
        except BrokenPipeError:
            self.quiet = True

    def _prefix(self, host: Host | None) -> str:
        if host is None:
            return ""
        if host.process_id not in self._prefixes:
            self._prefixes[host.process_id] = report.ansi_prefix(host, self.out)
        return self._prefixes[host.process_id]

    def status(self) -> RenderableType:
        """The live status line; while code is being staged, the staging progress above it."""
        now = time.monotonic()
        silent = {
            self.hosts[pid]: now - t for pid, t in self.heard.items()
            if self.states[pid] is State.RUNNING and now - t >= SILENT_AFTER
        }  # fmt: skip
        line = report.status_line(self.run_name, self.states, now - self.started, silent)
        if self.staging.started and State.STAGING in self.states.values():
            return Group(self.staging.renderable(), line)
        return line


def raise_nofile_limit() -> None:
    """One file descriptor per connection: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class Detached(Exception):
    """The user detached from a run (a signal with nothing to stop): the run goes on."""


def run_interruptibly(
    coro: Coroutine[Any, Any, T],
    stop: Callable[[], None] | None,
    err: Console,
    what: str,
    stacks: Callable[[], None] | None = None,
) -> T:
    """asyncio.run with Ctrl-C, SIGTERM and SIGHUP calling ``stop`` (``what`` says what that
    does); a second signal exits at once. With ``stop=None`` the first signal detaches: the
    coroutine is cancelled, nothing on the hosts is touched, and :class:`Detached` is raised."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(coro)
        presses = 0
        if stacks is not None:  # Ctrl-\ (SIGQUIT): every host's stacks, grouped, now
            loop.add_signal_handler(signal.SIGQUIT, stacks)

        def on_signal(signum: int) -> None:
            nonlocal presses
            presses += 1
            name = signal.Signals(signum).name
            if presses > 1:
                _say(err, f"multihost: second {name}: exiting now; jobs may still be running "
                     "on the hosts")  # fmt: skip
                os._exit(130)
            _say(err, f"multihost: {name}: {what}")
            if stop is None:
                task.cancel()
            else:
                stop()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await task
        except asyncio.CancelledError:
            if stop is None and presses:
                raise Detached from None
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


def _say(err: Console, text: str) -> None:
    """A signal's message; after SIGHUP the terminal may be gone, which must not stop us."""
    with contextlib.suppress(OSError):
        err.print(text, style="bold red", markup=False, soft_wrap=True)


def execute_run(
    run: Run | Attach,
    display: Display,
    *,
    what: str = "stopping every host",
    detach: bool = False,
) -> RunResult:
    """Run with the live status line (on a terminal) and signal handling; with ``detach``, a
    signal leaves the hosts alone and raises :class:`Detached`."""

    async def go() -> RunResult:
        console = display.live_console
        if console is not None:
            with Live(get_renderable=display.status, console=console, refresh_per_second=4,
                      redirect_stdout=False, redirect_stderr=False,
                      transient=True) as live:  # fmt: skip
                display.live = live
                try:
                    return await run.execute()
                finally:
                    display.live = None
        return await run.execute()

    return run_interruptibly(
        go(), None if detach else run.interrupt, display.err, what, run.request_stacks
    )


def finish(result: RunResult, err: Console, n: int) -> int:
    """The summary table, the verdict, where the logs are; returns the exit code."""
    err.print(report.summary_table(result, all_hosts=n <= 32 or not result.ok))
    if result.staging is not None:
        err.print(report.staging_line(result.staging))
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
