"""Every command's ``--help``: its flags under headings (none left in argparse's generic
"options" but -h), examples at the end that parse, and a readable page at 80 columns."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterator

import pexpect
import pytest

from multihost.cli import COMMANDS, build_parser
from multihost.cli.examples import EXAMPLES
from multihost.cli.parser import BUILDERS
from multihost.settings import schema as s
from multihost.settings.flag import GROUPS
from tests.test_cli_terminal import REPO, screen


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command's parser (``job submit`` too), by its words."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


def defaults(parser: argparse.ArgumentParser) -> dict[str, object]:
    return {a.dest: a.default for a in parser._actions}


ALL = list(commands(build_parser()))
TITLES = set(GROUPS.values())


def test_every_command_is_seen() -> None:
    words = {" ".join(path) for path, _ in ALL}
    assert {"run", "pull", "logs", "job", "job submit", "job logs", "sweep"} <= words
    assert words == set(EXAMPLES)


def test_a_command_s_parser_built_alone_is_the_same_as_in_the_whole() -> None:
    """``multihost NAME`` builds only NAME's builder (start-up CPU): each builder adds exactly
    the commands it names, in ``--help``'s order, together every command there is, and each
    command's help and defaults are the same either way."""
    words = [path[0] for path, _ in ALL if len(path) == 1]
    assert [name for names, _ in BUILDERS for name in names] == words
    assert sorted(words) == sorted(COMMANDS)
    whole = dict(ALL)
    for names, _ in BUILDERS:
        alone = dict(commands(build_parser(names[0])))
        assert sorted(path[0] for path in alone if len(path) == 1) == sorted(names)
        for path, parser in alone.items():
            assert parser.format_help() == whole[path].format_help(), path
            assert defaults(parser) == defaults(whole[path]), path


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_flag_sits_under_a_heading(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    for group in parser._action_groups:
        flags = [a for a in group._group_actions if a.option_strings]
        if group.title == "options":
            assert [a.option_strings for a in flags] == [["-h", "--help"]], path
        elif group.title != "positional arguments":
            assert group.title in TITLES, group.title
    for action in parser._actions:  # every positional says what it is (job submit's NAME too)
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            assert action.help, (path, action.dest)


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_help_ends_with_examples_that_parse(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    text = parser.format_help()
    assert "\nexamples:\n" in text, path
    assert text.rstrip().endswith(EXAMPLES[" ".join(path)].rstrip())
    for example in _examples(EXAMPLES[" ".join(path)]):
        words = shlex.split(example, comments=True)[1:]
        assert words[: len(path)] == list(path), example
        build_parser().parse_args(words)  # a UsageError here is a broken example


def test_every_example_fits_80_columns() -> None:
    from multihost.cli.parser import EXAMPLES as TOP

    for block in (*EXAMPLES.values(), TOP):
        assert all(len(line) <= 78 for line in block.splitlines()), block


def _examples(block: str) -> list[str]:
    """The example command lines, ``\\``-continued lines joined."""
    lines, current = [], ""
    for raw in block.splitlines()[1:]:
        current += raw.strip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current)
        current = ""
    return lines


def test_the_schema_is_the_one_place_of_a_flags_heading() -> None:
    """A schema flag sits under its own ``group`` wherever a command takes it."""
    by_option = {f.option: f.group for f in s.flags_of((*s.CONFIGURABLE, *s.SUBSET))}
    for path, parser in ALL:
        for group in parser._action_groups:
            for action in group._group_actions:
                for option in action.option_strings:
                    if option in by_option and path[0] != "job":
                        assert group.title == GROUPS[by_option[option]], (path, option)


def test_run_help_at_80_columns_on_a_terminal() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)  # the pty's own width decides
    child = pexpect.spawn(
        sys.executable,
        ["-m", "multihost", "run", "--help"],
        env=env,
        dimensions=(24, 80),
        timeout=30,
        encoding="utf-8",
    )
    raw = child.read()
    child.close()
    assert child.exitstatus == 0
    rows = screen(raw)
    assert max(len(r) for r in rows) <= 80
    headings = [r for r in rows if r.endswith(":") and not r.startswith(" ")]
    assert headings == [
        "positional arguments:",
        "options:",
        *[t + ":" for t in GROUPS.values() if t != GROUPS["sweep"]],
        "examples:",
    ]
    assert any(r.startswith("  --workers SPEC") for r in rows)
