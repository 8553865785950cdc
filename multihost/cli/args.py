"""The pieces every ``multihost`` parser is built from: :class:`Parser` (one line and exit 2
on bad input; ``--help`` with the schema's headings and examples) and :func:`add`, which
declares schema flags under their headings. No rich here: ``--help`` stays light."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from multihost.cli.examples import EXAMPLES
from multihost.errors import UsageError
from multihost.settings.flag import GROUPS, Item, OneOf

_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")
Container = argparse.ArgumentParser | argparse._ActionsContainer


class Parser(argparse.ArgumentParser):
    """A parser whose options sit under the headings of ``GROUPS``, in that order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --lcoal is a typo, not --local
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        # every heading made now, in order; argparse leaves out the ones that stay empty
        self.headings = {name: self.add_argument_group(title) for name, title in GROUPS.items()}

    def at(self, heading: str) -> argparse._ArgumentGroup:
        """Where a flag under ``heading`` (a key of ``GROUPS``) goes."""
        return self.headings[heading]

    def error(self, message: str) -> NoReturn:
        """One line and exit 2, never the usage dump."""
        for action in self._actions:  # a group's command left out: its commands, not its dest
            missing = f"the following arguments are required: {action.dest}"
            if isinstance(action, argparse._SubParsersAction) and message == missing:
                group = self.prog.split(" ", 1)[-1]  # "sandbox", or "multihost" itself
                message = f"{group} needs a command: {', '.join(action.choices or ())}"
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
                import difflib  # only to word a mistake

                close = difflib.get_close_matches(name, list(self._option_string_actions), 1, 0.75)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.error(f"unknown option {name}{hint}")
        return super().parse_known_args(tokens, namespace)


class _Pick(argparse.Action):
    """One option of a ``pick`` flag (``--capacity spot``, ``--spot``): a second one is refused.
    Not an argparse exclusive group: that one's usage line would not wrap at 80 columns."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        if kw.get("const") is not None:
            kw["nargs"] = 0
        super().__init__(option_strings, dest, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        by = f"_{self.dest}_given_by"
        seen = getattr(namespace, by, None)
        if seen is not None and seen != option_string:
            parser.error(f"argument {option_string}: not allowed with argument {seen}")
        setattr(namespace, by, option_string)
        setattr(namespace, self.dest, self.const if self.const is not None else values)


def command(sub: Any, name: str, help: str, *, under: str = "") -> Parser:
    """``multihost NAME`` (``under`` a command: ``multihost job NAME``): its one-line help, also
    the top of its ``--help``, and its examples (``multihost.cli.examples``) at the end."""
    key = f"{under} {name}".strip()
    parser: Parser = sub.add_parser(
        name, help=help, description=help[:1].upper() + help[1:] + ".", epilog=EXAMPLES[key]
    )
    return parser


def add(p: Container, *items: Item) -> None:
    """Declare schema flags (and groups of exclusive ones) on a parser, each under its own
    heading; on a group (a mutually exclusive one), in that group."""
    for item in items:
        if isinstance(item, OneOf):
            where = p.at(item.flags[0].group) if isinstance(p, Parser) else p
            add(where.add_mutually_exclusive_group(required=item.required), *item.flags)
            continue
        where = p.at(item.group) if isinstance(p, Parser) else p
        if item.kind == "pick":  # --capacity spot, or --spot: one of them
            where.add_argument(
                item.option,
                action=_Pick,
                choices=item.choices,
                default=item.default,
                metavar=item.metavar,
                help=item.help,
            )
            for choice in item.choices or ():
                where.add_argument(
                    f"--{choice}",
                    dest=item.dest,
                    action=_Pick,
                    const=choice,
                    help=f"{item.option} {choice}",
                )
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
        if item.kind == "csv":
            kw["type"] = item.items
        where.add_argument(item.option, *item.aliases, **kw)
