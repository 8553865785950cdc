"""CLI wiring shared by the commands: the plan with its warnings said, the display, the
signals' policy, the summary and exit code."""

from __future__ import annotations

import asyncio
import functools
import resource
import shlex
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType

from multihost.bridge import Interrupt, blocking
from multihost.cli import report, terminal
from multihost.cli.output import stdout
from multihost.core import Attach, Run
from multihost.defaults import DEFAULTS as D
from multihost.events import Event, HostEvent, Line, Note, Transfer
from multihost.model import Fleet, Host, State, host_ranges
from multihost.options import RunOptions
from multihost.planner import Plan, plan
from multihost.results.faces import run_lines
from multihost.results.records import RESULT_MARKER, RunResult
from multihost.runs.gather import LiveGather, Segment
from multihost.runs.record import RunRecord
from multihost.settings.checks import log_dir
from multihost.sources import workers
from multihost.transport.sshconfig import given_config

if TYPE_CHECKING:  # drawn only on a terminal: imported when a live status line starts
    from rich.live import Live

    from multihost.cli.progress import TransferView

RESULT_LINE = RESULT_MARKER + " "


def plan_args(settings: Mapping[str, Any], err: Console) -> Plan:
    """The run the flags ask for (``multihost.planner``), the source's warnings said."""
    found = plan({**settings, "progress": progress(err)})
    warn(err, found.warnings)
    note(err, found.notes)
    return found


def progress(err: Console) -> Callable[[str], None]:
    """Where a --wait says how it goes."""
    return lambda text: err.print(f"multihost: {text}", style="dim", markup=False, highlight=False)


def note(err: Console, notes: tuple[str, ...]) -> None:
    for note in notes:
        err.print(f"multihost: {note}", markup=False, highlight=False)


