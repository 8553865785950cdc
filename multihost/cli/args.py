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
        (p.at(item.group) if isinstance(p, Parser) else p).add_argument(item.option, **kw)
