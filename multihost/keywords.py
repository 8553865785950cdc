"""The API's keywords: the schema's settings of ``run`` by their dests, checked, layered over
a config profile, turned into a plan by the one planner; and where a run's events go
(``stream=``, ``on_output=``, ``on_event=``). Used by ``multihost.api``, ``run_sweep`` and
``call``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from multihost.events import Event, Note
from multihost.planner import Plan, plan
from multihost.settings.schema import KEYWORDS, RUN_COMMAND, SWEEP, flags_of
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


SWEEP_KEYWORDS: dict[str, Any] = {f.dest: f.default for f in flags_of(SWEEP)}
"""``run_sweep``'s keywords from the schema's sweep flags (``--warm``: ``warm=``), with their
flags' defaults."""


def check_options(function: str, given: Mapping[str, object], extra: tuple[str, ...] = ()) -> None:
    """A TypeError naming the first unknown keyword and every accepted one."""
    allowed = {*ACCEPTED, *extra}
    for name in given:
        if name not in allowed:
            raise TypeError(
                f"{function}() got an unexpected keyword argument {name!r}; "
                f"it accepts: {', '.join(sorted(allowed))}"
            )


def plan_run(
    command: str, kwargs: Mapping[str, Any], function: str = "run", extra: tuple[str, ...] = ()
) -> Plan:
    """Keyword arguments (checked; ``extra`` are the caller's own, left out) → the run's plan,
    by the planner's rules; ``profile=`` layers the config files under them, as the CLI does
    (found from ``script_dir``, default: the current directory)."""
    check_options(function, kwargs, extra)
    given = {_ALIASES.get(k, k): v for k, v in kwargs.items() if k not in (*_EVENTS, *extra)}
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
