"""The ``multihost`` command line: the parser is ``cli.parser``; each command lives in a
module of its own, imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from multihost.cli.parser import build_parser, parse, subparser
from multihost.errors import MultihostError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["COMMANDS", "build_parser", "command", "main", "parse", "subparser"]

# Each command's module is imported only when that command runs (start-up time is CPU time).
COMMANDS: dict[str, str] = {
    "run": "cli.fleet",
    "hosts": "cli.fleet",
    "kill-stale": "cli.fleet",
    "forget": "cli.fleet",
    "envs": "cli.fleet",
    "attach": "cli.runs",
    "status": "cli.runs",
    "ls": "cli.runs",
    "logs": "cli.runs",
    "kill": "cli.runs",
    "clean": "cli.runs",
    "sweep": "cli.sweep",
    "stack": "cli.diagnose",
    "trace": "cli.trace",
    "top": "cli.live",
    "plot": "cli.live",
    "job": "cli.job",
    "config": "cli.config",
    "pull": "cli.pull",
    "up": "cli.pods",
    "down": "cli.pods",
    "pods": "cli.pods",
    "gc": "cli.pods",
    "autodown": "cli.pods",
    "sandbox": "cli.sandbox",
}


def command(name: str) -> Callable[[argparse.Namespace, Console], int]:
    """The function behind ``multihost NAME``: ``cmd_<name>`` in its module of
    ``multihost.cli`` (``COMMANDS``)."""
    module = importlib.import_module(f"multihost.{COMMANDS[name]}")
    fn: Callable[[argparse.Namespace, Console], int] = getattr(
        module, f"cmd_{name.replace('-', '_')}"
    )
    return fn


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        check_text(argv)
        args = parse(argv)
        from rich.console import Console  # not needed for --help or a usage error

        err = Console(stderr=True, highlight=False, emoji=False)  # text as given: no :name: codes
        err.soft_wrap = not err.is_terminal  # a log file or a pipe gets whole lines
        _latest(args, err)
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


def _latest(args: argparse.Namespace, err: Console) -> None:
    """RUN ``last`` (or left out) on a command about one run: the latest run, said once."""
    if getattr(args, "run", None) != "last" or not hasattr(args, "log_dir"):
        return
    from multihost.runs.past import latest_run
    from multihost.settings.checks import log_dir

    logs = log_dir(args.log_dir)
    if (logs / "last").is_dir():  # a run recorded under that name before it was reserved
        return
    args.run = latest_run(logs)
    err.print(f"multihost: the latest run: {args.run}")


def check_text(argv: Sequence[str]) -> None:
    """Every argument must be UTF-8 text: a byte that is not (Python keeps it as a lone
    surrogate) would fail deep in the run, after staging, naming no argument."""
    for i, arg in enumerate(argv):
        try:
            arg.encode()
        except UnicodeEncodeError:
            name, value = "", arg
            if arg.startswith("--") and "=" in arg:  # --cmd=VALUE
                name, value = arg.split("=", 1)
            elif i and argv[i - 1].startswith("-") and "=" not in argv[i - 1]:  # --cmd VALUE
                name = argv[i - 1]
            shown = value.encode(errors="surrogateescape").decode(errors="backslashreplace")
            where = f"argument {name}: " if name else ""
            raise UsageError(f"{where}not UTF-8 text: '{shown}' (each argument must be)") from None


def _flush_quietly() -> None:
    """Flush stdout; a reader that went away (closed pipe) is not an error."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that says nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
