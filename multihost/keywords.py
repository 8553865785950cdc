"""The API's keywords: checked against what the functions accept, layered over a config
profile, turned into a plan by the one planner; and where a run's events go (``stream=``,
``on_output=``, ``on_event=``). Used by ``multihost.api``, ``run_sweep`` and ``call``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from multihost.events import Event, Note
from multihost.options import RunOptions
from multihost.planner import Plan, Settings, plan
from multihost.sources import spec_fields
from multihost.stream import Line

Stream = Literal["all", "host0", "none"]
OnOutput = Callable[[str, str], None]

_FLEET = spec_fields()  # hosts, local, prefix, project, zone, ip, user
_JOB = ("remote_dir", "coordinator_port", "megascale_port")
_OPTIONS = tuple(f.name for f in fields(RunOptions))
_SSH = ("host_keys", "connect_timeout")  # SSHOptions fields a keyword may set
_EVENTS = ("on_event", "on_output", "stream")  # where a run's events go: not the plan's
_OWN = ("env", "run_name", "ssh_config", "profile", *_EVENTS, *_SSH)
# Every setting of the planner (every flag of `run`: --wait, --no-sync, ...) is a keyword too.
_SETTINGS = tuple(f.name for f in fields(Settings) if f.name != "cmd")
ACCEPTED: tuple[str, ...] = tuple(sorted({*_FLEET, *_JOB, *_OPTIONS, *_OWN, *_SETTINGS}))
_ALIASES = {"excludes": "exclude"}  # a RunOptions field → its setting's name


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
