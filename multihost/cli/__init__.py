"""The ``multihost`` command line: argument parsing; each command lives in a cli_* module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from multihost.bundled import PAYLOADS
from multihost.cli.args import (
    EXAMPLES,
    Parser,
    Version,
    command_text,
    port,
    positive,
    remote_dir,
    size,
    stage_via,
)
from multihost.cli.job_args import add_job_parser
from multihost.defaults import DEFAULTS as D
from multihost.errors import MultihostError, UsageError
from multihost.sources import IP_MODES

if TYPE_CHECKING:
    from rich.console import Console


def _add_fleet_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--profile",
        metavar="NAME",
        help="defaults from this profile of the config files (see multihost config; default: none)",
    )
    where = p.add_mutually_exclusive_group(required=required)
    where.add_argument(
        "--hosts",
        metavar="LIST|FILE",
        help="comma list of [user@]host[:port] with ranges (h[0-3], "
        "10.0.0.[2-9]), a TOML inventory, or a file with one host per line",
    )
    where.add_argument(
        "--local", type=positive(int), metavar="N", help="N workers on this machine, no SSH"
    )
    where.add_argument("--prefix", help="Cloud TPU node or queued resource name")
    p.add_argument("--project", help="with --prefix: gcloud project (default: gcloud's)")
    p.add_argument("--zone", help="with --prefix: gcloud zone (default: gcloud's)")
    p.add_argument(
        "--ip",
        choices=IP_MODES,
        default="auto",
        help="with --prefix: address to connect to (default %(default)s: external if any)",
    )
    p.add_argument("--user", help="ssh user for every host (default: ssh config's, else yours)")
    p.add_argument(
        "--ssh-config", type=Path, metavar="FILE", help="ssh config file (default ~/.ssh/config)"
    )
    p.add_argument(
        "--host-keys",
        choices=("strict", "accept-new"),
        default=None,
        help="strict: known_hosts only; accept-new: trust on first use, refuse a changed key "
        "(default: strict, accept-new with --prefix)",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive(float),
        default=D.connect_timeout,
        metavar="S",
        help="seconds per SSH handshake (default %(default)g s)",
    )
    p.add_argument(
        "--connect-limit",
        type=positive(int),
        default=D.connect_limit,
        metavar="N",
        help="handshakes in flight at once (default %(default)s)",
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """What ``run`` and ``sweep`` share: code, env, logs, names, ports."""
    p.add_argument(
        "--script-dir",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="code to stage on every host (default: the current directory)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave out of the staged code (glob; 'dir/' for a directory; "
        "repeatable; default: none beyond .git, __pycache__, *.pyc)",
    )
    p.add_argument(
        "--max-stage-bytes",
        type=size,
        default=D.max_stage_bytes,
        metavar="BYTES",
        help=f"refuse a code dir bigger than this (K/M/G suffixes; default "
        f"{D.max_stage_bytes >> 30}G)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set in every host's environment (repeatable; default: none)",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="local logs (default $MULTIHOST_LOG_DIR or ~/multihost-logs)",
    )
    p.add_argument(
        "--remote-dir",
        type=remote_dir,
        default=D.remote_dir,
        metavar="DIR",
        help="staging base on each host (default %(default)s)",
    )
    p.add_argument(
        "--grace",
        type=positive(float),
        default=D.grace,
        metavar="S",
        help="seconds between TERM and KILL when stopping (default %(default)g s)",
    )
    p.add_argument(
        "--coordinator-port",
        type=port,
        default=None,
        metavar="PORT",
        help=f"JAX coordinator port on host 0 (default {D.coordinator_port}; "
        "with --local a free port)",
    )
    p.add_argument(
        "--megascale-port",
        type=port,
        default=D.megascale_port,
        metavar="PORT",
        help="Megascale port with several slices (default %(default)s)",
    )
    p.add_argument(
        "--kill-stale",
        action=argparse.BooleanOptionalAction,
        help="stop accelerator device holders before launching (default: warn with --prefix)",
    )
    p.add_argument(
        "--record-env",
        action=argparse.BooleanOptionalAction,
        help="keep --env values in run.json (default: their names only; they may be secrets)",
    )
    _add_hang_args(p)


def _add_hang_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hang-timeout", type=positive(float), metavar="S",
                   help="when no host prints for S seconds: take every host's stacks, name the "
                   "stragglers, then stop the run (exit 1) (default: never)")  # fmt: skip
    p.add_argument("--on-hang", choices=("stop", "report"), default="stop",
                   help="after a hang: stop, or only report (default %(default)s)")  # fmt: skip


def _add_run_only_args(p: argparse.ArgumentParser) -> None:
    """What ``run`` has beyond ``sweep`` (and ``config`` shows)."""
    p.add_argument(
        "--stream",
        choices=("host0", "all", "none"),
        default="host0",
        help="host output on the terminal (default %(default)s)",
    )
    p.add_argument(
        "--fail-fast",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop the other hosts when one fails (default: yes; --no-fail-fast keeps them "
        "running)",
    )
    p.add_argument(
        "--timeout",
        type=positive(float),
        metavar="S",
        help="bound the whole run, in seconds (default: none)",
    )
    p.add_argument(
        "--reconnect-timeout",
        type=positive(float),
        default=D.reconnect_timeout,
        metavar="S",
        help="seconds to retry a lost host (default %(default)g s)",
    )
    p.add_argument(
        "--stage-via",
        type=stage_via,
        default=D.stage_via,
        metavar="HOW",
        help="how the code reaches the hosts: direct (from here to each), peer (once per "
        "slice to a seed host, the others fetch it from there) or gs://BUCKET[/PREFIX] "
        "(uploaded once, the hosts pull it); default %(default)s",
    )
    p.add_argument(
        "--python",
        metavar="EXE",
        help="interpreter for --payload (default: python3; with --local this Python)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="multihost",
        description="Run one command on every host of a multi-host accelerator job, all at once.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    run = sub.add_parser("run", help="stage code and run a command on every host at once")
    _add_fleet_args(run)
    what = run.add_mutually_exclusive_group(required=True)
    what.add_argument("--cmd", type=command_text, help="command to run under sh -c on every host")
    what.add_argument(
        "--payload",
        choices=PAYLOADS,
        help="run a payload that ships with multihost: stages it (not --script-dir) and runs "
        "'PYTHON NAME.py ARGS', the ARGS after --",
    )
    _add_run_args(run)
    run.add_argument(
        "--run-name",
        metavar="NAME",
        help="default: a timestamp and a random suffix, e.g. 20250101-120000-3f9a0c",
    )
    _add_run_only_args(run)
    run.add_argument("--dry-run", action="store_true", help="print each host's command and env")
    run.add_argument(
        "--detach",
        action="store_true",
        help="exit once every host has started; follow later with attach",
    )
    run.add_argument("args", nargs="*", metavar="ARG", help="after --: the --payload's arguments")

    config = sub.add_parser(
        "config", help="the defaults in effect: config files, a --profile, flags; and where from"
    )
    _add_fleet_args(config, required=False)
    _add_run_args(config)
    _add_run_only_args(config)
    config.add_argument("--json", action="store_true", help="JSON instead of TOML-like lines")
    run.add_argument("--pull", action="append", default=[], metavar="REMOTE_PATH",
                     help="after the run, whatever its outcome, copy this path or glob back "
                     "from every host (repeatable; see multihost pull; default: none)")  # fmt: skip
    run.add_argument("--pull-to", type=Path, metavar="DIR",
                     help="where --pull copies to (default ./multihost-pull/RUN)")  # fmt: skip

    hosts = sub.add_parser("hosts", help="print the resolved fleet (and --check each host)")
    _add_fleet_args(hosts)
    hosts.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    hosts.add_argument(
        "--check", action="store_true", help="connect and report versions, disk, port"
    )
    hosts.add_argument(
        "--remote-dir",
        type=remote_dir,
        default=D.remote_dir,
        metavar="DIR",
        help="where free disk is measured (default %(default)s)",
    )
    hosts.add_argument(
        "--coordinator-port",
        type=port,
        default=D.coordinator_port,
        metavar="PORT",
        help="port to probe (default %(default)s)",
    )

    stale = sub.add_parser("kill-stale", help="stop processes holding accelerator devices")
    _add_fleet_args(stale)

    forget = sub.add_parser("forget", help="forget recorded host keys (after re-creating VMs)")
    _add_fleet_args(forget)

    def run_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("run", metavar="RUN", help="run name (see multihost ls)")
        p.add_argument(
            "--log-dir",
            type=Path,
            default=None,
            metavar="DIR",
            help="local logs (default $MULTIHOST_LOG_DIR or ~/multihost-logs)",
        )
        p.add_argument(
            "--ssh-config",
            type=Path,
            metavar="FILE",
            help="override the run's ssh config (default: the run's)",
        )
        return p

    attach = run_command("attach", "follow a run again from where the local logs end")
    attach.add_argument(
        "--stream",
        choices=("host0", "all", "none"),
        default="host0",
        help="host output on the terminal (default %(default)s)",
    )
    attach.add_argument(
        "--reconnect-timeout",
        type=positive(float),
        default=D.reconnect_timeout,
        metavar="S",
        help="seconds to retry a lost host (default %(default)g s)",
    )
    attach.add_argument(
        "--stop-on-interrupt",
        action="store_true",
        help="Ctrl-C stops the run on every host (default: Ctrl-C detaches and the run goes on)",
    )
    status = run_command("status", "per-host state of a run")
    status.add_argument("--refresh", action="store_true", help="ask the hosts even if finished")
    status.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    logs = run_command("logs", "bring a run's local logs up to date and print them")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--host", metavar="sS/wW", help="print this host's log (default s0/w0)")
    which.add_argument(
        "--all", action="store_true", help="every host's log, each line prefixed [s0/w3]"
    )
    logs.add_argument(
        "--tail",
        type=positive(int),
        metavar="N",
        help="only the last N lines of each log (default: all)",
    )
    logs.add_argument(
        "--grep",
        metavar="PATTERN",
        help="only lines matching this regular expression (default: all)",
    )
    logs.add_argument(
        "--follow",
        action="store_true",
        help="follow every host's log; Ctrl-C stops following, not the run",
    )
    logs.add_argument(
        "--gather",
        action="store_true",
        help="every host's log, identical output shown once with its hosts (like clush -b; "
        f"the last {D.gather_lines} lines of each unless --tail)",
    )
    logs.add_argument("--json", action="store_true", help="with --gather: the groups as JSON")
    pull = run_command("pull", "copy files or globs back from every host of a run")
    pull.add_argument("paths", nargs="+", metavar="REMOTE_PATH",
                      help="file, directory or glob on each host; relative to the run's work "
                      "dir (where its command ran)")  # fmt: skip
    pull.add_argument(
        "--to",
        type=Path,
        metavar="DIR",
        help="into DIR/slice_SSSS_worker_WWWW/ (default ./multihost-pull/RUN)",
    )
    pull.add_argument("--limit", type=positive(int), default=D.pull_limit, metavar="N",
                      help="hosts copying at once (default %(default)s)")  # fmt: skip
    pull.add_argument("--json", action="store_true", help="per-host results as JSON")
    stack = run_command("stack", "every host's Python stacks right now, grouped")
    stack.add_argument("--all", action="store_true", help="every thread, not only the main one")
    stack.add_argument("--native", action="store_true",
                       help="add C/C++ frames (py-spy on the hosts, if ptrace allows)")  # fmt: skip
    stack.add_argument("--json", action="store_true", help="the groups as JSON")
    trace = run_command("trace", "a jax.profiler trace of every JAX process of a running run")
    trace.add_argument("--seconds", type=positive(float), default=D.trace_seconds, metavar="N",
                       help="how long every process traces, from one common start "
                       "(default %(default)s)")  # fmt: skip
    trace.add_argument(
        "--name",
        metavar="NAME",
        help="the capture's folder under the run's traces/ (default: the time)",
    )
    trace.add_argument("--json", action="store_true", help="the per-host rows as JSON")
    kill = run_command("kill", "stop a run on every host")
    kill.add_argument(
        "--signal",
        default="TERM",
        choices=("TERM", "INT", "HUP", "KILL", "USR1"),
        help="sent to each host's process group (default %(default)s)",
    )
    kill.add_argument(
        "--grace",
        type=positive(float),
        default=D.grace,
        metavar="S",
        help="seconds before KILL (default %(default)g s)",
    )

    sweep = sub.add_parser("sweep", help="run a command over a grid of configs and rank them")
    _add_fleet_args(sweep)
    sweep.add_argument(
        "--cmd",
        type=command_text,
        help="command template with {name} fields (or cmd in --grid-file)",
    )
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="one axis of the grid (repeatable; default: none)",
    )
    sweep.add_argument(
        "--grid-file",
        type=Path,
        metavar="FILE",
        help="TOML with a [grid] table and optional where/cmd/metric (default: none)",
    )
    sweep.add_argument(
        "--where", help="keep points where this expression holds, e.g. 'a*b == 8' (default: all)"
    )
    sweep.add_argument("--metric", help="result field to rank by (default tflops_per_device)")
    sweep.add_argument("--minimize", action="store_true", help="smaller metric is better")
    sweep.add_argument(
        "--repeat",
        type=positive(int),
        default=1,
        metavar="N",
        help="runs per point (default %(default)s)",
    )
    sweep.add_argument(
        "--point-timeout",
        type=positive(float),
        metavar="S",
        help="seconds per point (default: none)",
    )
    sweep.add_argument(
        "--resume", action="store_true", help="skip points already ok (needs --run-name)"
    )
    sweep.add_argument(
        "--parallel",
        default="none",
        metavar="slice|hosts:K",
        help="points at once: one per slice or K-host group (default: one)",
    )
    _add_run_args(sweep)
    sweep.add_argument(
        "--run-name", metavar="NAME", help="sweep name (default: sweep-<timestamp>-<random>)"
    )

    ls = sub.add_parser("ls", help="runs under the log dir")
    ls.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="local logs (default $MULTIHOST_LOG_DIR or ~/multihost-logs)",
    )
    ls.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    clean = sub.add_parser("clean", help="remove old finished runs, locally and on their hosts")
    clean.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 7d, 12h")
    clean.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="local logs (default $MULTIHOST_LOG_DIR or ~/multihost-logs)",
    )
    clean.add_argument("--dry-run", action="store_true", help="say what would be removed")
    add_job_parser(sub, positive)
    return parser


# Each command's module is imported only when that command runs (start-up time is CPU time).
COMMANDS: dict[str, str] = {
    "run": "cli.fleet", "hosts": "cli.fleet", "kill-stale": "cli.fleet", "forget": "cli.fleet",
    "attach": "cli.runs", "status": "cli.runs", "ls": "cli.runs", "logs": "cli.runs",
    "kill": "cli.runs", "clean": "cli.runs", "sweep": "cli.sweep", "stack": "cli.diagnose",
    "trace": "cli.trace",
    "job": "cli.job", "config": "cli.config", "pull": "cli.pull",
}  # fmt: skip


def command(name: str) -> Callable[[argparse.Namespace, Console], int]:
    """The function behind ``multihost NAME``: ``cmd_<name>`` in its cli_* module."""
    module = importlib.import_module(f"multihost.{COMMANDS[name]}")
    fn: Callable[[argparse.Namespace, Console], int] = getattr(
        module, f"cmd_{name.replace('-', '_')}"
    )
    return fn


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of ``multihost NAME``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, with the config files' values as the defaults (``args.config``)."""
    from multihost.cli import config as cfg

    parser = build_parser()
    found = cfg.read_config(argv)
    resolved = None if found is None else cfg.Resolved.of(found, subparser(parser, "config"))
    if resolved is not None:
        cfg.apply(resolved, [subparser(parser, name) for name in cfg.CONFIGURED])
    args = parser.parse_args(argv)
    if resolved is not None:
        cfg.fill_source(args, resolved)
    args.config = resolved
    return args


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
        from rich.console import Console  # not needed for --help or a usage error

        err = Console(stderr=True, highlight=False)
        err.soft_wrap = not err.is_terminal  # a log file or a pipe gets whole lines
        code = command(args.command)(args, err)
    except UsageError as exc:
        print(f"multihost: error: {exc}", file=sys.stderr)
        code = 2
    except MultihostError as exc:
        print(f"multihost: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # e.g. `multihost run --dry-run | head -1`: exit quietly
        code = 0
    _flush_quietly()
    sys.exit(code)


def _flush_quietly() -> None:
    """Flush stdout; a reader that went away (closed pipe) is not an error."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that says nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
