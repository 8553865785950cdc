"""The API's keywords: the schema's settings of ``run`` by their dests, checked, layered over
a config profile, turned into a plan by the one planner; and where a run's events go
(``stream=``, ``on_output=``, ``on_event=``). Used by the API's runs, sweep and call."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from multihost.events import Event, Note
from multihost.planner import Plan, plan
from multihost.settings.schema import KEYWORDS, RUN_COMMAND, flags_of
from multihost.stream import Line

Stream = Literal["all", "host0", "none"]
OnOutput = Callable[[str, str], None]

_EVENTS = ("on_event", "on_output", "stream")  # where a run's events go: not the plan's
_ALIASES = {"excludes": "exclude"}  # a RunOptions field → its setting's name
_NOT_KEYWORDS = ("cmd", "python")  # the command is run()'s argument; --payload's interpreter
# Every flag of `run` is a keyword (by its dest: --wait, --no-sync, ...), and the API's own few.
ACCEPTED: tuple[str, ...] = tuple(
    sorted(
        {f.dest for f in flags_of(RUN_COMMAND) if f.dest not in _NOT_KEYWORDS}
        | {*KEYWORDS, *_EVENTS, *_ALIASES}
    )
)


# The run's keywords that a function has no use for, each refused by name with why: a keyword
# is accepted only where it has its flag's effect (tests/test_api_keywords.py walks them all).
_CALL_CODE = "call() stages its own code dir (the function travels by value)"
NOT_FOR: dict[str, dict[str, str]] = {
    "run": {},
    "run_async": {},
    "call": {
        "dry_run": "call() runs the function for its values: there is no plan to return",
        "detach": "call() waits for its values",
        "script_dir": _CALL_CODE,
        "exclude": _CALL_CODE,
        "excludes": _CALL_CODE,
        "lock_dir": "call() stages the uv project it finds or is given (uv_project=)",
    },
    "run_sweep": {
        "dry_run": "a sweep runs its points to rank them (multihost sweep has no --dry-run)",
        "detach": "a sweep waits for each point's result",
        "timeout": "each point is bounded by point_timeout=",
        "fail_fast": "each point fails fast: one failed host ends it",
        "reconnect_timeout": "a lost host is retried for the default time",
    },
}
OWN: dict[str, tuple[str, ...]] = {
    "run": (),
    "run_async": (),
    "call": ("kwargs", "python", "uv_project"),
    "run_sweep": (
        "where",
        "metric",
        "minimize",
        "repeat",
        "point_timeout",
        "parallel",
        "resume",
        "on_record",
    ),
}


def accepted(function: str) -> tuple[str, ...]:
    """Every keyword ``function`` (``run``, ``run_async``, ``call``, ``run_sweep``) takes."""
    return tuple(sorted({*ACCEPTED, *OWN[function]} - set(NOT_FOR[function])))


def check_options(function: str, given: Mapping[str, object]) -> None:
    """A TypeError naming the first keyword ``function`` does not take (and why, for a run's
    keyword it has no use for), and every one it takes."""
    allowed = accepted(function)
    for name in given:
        if name in NOT_FOR[function]:
            raise TypeError(f"{function}() does not take {name}=: {NOT_FOR[function][name]}")
        if name not in allowed:
            raise TypeError(
                f"{function}() got an unexpected keyword argument {name!r}; "
                f"it accepts: {', '.join(allowed)}"
            )


def plan_run(command: str, kwargs: Mapping[str, Any], function: str = "run") -> Plan:
    """Keyword arguments of ``function`` (checked; its own, as ``run_sweep``'s ``metric=``,
    left out) → the run's plan, by the planner's rules; ``profile=`` layers the config files
    under them, as the CLI does (found from ``script_dir``, default: the current directory)."""
    check_options(function, kwargs)
    own = OWN.get(function, ())
    return planned(command, {k: v for k, v in kwargs.items() if k not in own})


def planned(command: str, given: Mapping[str, Any]) -> Plan:
    """Keywords already checked (and a function's own settings added, as ``call``'s code dir)
    → the run's plan (see :func:`plan_run`)."""
    given = {_ALIASES.get(k, k): v for k, v in given.items() if k not in _EVENTS}
    profile = given.pop("profile", None)
    if profile is not None:
        from multihost.settings.layers import Resolved, layered

        start = Path(given.get("script_dir") or ".").expanduser()
        given = layered(Resolved.load(start, profile), given)
    return plan({**given, "cmd": command})


def events_of(options: Mapping[str, Any], first: int = 0) -> Callable[[Event], None]:
    """Where a run's events go, by the keywords ``stream=``, ``on_output=``, ``on_event=``;
    ``first``: the process id that ``stream="host0"`` shows (of ``workers=``: the first)."""
    return output_events(
        options.get("stream", "all"), options.get("on_output"), options.get("on_event"), first
    )


def print_lines(host: str, texts: Sequence[str]) -> None:
    """The default output: ``[s0/w1] line`` on stdout (the notebook cell, the terminal), a
    batch of lines in one write."""
    prefix = f"[{host}] "
    sys.stdout.write(prefix + f"\n{prefix}".join(texts) + "\n")
    sys.stdout.flush()


def output_events(
    stream: str,
    on_output: OnOutput | None,
    on_event: Callable[[Event], None] | None,
    first: int = 0,
) -> Callable[[Event], None]:
    """Run events → ``on_output(host_name, line)`` for the lines ``stream`` selects ("all",
    "host0" or "none"); errors and warnings about the run go to stderr."""
    if stream not in ("all", "host0", "none"):
        raise ValueError(f"stream must be 'all', 'host0' or 'none', not {stream!r}")

    def handle(event: Event) -> None:
        if on_event is not None:
            on_event(event)
        if isinstance(event, Line):
            if stream == "all" or (stream == "host0" and event.host.process_id == first):
                if on_output is None:
                    print_lines(event.host.name, event.texts)
                    return
                for text in event.texts:
                    on_output(event.host.name, text)
        elif isinstance(event, Note) and event.level != "info":
            print(f"multihost: {event.text}", file=sys.stderr, flush=True)

    return handle
