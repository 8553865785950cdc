"""The ``multihost`` argument parser, built from the settings schema (each shared flag is
declared once, in ``multihost.settings.schema``), and the config files as its defaults."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.cli.args import Parser, add, command
from multihost.cli.job_args import add_job_parser
from multihost.cli.pods_args import POD_COMMANDS, add_pod_parsers
from multihost.cli.run_args import RUN_COMMANDS, add_run_commands
from multihost.defaults import DEFAULTS as D
from multihost.settings import schema as s
from multihost.settings.types import positive
from multihost.staging.bundled import PAYLOADS

if TYPE_CHECKING:
    from multihost.settings.layers import Resolved

EXAMPLES = """\
examples:
  multihost run --local 4 --cmd "python payloads/shardings.py -d 512 -b 128"
  multihost run --hosts 'h[0-3]' --script-dir . --cmd "python train.py"
  multihost run --hosts fleet.toml --detach --cmd "python train.py"
  multihost logs RUN --all --tail 20
  multihost hosts --prefix myqr --check

'multihost COMMAND --help': its options under headings, and examples.
"""
CONFIGURED = (
    "run",
    "sweep",
    "hosts",
    "envs",
    "kill-stale",
    "forget",
    "config",
    "up",
    "pods",
    "autodown",
    "job",
)  # commands that read it (up, pods, autodown: a pod and its workers; job: job submit)
# What a profile says of a pod to make: on run and sweep (and up), what --up (up) makes a pod
# of, said in --help but no default there: a configured --tpu-type must not make every run
# want a pod. The library layers them under what is given (multihost.api.pods).
MAKING = frozenset(f.name for f in s.flags_of(s.POD))
NOTED_ONLY = {"run": MAKING, "sweep": MAKING, "up": MAKING | {"zone", "project"}}
_DEFAULT_NOTE = re.compile(r"\s*\(default(?:[^()]|%\(default\))*\)$")  # the flag's own note


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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only`` (a command's name), only that command's parser is built
    below the top one (with the commands built alongside it): building every command's flags
    costs more start-up CPU than a run's own parsing."""
    parser = Parser(
        prog="multihost",
        description="Run one command on every host of a multi-host accelerator job, all at once.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--version", action=Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for names, build in BUILDERS:
        if only is None or only in names:
            build(sub)
    return parser


def _run(sub: Any) -> None:
    run = command(sub, "run", "stage code and run a command on every host at once")
    add(run, *s.fleet(), *s.SUBSET)
    what = run.at("launch").add_mutually_exclusive_group(required=True)
    add(what, s.CMD)
    what.add_argument(
        "--payload",
        choices=PAYLOADS,
        help="run a payload that ships with multihost: stages it (not --script-dir)"
        " and runs 'PYTHON NAME.py ARGS', the ARGS after --",
    )
    add(run, *s.RUN, s.RUN_NAME, *s.RUN_ONLY, s.GATHER, s.DRY_RUN, s.DETACH)
    run.add_argument("args", nargs="*", metavar="ARG", help="after --: the --payload's arguments")
    add(run, s.PULL, s.PULL_TO, *s.POD_AROUND)


def _config(sub: Any) -> None:
    config = command(
        sub, "config", "the defaults in effect: config files, a --profile, flags; and where from"
    )
    add(config, *s.CONFIGURABLE, s.JSON.but(help="JSON instead of TOML-like lines"))


def _fleet_commands(sub: Any) -> None:
    hosts = command(sub, "hosts", "print the resolved fleet (and --check each host)")
    add(hosts, *s.fleet(), *s.SUBSET, s.JSON)
    hosts.at("connection").add_argument(
        "--check", action="store_true", help="connect and report versions, disk, port"
    )
    add(
        hosts,
        s.REMOTE_DIR.but(help="where free disk is measured (default %(default)s)"),
        s.COORDINATOR_PORT.but(
            default=D.coordinator_port, help="port to probe (default %(default)s)"
        ),
    )

    envs = command(
        sub, "envs", "the locked environments each host holds: size, last use, which runs use them"
    )
    add(
        envs,
        *s.fleet(),
        *s.SUBSET,
        s.REMOTE_DIR.but(help="where hosts keep them: DIR/envs (default %(default)s)"),
        s.JSON.but(help="the rows as JSON (whole keys, bytes, seconds)"),
    )
    add(
        command(sub, "kill-stale", "stop processes holding accelerator devices"),
        *s.fleet(),
        *s.SUBSET,
    )
    add(
        command(sub, "forget", "forget recorded host keys (after re-creating VMs)"),
        *s.fleet(),
        *s.SUBSET,
    )


def _runs(sub: Any) -> None:
    add(command(sub, "ls", "runs under the log dir"), s.LOG_DIR, s.JSON)
    clean = command(
        sub,
        "clean",
        "remove old finished runs, locally and on their hosts, and the staged code and "
        "environments no remaining run there uses; or the hosts' compile caches",
    )
    clean.at("launch").add_argument(
        "--older-than",
        metavar="AGE",
        help="runs finished before AGE ago, e.g. 7d, 12h (default: none; needed unless "
        "--compile-caches)",
    )
    clean.at("launch").add_argument(
        "--compile-caches",
        action="store_true",
        help="remove the compile cache (REMOTE_DIR/compile-cache) of every host a run in the "
        "log dir used, whatever its age (default: kept)",
    )
    add(
        clean,
        s.LOG_DIR,
        s.DRY_RUN.but(
            help="say what would be removed (asks the hosts which environments would go)"
        ),
    )


def _sweep(sub: Any) -> None:
    sweep = command(sub, "sweep", "run a command over a grid of configs and rank them")
    add(sweep, *s.POD_AROUND)
    add(
        sweep,
        *s.fleet(),
        *s.SUBSET,
        s.CMD.but(help="command template with {name} fields (or cmd in --grid-file)"),
    )
    grid = sweep.at("sweep")
    grid.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="one axis of the grid (repeatable; default: none)",
    )
    grid.add_argument(
        "--grid-file",
        type=Path,
        metavar="FILE",
        help="TOML with a [grid] table and optional where/cmd/metric (default: none)",
    )
    grid.add_argument(
        "--where", help="keep points where this expression holds, e.g. 'a*b == 8' (default: all)"
    )
    grid.add_argument("--metric", help="result field to rank by (default tflops_per_device)")
    grid.add_argument("--minimize", action="store_true", help="smaller metric is better")
    grid.add_argument(
        "--repeat",
        type=positive(int),
        default=1,
        metavar="N",
        help="runs per point (default %(default)s)",
    )
    grid.add_argument(
        "--point-timeout",
        type=positive(float),
        metavar="S",
        help="seconds per point (default: none)",
    )
    grid.add_argument(
        "--resume", action="store_true", help="skip points already ok (needs --run-name)"
    )
    grid.add_argument(
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
        s.SECRET,
        s.PULL,
        s.PULL_TO.but(
            help="where --pull copies to, DIR/POINT/s0/w2 (default ./multihost-pull/SWEEP)"
        ),
        *s.SWEEP,
    )