def warn(err: Console, warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        err.print(f"multihost: warning: {warning}", style="yellow", markup=False)


SILENT_AFTER = 60.0  # s without output before the status line names a running host
GATHER_TICK = 0.25  # s between looks for --gather's groups that are due


class Display:
    """Turns run events into terminal output: host lines on stdout, notes on stderr, and on a
    terminal a live status line below the host lines, redrawn at least once a second.

    While the status line is live, everything goes through its console so that host lines
    print above it instead of into it. Host lines carry colour but no other control sequences.
    """

    def __init__(
        self, fleet: Fleet, run_name: str, stream: str, err: Console, *, gather: bool = False
    ) -> None:
        self.run_name, self.stream, self.err = run_name, stream, err
        self.out = Console(file=stdout(), highlight=False, soft_wrap=True, emoji=False)
        self.states = {h.process_id: State.PENDING for h in fleet}
        self.hosts = {h.process_id: h for h in fleet}
        self.first = fleet.hosts[0].process_id  # host0: the first host (of --workers: its first)
        self.started = time.monotonic()
        self.heard: dict[int, float] = {}  # process id -> when it last printed (or started)
        self.live: Live | None = None
        self.quiet = False  # stdout went away (a closed pipe): stop writing host lines
        self._prefixes: dict[int, str] = {}  # process id -> its rendered prefix (a terminal)
        self.tty = self.out.is_terminal
        self._drawn = 0.0  # when a transfer last asked for a redraw
        self._spared = False  # whether the terminal was told Gloo's lines are kept from it
        # run --gather: every host's lines, identical ones once with their hosts
        self.gather = LiveGather(fleet.hosts, D.gather_window, D.gather_pending) if gather else None

    @functools.cached_property
    def staging(self) -> TransferView:
        """The code's staging, drawn only while the status line is live."""
        from multihost.cli.progress import TransferView

        return TransferView("staging code", len(self.hosts))

    @functools.cached_property
    def pulling(self) -> TransferView:
        """After the run, ``pull=``'s transfers, drawn only while the status line is live."""
        from multihost.cli.progress import TransferView

        return TransferView("pulling", len(self.hosts), per_host=True)

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
            if self.gather is not None and event.state.final:
                self.gather.ended(event.host)
            if self.live is not None:
                self.live.refresh()
        elif isinstance(event, Transfer):
            if self.live is None:  # no status line to draw it in
                return
            (self.pulling if event.what == "pull" else self.staging).update(event)
            now = time.monotonic()
            if self.live is not None and (now - self._drawn >= 0.1 or event.finished):
                self._drawn = now
                self.live.refresh()
        elif isinstance(event, Note):
            style = "bold red" if event.level == "error" else "dim"
            console = self.live.console if self.live is not None else self.err
            console.print(
                f"multihost: {event.text}",
                style=style,
                markup=False,
                highlight=False,
                soft_wrap=not console.is_terminal,  # a pipe or a log file: whole lines
            )

    def _host_line(self, event: Line) -> None:
        if self.gather is not None:
            now = time.monotonic()
            for text in event.texts:
                if not (self.tty and text.lstrip().startswith(RESULT_LINE)):
                    self._groups(self.gather.add(event.host, text, now))
            return
        if self.quiet or self.stream == "none":
            return
        if self.stream == "host0" and event.host.process_id != self.first:
            return
        host = event.host if self.stream == "all" else None
        try:
            if self.tty:  # above the live status line when there is one
                # the payload's MULTIHOST_RESULT line is for machines (logs, --json, the API);
                # the summary says it in words. Gloo's connection lines: in the logs only
                texts = [
                    t
                    for t in event.texts
                    if not t.lstrip().startswith(RESULT_LINE) and not terminal.noise(t)
                ]
                if len(texts) < len(event.texts) and not self._spared:
                    self._spare(event.texts)
                if not texts:
                    return
                block = terminal.safe_block(texts, self._prefix(host))
                if "\x1b" in block:  # a host's colour never reaches the status line
                    block = block[:-1] + "\x1b[0m\n"
                self.out.print(terminal.Raw(block), end="")
            else:  # a pipe or file: plain text, colour codes kept, nothing else
                prefix = f"[{host.name}] " if host else ""
                self.out.file.write(terminal.safe_block(event.texts, prefix))
        except BrokenPipeError:
            self.quiet = True

    def _spare(self, texts: Sequence[str]) -> None:
        """Say once that Gloo's connection lines are kept from the terminal (not the logs)."""
        if any(terminal.noise(t) for t in texts):
            self._spared = True
            self(Note("Gloo's connection lines are kept in the hosts' logs, not shown here"))

    def gathered(self, *, final: bool = False) -> None:
        """``--gather``: print the groups of lines that are due (``final``: every one held)."""
        if self.gather is not None:
            self._groups(self.gather.flush() if final else self.gather.due(time.monotonic()))

    def _groups(self, segments: list[Segment]) -> None:
        if self.quiet or not segments:
            return
        try:
            for seg in segments:
                block = terminal.safe_block(seg.lines, f"[{host_ranges(seg.hosts)}] ")
                if self.tty:
                    if "\x1b" in block:  # a host's colour never reaches the status line
                        block = block[:-1] + "\x1b[0m\n"
                    self.out.print(terminal.Raw(block), end="")
                else:
                    self.out.file.write(block)
        except BrokenPipeError:
            self.quiet = True

    def _prefix(self, host: Host | None) -> str:
        if host is None:
            return ""
        if host.process_id not in self._prefixes:
            self._prefixes[host.process_id] = terminal.ansi_prefix(host, self.out)
        return self._prefixes[host.process_id]

    def status(self) -> RenderableType:
        """The live status line; while code is being staged, the staging progress above it."""
        now = time.monotonic()
        silent = {
            self.hosts[pid]: now - t
            for pid, t in self.heard.items()
            if self.states[pid] is State.RUNNING and now - t >= SILENT_AFTER
        }
        line = report.status_line(self.run_name, self.states, now - self.started, silent)
        if self.pulling.started:
            return Group(self.pulling.renderable(), line)
        if self.staging.started and State.STAGING in self.states.values():
            return Group(self.staging.renderable(), line)
        return line


def raise_nofile_limit() -> None:
    """One file descriptor per connection: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def execute_run(
    run: Run | Attach,
    display: Display,
    *,
    what: str = "stopping every host",
    detach: bool = False,
) -> RunResult:
    """Run with the live status line (on a terminal) and signal handling; with ``detach``, a
    signal leaves the hosts alone and raises :class:`~multihost.bridge.Detached`."""

    async def go() -> RunResult:
        if display.gather is None:
            return await shown()
        ticker = asyncio.create_task(_gathering(display))
        try:
            return await shown()
        finally:
            ticker.cancel()
            display.gathered(final=True)

    async def shown() -> RunResult:
        console = display.live_console
        if console is not None:
            from rich.live import Live

            with Live(
                get_renderable=display.status,
                console=console,
                refresh_per_second=4,
                redirect_stdout=False,
                redirect_stderr=False,
                transient=True,
            ) as live:
                display.live = live
                try:
                    return await run.execute()
                finally:
                    display.live = None
        return await run.execute()

    left = (
        "jobs may still be running on the hosts (stop them with: "
        f"{kill_line(display.run_name, run.log_dir.parent)})"
    )
    return blocking(
        go,
        signals(
            display.err, None if detach else run.interrupt, what, run.request_stacks, left=left
        ),
    )


async def _gathering(display: Display) -> None:
    """``--gather``: the groups of lines whose window has passed, printed as they come due."""
    while True:
        await asyncio.sleep(GATHER_TICK)
        display.gathered()


def kill_line(run_name: str, logs: Path) -> str:
    """The command that stops a run on every host (``--log-dir`` when it is not the default)."""
    return run_line("kill", run_name, logs)


def run_line(command: str, run_name: str, logs: Path) -> str:
    """``multihost COMMAND RUN`` for a run whose logs are in ``logs``: ``--log-dir`` only
    when it is not the default one."""
    where = "" if logs == log_dir(None) else f" --log-dir {shlex.quote(str(logs))}"
    return f"multihost {command} {shlex.quote(run_name)}{where}"


def finish(result: RunResult, err: Console, n: int) -> int:
    """The summary table, the verdict, where the logs are; returns the exit code."""
    err.print(report.summary_table(result, all_hosts=n <= 32 or not result.ok))
    if result.staging is not None:
        err.print(report.staging_line(result.staging))
    for line in run_lines(result):  # where the start went; a payload's result in words
        err.print(line, markup=False, highlight=False)
    err.print(report.verdict(result))
    err.print(f"logs: {result.log_dir}", style="dim", markup=False, highlight=False)
    if result.stepped > 1 and result.log_dir is not None:  # the hook logged steps: a picture
        plot = run_line("plot", result.run_name, result.log_dir.parent)
        err.print(
            f"steps: {plot} draws the step times of all {result.stepped} hosts",
            style="dim",
            markup=False,
            highlight=False,
        )
    return result.exit_code


def signals(
    err: Console,
    stop: Callable[[], None] | None,
    what: str,
    stacks: Callable[[], None] | None = None,
    *,
    left: str | None = None,
) -> Interrupt:
    """A command's interrupt policy: Ctrl-C, SIGTERM and SIGHUP call ``stop`` (``what`` says
    what that does; no ``stop``: detach), a second one exits at once (``left`` says what it
    leaves behind), Ctrl-\\ takes stacks."""
    return Interrupt(
        stop,
        what,
        say=lambda text: err.print(text, style="bold red", markup=False, soft_wrap=True),
        signals=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
        exit_at_second=True,
        stacks=stacks,
        **({} if left is None else {"left": left}),
    )


def record_options(
    record: RunRecord, logs: str | Path | None, config: str | Path | None, **kw: object
) -> RunOptions:
    """A recorded run's options: its log dir (``--log-dir``), ``--ssh-config`` over its own."""
    from multihost.runs import past  # a past run's record (its env store comes with it)

    opts = past.options_from_record(record, log_dir(logs), **kw)
    if config is not None:
        opts = replace(opts, ssh=replace(opts.ssh, config=given_config(config)))
    return opts


def chosen_hosts(record: RunRecord, only: str | None, exclude: str | None) -> RunRecord:
    """The run's record with only the hosts ``--workers`` (``only``) and ``--exclude-workers``
    name (for what a command does on them; write back the whole record, never this one)."""
    fleet, subset = workers.select(record.fleet, only, exclude, whose=f"run {record.run_name}")
    if not subset:
        return record
    pids = {h.process_id for h in fleet}
    return replace(record, hosts=tuple(h for h in record.hosts if h.host.process_id in pids))
