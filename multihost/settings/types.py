"""The settings' value types: each refuses bad input (``ArgumentTypeError``, which the CLI
prints as one line and a config file names with its key) before anything starts."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse


def at_least(low: float) -> Callable[[str], float]:
    """A finite number of seconds, ``low`` or more (``top --interval``: a host looked at more
    often than that would spend more on being watched than the look is worth)."""

    def parse(text: str) -> float:
        value = seconds(text)
        if value < low:
            raise ArgumentTypeError(f"must be at least {low:g}: {text!r}")
        return value

    return parse


def workers(text: str) -> int:
    """``--local N``: 1 to ``local_max`` workers, refused before any is made."""
    from multihost.defaults import DEFAULTS

    n = int(positive(int)(text))
    if n > DEFAULTS.local_max:
        raise ArgumentTypeError(f"at most {DEFAULTS.local_max} workers on this machine: {text!r}")
    return n


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more."""
    if not text.isdigit():
        raise ArgumentTypeError(f"not a whole number (0 or more): {text!r}")
    return int(text)


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ArgumentTypeError(f"not a port (1-65535): {text!r}")
    return int(text)


def size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) == 0:
        raise ArgumentTypeError(f"not a size in bytes (e.g. 2G): {text!r}")
    return int(digits) * scale


def command_text(text: str) -> str:
    if not text.strip():
        raise ArgumentTypeError("the command is empty")
    return text


def remote_dir(text: str) -> str:
    """A directory for staged code and runs on each host: never empty or ``/``."""
    if not text.strip().strip("/") or "\n" in text:
        raise ArgumentTypeError(f"must name a directory, e.g. ~/.multihost: {text!r}")
    return text


def stage_bucket(text: str) -> str:
    """``--stage-bucket``: gs://BUCKET[/PREFIX], normalised; ``""``: none (else: exit 2)."""
    from multihost.errors import UsageError
    from multihost.stagevia import parse

    if not text:
        return ""
    try:
        if text.startswith("gs://"):
            return str(parse(text))
        raise UsageError("expected gs://BUCKET[/PREFIX]")
    except UsageError as exc:
        raise UsageError(f"bad --stage-bucket {text!r}: {str(exc).split(': ', 1)[-1]}") from None


def stage_via(text: str) -> str:
    """``--stage-via``: auto, direct, peer or gs://BUCKET[/PREFIX], normalised (bad: exit 2)."""
    from multihost.stagevia import parse

    return str(parse(text))