def _sandbox(sub: Any) -> None:
    sandbox = command(
        sub, "sandbox", "try multihost without a cloud: loopback hosts and a stand-in Cloud TPU"
    )
    ssub = sandbox.add_subparsers(dest="sandbox_command", required=True, parser_class=Parser)
    up = command(
        ssub,
        "up",
        "start N loopback hosts (sshds run as you, no root) and the stand-in cloud",
        under="sandbox",
    )
    up.at("hosts").add_argument(
        "--hosts",
        type=positive(int),
        default=D.sandbox_hosts,
        metavar="N",
        help="loopback hosts, on 127.0.0.2 and up (default %(default)s, at most 64)",
    )
    up.at("connection").add_argument(
        "--sshd",
        metavar="PATH",
        help="the OpenSSH server to run (default: sshd on PATH, else in /usr/sbin)",
    )
    command(
        ssub,
        "env",
        "print the export lines that point gcloud and multihost at the sandbox",
        under="sandbox",
    )
    command(ssub, "down", "stop everything the sandbox started and remove its dir", under="sandbox")


# Each builder and the commands it adds, in the order ``multihost --help`` lists them.
BUILDERS: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("run",), _run),
    (("config",), _config),
    (("hosts", "envs", "kill-stale", "forget"), _fleet_commands),
    (RUN_COMMANDS, add_run_commands),
    (("sweep",), _sweep),
    (("ls", "clean"), _runs),
    (("job",), add_job_parser),
    (POD_COMMANDS, add_pod_parsers),
    (("sandbox",), _sandbox),
)


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


def apply(
    resolved: Resolved,
    parsers: Iterable[argparse.ArgumentParser],
    noted_only: frozenset[str] = frozenset(),
) -> None:
    """Make each configured value the default of its flag in ``parsers``,
    its help saying so. The fleet's source (hosts, local, prefix) is no default: ``parse``
    adds it when the command line names none; nor are ``noted_only`` keys (only said)."""
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
            if isinstance(value, tuple):  # --zones A,B
                shown = ",".join(value)
            main = action.option_strings[0] == f"--{key}"  # not --spot for --capacity
            if main and action.help and action.help is not argparse.SUPPRESS:
                note = f"(default {shown}, from {source})".replace("%", "%%")
                if key in noted_only and parser.prog.split()[-1] != "up":
                    note = f"(a pod --up makes: {shown}, from {source})".replace("%", "%%")
                action.help = f"{_DEFAULT_NOTE.sub('', action.help)} {note}"
            if key not in s.SOURCES and key not in noted_only:
                action.default = value


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, with the config files' values as the defaults (``args.config``)."""
    command, profile, script_dir = argv_hints(argv)
    known = command is not None and any(command in names for names, _ in BUILDERS)
    parser = build_parser(command if known else None)  # a typo or none: every command, to list
    resolved = None
    if command in CONFIGURED:
        from multihost.settings.layers import Resolved

        resolved = Resolved.load(Path(script_dir or "."), profile)
        configured = [subparser(parser, command)]
        if command == "job":  # what its jobs are made of, and how they are watched
            configured = [subparser(configured[0], name) for name in ("submit", "watch", "logs")]
        apply(resolved, configured, NOTED_ONLY.get(command, frozenset()))
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser: its --help is the one to see
        where = parser
        for name in (args.command, getattr(args, f"{args.command}_command", None)):
            if name is not None and where._subparsers is not None:
                where = subparser(where, name)
        where.error(f"unrecognized arguments: {' '.join(extra)}")
    if resolved is not None:
        for key, value in resolved.source_for(vars(args)).items():
            if hasattr(args, key):
                setattr(args, key, value)
    args.config = resolved
    return args
