"""The ``multihost`` argument parser, built from the settings schema (each shared flag is
declared once, in ``multihost.settings.schema``), and the config files as its defaults."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from multihost.bundled import PAYLOADS
from multihost.cli.job_args import add_job_parser
from multihost.cli.pods_args import add_pod_parsers, add_run_pod_flags
from multihost.defaults import DEFAULTS as D
from multihost.errors import UsageError
from multihost.settings import schema as s
from multihost.settings.flag import Item, OneOf
from multihost.settings.types import positive

if TYPE_CHECKING:
    from multihost.settings.layers import Resolved

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
CONFIGURED = (
    "run",
    "sweep",
    "hosts",
    "envs",
    "kill-stale",
    "forget",
    "config",
)  # commands that read it
_DEFAULT_NOTE = re.compile(r"\s*\(default(?:[^()]|%\(default\))*\)$")  # the flag's own note


class Parser(argparse.ArgumentParser):
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


class Version(argparse.Action):
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


def add(p: argparse.ArgumentParser | argparse._ActionsContainer, *items: Item) -> None:
    """Declare schema flags (and groups of exclusive ones) on a parser."""
    for item in items:
        if isinstance(item, OneOf):
            add(p.add_mutually_exclusive_group(required=item.required), *item.flags)
            continue
        kw: dict[str, Any] = {"help": item.help}
        if item.kind == "switch":
            kw["action"] = "store_true"
        elif item.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif item.kind == "append":
            kw["action"] = "append"
        elif item.kind == "optional":
            kw["nargs"], kw["const"] = "?", item.const
        if item.kind != "switch":
            kw["default"] = item.initial
        for name in ("type", "choices", "metavar"):
            if getattr(item, name) is not None:
                kw[name] = getattr(item, name)
        p.add_argument(item.option, **kw)


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
    add(run, *s.fleet())
    what = run.add_mutually_exclusive_group(required=True)
    add(what, s.CMD)
    what.add_argument(
        "--payload",
        choices=PAYLOADS,
        help="run a payload that ships with multihost: stages it (not --script-dir)"
        " and runs 'PYTHON NAME.py ARGS', the ARGS after --",
    )
    add(run, *s.RUN, s.RUN_NAME, *s.RUN_ONLY, s.DRY_RUN, s.DETACH)
    run.add_argument("args", nargs="*", metavar="ARG", help="after --: the --payload's arguments")
    add(run, s.PULL, s.PULL_TO)
    add_run_pod_flags(run)

    config = sub.add_parser(
        "config", help="the defaults in effect: config files, a --profile, flags; and where from"
    )
    add(config, *s.CONFIGURABLE, s.JSON.but(help="JSON instead of TOML-like lines"))

    hosts = sub.add_parser("hosts", help="print the resolved fleet (and --check each host)")
    add(hosts, *s.fleet(), s.JSON)
    hosts.add_argument(
        "--check", action="store_true", help="connect and report versions, disk, port"
    )
    add(
        hosts,
        s.REMOTE_DIR.but(help="where free disk is measured (default %(default)s)"),
        s.COORDINATOR_PORT.but(
            default=D.coordinator_port, help="port to probe (default %(default)s)"
        ),
    )

    envs = sub.add_parser(
        "envs", help="the locked environments each host holds: size, last use, which runs use them"
    )
    add(
        envs,
        *s.fleet(),
        s.REMOTE_DIR.but(help="where hosts keep them: DIR/envs (default %(default)s)"),
        s.JSON.but(help="the rows as JSON (whole keys, bytes, seconds)"),
    )

    add(sub.add_parser("kill-stale", help="stop processes holding accelerator devices"), *s.fleet())
    add(
        sub.add_parser("forget", help="forget recorded host keys (after re-creating VMs)"),
        *s.fleet(),
    )

    def run_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("run", metavar="RUN", help="run name (see multihost ls)")
        add(
            p,
            s.LOG_DIR,
            s.SSH_CONFIG.but(help="override the run's ssh config (default: the run's)"),
        )
        return p

    attach = run_command("attach", "follow a run again from where the local logs end")
    add(attach, s.STREAM, s.RECONNECT_TIMEOUT)
    attach.add_argument(
        "--stop-on-interrupt",
        action="store_true",
        help="Ctrl-C stops the run on every host (default: Ctrl-C detaches and the run goes on)",
    )
    status = run_command("status", "per-host state of a run")
    status.add_argument("--refresh", action="store_true", help="ask the hosts even if finished")
    add(status, s.JSON)
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
        help="every host's log, identical output shown once with its hosts (like "
        f"clush -b; the last {D.gather_lines} lines of each unless --tail)",
    )
    add(logs, s.JSON.but(help="with --gather: the groups as JSON"))
    pull = run_command("pull", "copy files or globs back from every host of a run")
    pull.add_argument(
        "paths",
        nargs="+",
        metavar="REMOTE_PATH",
        help="file, directory or glob on each host; relative to the run's work "
        "dir (where its command ran)",
    )
    pull.add_argument(
        "--to",
        type=Path,
        metavar="DIR",
        help="into DIR/slice_SSSS_worker_WWWW/ (default ./multihost-pull/RUN)",
    )
    pull.add_argument(
        "--limit",
        type=positive(int),
        default=D.pull_limit,
        metavar="N",
        help="hosts copying at once (default %(default)s)",
    )
    add(pull, s.JSON.but(help="per-host results as JSON"))
    stack = run_command("stack", "every host's Python stacks right now, grouped")
    stack.add_argument("--all", action="store_true", help="every thread, not only the main one")
    stack.add_argument(
        "--native",
        action="store_true",
        help="add C/C++ frames (py-spy on the hosts, if ptrace allows)",
    )
    add(stack, s.JSON.but(help="the groups as JSON"))
    trace = run_command("trace", "a jax.profiler trace of every JAX process of a running run")
    trace.add_argument(
        "--seconds",
        type=positive(float),
        default=D.trace_seconds,
        metavar="N",
        help="how long every process traces, from one common start (default %(default)s)",
    )
    trace.add_argument(
        "--name",
        metavar="NAME",
        help="the capture's folder under the run's traces/ (default: the time)",
    )
    add(trace, s.JSON.but(help="the per-host rows as JSON"))
    kill = run_command("kill", "stop a run on every host")
    kill.add_argument(
        "--signal",
        default="TERM",
        choices=("TERM", "INT", "HUP", "KILL", "USR1"),
        help="sent to each host's process group (default %(default)s)",
    )
    add(kill, s.GRACE.but(help="seconds before KILL (default %(default)g s)"))

    sweep = sub.add_parser("sweep", help="run a command over a grid of configs and rank them")
    add_run_pod_flags(sweep)
    add(
        sweep,
        *s.fleet(),
        s.CMD.but(help="command template with {name} fields (or cmd in --grid-file)"),
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
    add(
        sweep,
        *s.RUN,
        s.STAGE_VIA,
        s.STAGE_BUCKET,
        s.RUN_NAME.but(help="sweep name (default: sweep-<timestamp>-<random>)"),
    )

    add(sub.add_parser("ls", help="runs under the log dir"), s.LOG_DIR, s.JSON)
    clean = sub.add_parser(
        "clean",
        help="remove old finished runs, locally and on their hosts, and the staged code and "
        "environments no remaining run there uses",
    )
    clean.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 7d, 12h")
    add(clean, s.LOG_DIR, s.DRY_RUN.but(help="say what would be removed (asks the hosts which "
                                          "environments would go)"))  # fmt: skip
    add_job_parser(sub, positive, add)
    add_pod_parsers(sub, add)
    return parser


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of ``multihost NAME``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)


def argv_hints(argv: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    """The command, ``--profile`` and ``--script-dir`` from a command line, read before the
    parser exists (its defaults depend on them)."""
    command = argv[0] if argv and not argv[0].startswith("-") else None
    found: dict[str, str] = {}
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        for flag in ("--profile", "--script-dir"):
            if tok == flag and i + 1 < len(argv):
                found[flag] = argv[i + 1]
            elif tok.startswith(flag + "="):
                found[flag] = tok.split("=", 1)[1]
    return command, found.get("--profile"), found.get("--script-dir")


def apply(resolved: Resolved, parsers: Iterable[argparse.ArgumentParser]) -> None:
    """Make each configured value the default of its flag in ``parsers``,
    its help saying so. The fleet's source (hosts, local, prefix) is no default: ``parse``
    adds it when the command line names none."""
    for parser in parsers:
        for group in parser._mutually_exclusive_groups:
            if resolved.gives_source and any(a.dest in s.SOURCES for a in group._group_actions):
                group.required = False
        for action in parser._actions:
            key = action.dest.replace("_", "-")
            if key not in resolved.values or not action.option_strings:
                continue
            value, source = resolved.values[key]
            shown = " ".join(value) if isinstance(value, list) else value
            if action.help and action.help is not argparse.SUPPRESS:
                note = f"(default {shown}, from {source})".replace("%", "%%")
                action.help = f"{_DEFAULT_NOTE.sub('', action.help)} {note}"
            if key not in s.SOURCES:
                action.default = value


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, with the config files' values as the defaults (``args.config``)."""
    parser = build_parser()
    command, profile, script_dir = argv_hints(argv)
    resolved = None
    if command in CONFIGURED:
        from multihost.settings.layers import Resolved

        resolved = Resolved.load(Path(script_dir or "."), profile)
        apply(resolved, [subparser(parser, name) for name in CONFIGURED])
    args = parser.parse_args(argv)
    if resolved is not None:
        for key, value in resolved.source_for(vars(args)).items():
            if hasattr(args, key):
                setattr(args, key, value)
    args.config = resolved
    return args
