"""The ``multihost`` command line: argument parsing; each command lives in a cli_* module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from multihost.cli_job import add_job_parser
from multihost.errors import MultihostError, UsageError
from multihost.tpu import IP_MODES


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


def _remote_dir(text: str) -> str:
    """A directory for staged code and runs on each host: never empty or ``/``."""
    if not text.strip().strip("/") or "\n" in text:
        raise argparse.ArgumentTypeError(f"must name a directory, e.g. ~/.multihost: {text!r}")
    return text


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
    parser = _Parser(
        prog="multihost",
        description="Run one command on every host of a multi-host accelerator job, all at once.",
    )
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
    run.add_argument(
        "--remote-dir", type=_remote_dir, default="~/.multihost", help="staging base on each host"
    )
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
    hosts.add_argument("--remote-dir", type=_remote_dir, default="~/.multihost")
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
    sweep.add_argument("--remote-dir", type=_remote_dir, default="~/.multihost")
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
    add_job_parser(sub, _positive)
    return parser


# Each command's module is imported only when that command runs (start-up time is CPU time).
COMMANDS: dict[str, str] = {
    "run": "cli_fleet", "hosts": "cli_fleet", "kill-stale": "cli_fleet", "forget": "cli_fleet",
    "attach": "cli_runs", "status": "cli_runs", "ls": "cli_runs", "logs": "cli_runs",
    "kill": "cli_runs", "clean": "cli_runs", "sweep": "cli_sweep",
    "job": "cli_job",
}  # fmt: skip


def command(name: str) -> Callable[[argparse.Namespace, Console], int]:
    """The function behind ``multihost NAME``: ``cmd_<name>`` in its cli_* module."""
    module = importlib.import_module(f"multihost.{COMMANDS[name]}")
    fn: Callable[[argparse.Namespace, Console], int] = getattr(
        module, f"cmd_{name.replace('-', '_')}"
    )
    return fn


def main(argv: Sequence[str] | None = None) -> NoReturn:
    err = Console(stderr=True, highlight=False)
    try:
        args = build_parser().parse_args(argv)
        code = command(args.command)(args, err)
    except UsageError as exc:
        print(f"multihost: error: {exc}", file=sys.stderr)
        code = 2
    except MultihostError as exc:
        print(f"multihost: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
