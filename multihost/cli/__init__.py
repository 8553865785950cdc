"""The ``multihost`` command line: argument parsing; each command lives in a cli_* module."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from multihost.defaults import DEFAULTS as D
from multihost.errors import MultihostError, UsageError
from multihost.sources import IP_MODES

if TYPE_CHECKING:
    from rich.console import Console


EXAMPLES = """\
examples:
  multihost run --local 4 --cmd "python payloads/shardings.py -d 512 -b 128"
  multihost run --hosts 'h[0-3]' --script-dir . --cmd "python train.py"
  multihost run --hosts fleet.toml --detach --cmd "python train.py"   # then: attach, logs, kill
  multihost logs RUN --all --tail 20
  multihost hosts --prefix myqr --check

'multihost COMMAND --help' shows a command's options.
"""
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --lcoal is a typo, not --local
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line and exit 2, never the usage dump."""
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Unknown options are reported as such, before any missing required one."""
        tokens = list(sys.argv[1:] if args is None else args)
        for tok in tokens:
            if tok == "--":
                break
            if not tok.startswith("-") or tok == "-" or _NEGATIVE.match(tok):
                if self._subparsers is not None:
                    break  # the command's own parser checks the rest
                continue
            name = tok.split("=", 1)[0]
            if name not in self._option_string_actions:
                close = difflib.get_close_matches(name, list(self._option_string_actions), 1, 0.75)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.error(f"unknown option {name}{hint}")
        return super().parse_known_args(tokens, namespace)


class _Version(argparse.Action):
    """``--version``, read from the installed metadata only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"multihost {version('multihost')}")
        except PackageNotFoundError:
            print("multihost (not installed)")
        parser.exit()


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (1-65535): {text!r}")
    return int(text)


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"not a size in bytes (e.g. 2G): {text!r}")
    return int(digits) * scale


def _command(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the command is empty")
    return text


def _remote_dir(text: str) -> str:
    """A directory for staged code and runs on each host: never empty or ``/``."""
    if not text.strip().strip("/") or "\n" in text:
        raise argparse.ArgumentTypeError(f"must name a directory, e.g. ~/.multihost: {text!r}")
    return text


def _add_fleet_args(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--hosts",
        metavar="LIST|FILE",
        help="comma list of [user@]host[:port] with ranges (h[0-3], "
        "10.0.0.[2-9]), a TOML inventory, or a file with one host per line",
    )
    where.add_argument(
        "--local", type=_positive(int), metavar="N", help="N workers on this machine, no SSH"
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
        type=_positive(float),
        default=D.connect_timeout,
        metavar="S",
        help="seconds per SSH handshake (default %(default)g s)",
    )
    p.add_argument(
        "--connect-limit",
        type=_positive(int),
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
        type=_size,
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
        type=_remote_dir,
        default=D.remote_dir,
        metavar="DIR",
        help="staging base on each host (default %(default)s)",
    )
    p.add_argument(
        "--grace",
        type=_positive(float),
        default=D.grace,
        metavar="S",
        help="seconds between TERM and KILL when stopping (default %(default)g s)",
    )
    p.add_argument(
        "--coordinator-port",
        type=_port,
        default=None,
        metavar="PORT",
        help=f"JAX coordinator port on host 0 (default {D.coordinator_port}; "
        "with --local a free port)",
    )
    p.add_argument(
        "--megascale-port",
        type=_port,
        default=D.megascale_port,
        metavar="PORT",
        help="Megascale port with several slices (default %(default)s)",
    )
    p.add_argument(
        "--kill-stale",
        action="store_true",
        help="stop accelerator device holders before launching (default: warn with --prefix)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="multihost",
        description="Run one command on every host of a multi-host accelerator job, all at once.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="stage code and run a command on every host at once")
    _add_fleet_args(run)
    run.add_argument(
        "--cmd", type=_command, required=True, help="command to run under sh -c on every host"
    )
    _add_run_args(run)
    run.add_argument(
        "--run-name",
        metavar="NAME",
        help="default: a timestamp and a random suffix, e.g. 20250101-120000-3f9a",
    )
    run.add_argument(
        "--stream",
        choices=("host0", "all", "none"),
        default="host0",
        help="host output on the terminal (default %(default)s)",
    )
    run.add_argument(
        "--no-fail-fast",
        dest="fail_fast",
        action="store_false",
        help="keep the other hosts running when one fails (default: stop them)",
    )
    run.add_argument(
        "--timeout",
        type=_positive(float),
        metavar="S",
        help="bound the whole run, in seconds (default: none)",
    )
    run.add_argument(
        "--reconnect-timeout",
        type=_positive(float),
        default=D.reconnect_timeout,
        metavar="S",
        help="seconds to retry a lost host (default %(default)g s)",
    )
    run.add_argument("--dry-run", action="store_true", help="print each host's command and env")
    run.add_argument(
        "--detach",
        action="store_true",
        help="exit once every host has started; follow later with attach",
    )

    hosts = sub.add_parser("hosts", help="print the resolved fleet (and --check each host)")
    _add_fleet_args(hosts)
    hosts.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    hosts.add_argument(
        "--check", action="store_true", help="connect and report versions, disk, port"
    )
    hosts.add_argument(
        "--remote-dir",
        type=_remote_dir,
        default=D.remote_dir,
        metavar="DIR",
        help="where free disk is measured (default %(default)s)",
    )
    hosts.add_argument(
        "--coordinator-port",
        type=_port,
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
        type=_positive(float),
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
        type=_positive(int),
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
    kill = run_command("kill", "stop a run on every host")
    kill.add_argument(
        "--signal",
        default="TERM",
        choices=("TERM", "INT", "HUP", "KILL", "USR1"),
        help="sent to each host's process group (default %(default)s)",
    )
    kill.add_argument(
        "--grace",
        type=_positive(float),
        default=D.grace,
        metavar="S",
        help="seconds before KILL (default %(default)g s)",
    )

    sweep = sub.add_parser("sweep", help="run a command over a grid of configs and rank them")
    _add_fleet_args(sweep)
    sweep.add_argument(
        "--cmd", type=_command, help="command template with {name} fields (or cmd in --grid-file)"
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
        type=_positive(int),
        default=1,
        metavar="N",
        help="runs per point (default %(default)s)",
    )
    sweep.add_argument(
        "--point-timeout",
        type=_positive(float),
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
    return parser


# Each command's module is imported only when that command runs (start-up time is CPU time).
COMMANDS: dict[str, str] = {
    "run": "cli.fleet", "hosts": "cli.fleet", "kill-stale": "cli.fleet", "forget": "cli.fleet",
    "attach": "cli.runs", "status": "cli.runs", "ls": "cli.runs", "logs": "cli.runs",
    "kill": "cli.runs", "clean": "cli.runs", "sweep": "cli.sweep",
}  # fmt: skip


def command(name: str) -> Callable[[argparse.Namespace, Console], int]:
    """The function behind ``multihost NAME``: ``cmd_<name>`` in its cli_* module."""
    module = importlib.import_module(f"multihost.{COMMANDS[name]}")
    fn: Callable[[argparse.Namespace, Console], int] = getattr(
        module, f"cmd_{name.replace('-', '_')}"
    )
    return fn


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        args = build_parser().parse_args(argv)
        from rich.console import Console  # not needed for --help or a usage error

        code = command(args.command)(args, Console(stderr=True, highlight=False))
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
