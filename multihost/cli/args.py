"""The parser's own pieces: one-line errors, unknown options named first, --version, and
the value types that refuse bad input before anything starts."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from multihost.errors import UsageError

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


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (1-65535): {text!r}")
    return int(text)


def size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"not a size in bytes (e.g. 2G): {text!r}")
    return int(digits) * scale


def command_text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the command is empty")
    return text


def remote_dir(text: str) -> str:
    """A directory for staged code and runs on each host: never empty or ``/``."""
    if not text.strip().strip("/") or "\n" in text:
        raise argparse.ArgumentTypeError(f"must name a directory, e.g. ~/.multihost: {text!r}")
    return text


def stage_via(text: str) -> str:
    """``--stage-via``: direct, peer or gs://BUCKET[/PREFIX], normalised (a bad one: exit 2)."""
    from multihost.stagevia import parse

    return str(parse(text))
