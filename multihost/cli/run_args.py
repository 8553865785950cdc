"""The arguments of the commands on a run after it started: attach, status, logs, pull,
stack, trace, top, plot, kill (no rich here: --help stays light)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multihost.cli.args import Parser, add, command
from multihost.defaults import DEFAULTS as D
from multihost.settings import schema as s
from multihost.settings.types import at_least, positive

SOME_HELP = (
    "only these hosts of the run: process indices (0,2 or 0-3), labels as multihost prints "
    "them (s0/w3, s0/w[0-3], s1 for all of slice 1) or all (default: all)"
)


def run_command(
    sub: Any, name: str, help: str, *, some: bool = False, latest: bool = True
) -> Parser:
    """A command on one recorded run; ``some``: it may act on some of its hosts only;
    ``latest``: RUN may be left out (the latest run). ``last`` names the latest run anywhere."""
    p = command(sub, name, help)
    if latest:
        p.add_argument(
            "run",
            metavar="RUN",
            nargs="?",
            default="last",
            help="run name (see multihost ls; default: last, the latest run)",
        )
    else:
        p.add_argument("run", metavar="RUN", help="run name (see multihost ls; last: the latest)")
    if some:
        add(p, s.WORKERS.but(help=SOME_HELP), s.EXCLUDE_WORKERS)
    add(p, s.LOG_DIR, s.SSH_CONFIG.but(help="override the run's ssh config (default: the run's)"))
    return p


RUN_COMMANDS = ("attach", "status", "logs", "pull", "stack", "trace", "top", "plot", "kill")


def add_run_commands(sub: Any) -> None:
    """The commands on one recorded run (:data:`RUN_COMMANDS`)."""
    attach = run_command(sub, "attach", "follow a run again from where the local logs end")
    add(attach, s.STREAM, s.GATHER, s.RECONNECT_TIMEOUT)
    attach.at("launch").add_argument(
        "--stop-on-interrupt",
        action="store_true",
        help="Ctrl-C stops the run on every host (default: Ctrl-C detaches and the run goes on)",
    )
    status = run_command(sub, "status", "per-host state of a run", some=True)
    status.at("connection").add_argument(
        "--refresh", action="store_true", help="ask the hosts even if finished"
    )
    add(status, s.JSON)
    _logs(run_command(sub, "logs", "bring a run's local logs up to date and print them", some=True))
    pull = "copy files or globs back from every host of a run"
    _pull(run_command(sub, "pull", pull, some=True, latest=False))  # RUN, then the paths
    stack = run_command(sub, "stack", "every host's Python stacks right now, grouped", some=True)
    out = stack.at("output")
    out.add_argument("--all", action="store_true", help="every thread, not only the main one")
    out.add_argument(
        "--native",
        action="store_true",
        help="add C/C++ frames (py-spy on the hosts, if ptrace allows)",
    )
    add(stack, s.JSON.but(help="the groups as JSON"))
    trace = run_command(sub, "trace", "a jax.profiler trace of every JAX process of a running run")
    out = trace.at("output")
    out.add_argument(
        "--seconds",
        type=positive(float),
        default=D.trace_seconds,
        metavar="N",
        help="how long every process traces, from one common start (default %(default)s)",
    )
    out.add_argument(
        "--name",
        metavar="NAME",
        help="the capture's folder under the run's traces/ (default: the time)",
    )
    add(trace, s.JSON.but(help="the per-host rows as JSON"))
    top = run_command(
        sub,
        "top",
        "every host of a running run, live: steps, step and own times, CPU, memory, "
        "accelerators, the straggler and stuck hosts",
        some=True,
    )
    out = top.at("output")
    out.add_argument(
        "--once",
        action="store_true",
        help="one snapshot (each host looked at twice, 1 s apart), then exit",
    )
    out.add_argument(
        "--interval",
        type=at_least(0.5),
        default=D.top_interval,
        metavar="S",
        help="seconds between looks at every host, 0.5 or more (default %(default)g)",
    )
    add(
        top,
        s.JSON.but(
            help="one snapshot as JSON (implies --once): every host's figures, straggler and stuck"
        ),
    )
    plot = run_command(
        sub, "plot", "every host's step times over a run as a picture (PNG)", some=True
    )
    plot.at("output").add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="where the PNG goes (default: steps.png in the run's log dir)",
    )
    kill = run_command(
        sub, "kill", "stop a run on every host (or on --workers)", some=True, latest=False
    )
    kill.at("launch").add_argument(
        "--signal",
        default="TERM",
        choices=("TERM", "INT", "HUP", "KILL", "USR1"),
        help="sent to each host's process group (default %(default)s)",
    )
    add(kill, s.GRACE.but(help="seconds before KILL (default %(default)g s)"))


def _logs(logs: Parser) -> None:
    which = logs.at("hosts").add_mutually_exclusive_group()
    which.add_argument("--host", metavar="sS/wW", help="print this host's log (default s0/w0)")
    which.add_argument(
        "--all",
        action="store_true",
        help="every host's log (or --workers'), each line prefixed [s0/w3]",
    )
    out = logs.at("output")
    out.add_argument(
        "--tail",
        type=positive(int),
        metavar="N",
        help="only the last N lines of each log (default: all)",
    )
    out.add_argument(
        "--grep",
        metavar="PATTERN",
        help="only lines matching this regular expression (default: all)",
    )
    out.add_argument(
        "--follow",
        action="store_true",
        help="follow every host's log (or --workers'); Ctrl-C stops following, not the run",
    )
    out.add_argument(
        "--gather",
        action="store_true",
        help="every host's log, identical output shown once with its hosts (like "
        f"clush -b; the last {D.gather_lines} lines of each unless --tail)",
    )
    add(logs, s.JSON.but(help="with --gather: the groups as JSON"))


def _pull(pull: Parser) -> None:
    pull.add_argument(
        "paths",
        nargs="+",
        metavar="REMOTE_PATH",
        help="file, directory or glob on each host; relative to the run's work "
        "dir (where its command ran)",
    )
    out = pull.at("output")
    out.add_argument(
        "--to",
        type=Path,
        metavar="DIR",
        help="into DIR/slice_SSSS_worker_WWWW/ (default ./multihost-pull/RUN)",
    )
    pull.at("connection").add_argument(
        "--limit",
        type=positive(int),
        default=D.pull_limit,
        metavar="N",
        help="hosts copying at once (default %(default)s)",
    )
    add(pull, s.JSON.but(help="per-host results as JSON"))
