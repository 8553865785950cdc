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
    """A directory for staged code and runs on each host: never empty or ``/``; a relative one
    is under the remote user's home (``work`` is ``~/work``)."""
    from multihost.remote import home_based

    if not text.strip().strip("/") or "\n" in text:
        raise ArgumentTypeError(f"must name a directory, e.g. ~/.multihost: {text!r}")
    try:
        return home_based(text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


def stage_bucket(text: str) -> str:
    """``--stage-bucket``: gs://BUCKET[/PREFIX], normalised; ``""``: none (else: exit 2)."""
    from multihost.errors import UsageError
    from multihost.staging.via import parse

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
    from multihost.staging.via import parse

    return str(parse(text))


def _checked(check: Callable[[str], object], text: str) -> None:
    """One of the library's own checks (a UsageError) as a value type's refusal."""
    from multihost.errors import UsageError

    try:
        check(text)
    except UsageError as exc:
        raise ArgumentTypeError(str(exc)) from None


def tpu_type(text: str) -> str:
    """An accelerator type that exists (``v4-16``): ``multihost.cloud.checks``'s rule."""
    from multihost.cloud.checks import check_tpu_type

    _checked(check_tpu_type, text)
    return text


def slices(text: str) -> int:
    """Slices of one request: 1 to ``multihost.cloud.checks.MAX_SLICES``."""
    from multihost.cloud.checks import check_slices

    n = int(positive(int)(text))
    _checked(lambda _: check_slices(n), text)
    return n


def zone(text: str) -> str:
    """A zone's shape (``us-central2-b``); whether it exists is the API's to say."""
    from multihost.cloud.checks import check_zone

    text = text.strip()
    _checked(check_zone, text)
    return text


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h``, ``1d``."""
    from multihost.pods.plan import parse_duration

    _checked(parse_duration, text)
    return parse_duration(text)


def autodown(text: str) -> str:
    """An idle time before a pod deletes itself (as :func:`duration`), or ``off``: kept as
    written (``off`` is a setting, not "not given")."""
    from multihost.pods.plan import parse_autodown

    _checked(parse_autodown, text)
    return text.strip()


def bucket(text: str) -> str:
    """``gs://BUCKET``: a job's bucket, normalised (``multihost.cloud.bucket``'s rule)."""
    from multihost.cloud.bucket import check_bucket

    _checked(check_bucket, text)
    return check_bucket(text)
