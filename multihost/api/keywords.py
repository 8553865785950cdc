"""The API's keywords: the schema's settings of each function's command by their dests (a
run's, a pod's, a job's), checked, layered over a config profile, turned into a plan by the
one planner; and where a run's events go (``stream=``, ``on_output=``, ``on_event=``). The
one gate of every function's keywords (:func:`accepted`, :data:`NOT_FOR`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from multihost.events import Event, Line, Note
from multihost.planner import Plan, plan
from multihost.settings.cloudcommands import (
    AUTODOWN_COMMAND,
    JOB_SUBMIT,
    JOB_WATCH,
    PODS_COMMAND,
    UP_COMMAND,
)
from multihost.settings.flag import Group
from multihost.settings.schema import KEYWORDS, POD_AROUND, RUN_COMMAND, SWEEP, WATCH, flags_of

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
POD_KEYWORDS: tuple[str, ...] = tuple(f.dest for f in flags_of(POD_AROUND))
"""A run's, a sweep's and a session's pod keywords (``up=``, ``down=``, ``tpu_type=``...): a
pod's life around it, as ``run --prefix NAME --up --down`` (``multihost.pods.ops.around``)."""


def configured(values: Mapping[str, tuple[Any, str]] | None) -> dict[str, Any]:
    """A config profile's values by dest (``multihost.settings.layers.Resolved.values``)."""
    return {key.replace("-", "_"): value for key, (value, _) in (values or {}).items()}


def on_stderr(text: str) -> None:
    """The default ``say``: ``multihost: TEXT`` on stderr (a notebook shows it under the
    cell)."""
    print(f"multihost: {text}", file=sys.stderr, flush=True)


def wants_pod(options: Mapping[str, Any]) -> bool:
    """Whether a run's, a sweep's or a session's settings give any of a pod's keywords."""
    return any(options.get(k) not in (None, False) for k in POD_KEYWORDS)


_NO_POD = (
    "{f}() does not make or delete pods: a pod's life blocks on gcloud for minutes; put "
    "multihost.pod() around it, or use run()"
)


def _dests(group: Group, *less: str) -> frozenset[str]:
    return frozenset(f.dest for f in flags_of(group)) - set(less)


# The functions on a pod and a job: their command's flags by dest (the output's --json is the
# CLI's), and ``say=`` (what they tell as they go, instead of printing it).
_WATCHING = _dests((WATCH, *JOB_WATCH))
COMMANDS: dict[str, frozenset[str]] = {
    "up": _dests(UP_COMMAND) | {"say"},
    "pod": _dests(UP_COMMAND) | {"down", "say"},
    "down": frozenset({"wait", "zone", "project", "say"}),
    "pods": _dests(PODS_COMMAND, "json") | {"say"},
    "gc": frozenset({"dry_run", "zones", "project", "say"}),
    "autodown": _dests(AUTODOWN_COMMAND) | {"say"},
    "submit_job": (_dests(JOB_SUBMIT, "cmd") - _WATCHING) | {"say"},
}


SWEEP_KEYWORDS: dict[str, Any] = {f.dest: f.default for f in flags_of(SWEEP)}
"""``run_sweep``'s keywords from the schema's sweep flags (``--warm``: ``warm=``), with their
flags' defaults."""


# The run's keywords that a function has no use for, each refused by name with why: a keyword
# is accepted only where it has its flag's effect (tests/test_api_keywords.py walks them all).
_CALL_CODE = "call() stages its own code dir (the function travels by value)"
_WARM = "a session's processes run many pieces: no run's hang watch, trace or pull"
NOT_FOR: dict[str, dict[str, str]] = {
    "run": {},
    "run_async": dict.fromkeys(POD_KEYWORDS, _NO_POD.format(f="run_async")),
    "call": {
        **dict.fromkeys(POD_KEYWORDS, _NO_POD.format(f="call")),
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
    "session": {
        "dry_run": "session() starts processes to run work in: there is no plan to return",
        "detach": "a session's processes end with it",
        "timeout": "a session lasts until it is closed; each piece takes timeout= of its own",
        "fail_fast": "a session's processes stop together when one ends",
        "hang_timeout": _WARM,
        "on_hang": _WARM,
        "trace": _WARM,
        "trace_after": _WARM,
        "pull": _WARM,
        "pull_to": _WARM,
    },
}
OWN: dict[str, tuple[str, ...]] = {
    "run": ("say",),  # what the pod's life around it tells
    "run_async": (),
    "call": ("kwargs", "python", "uv_project"),
    "run_sweep": (
        "say",
        "where",
        "metric",
        "minimize",
        "repeat",
        "point_timeout",
        "parallel",
        "resume",
        "on_record",
        *SWEEP_KEYWORDS,
    ),
    "session": ("python", "say"),  # say: what the pod's life around it tells
}


def accepted(function: str) -> tuple[str, ...]:
    """Every keyword ``function`` (``run``, ``run_async``, ``call``, ``run_sweep``,
    ``session``, and the functions on a pod and a job: :data:`COMMANDS`) takes."""
    if function in COMMANDS:
        return tuple(sorted(COMMANDS[function]))
    return tuple(sorted({*ACCEPTED, *POD_KEYWORDS, *OWN[function]} - set(NOT_FOR[function])))


def check_options(function: str, given: Mapping[str, object]) -> None:
    """A TypeError naming the first keyword ``function`` does not take (and why, for a run's
    keyword it has no use for), and every one it takes."""
    allowed = accepted(function)
    refused = NOT_FOR.get(function, {})
    for name in given:
        if name in refused:
            raise TypeError(f"{function}() does not take {name}=: {refused[name]}")
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
    given = {
        _ALIASES.get(k, k): v
        for k, v in given.items()
        if k not in _EVENTS and k not in POD_KEYWORDS and k != "say"  # not the plan's
    }
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
