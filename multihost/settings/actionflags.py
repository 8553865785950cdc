"""The flags that are no settings: what a command does, not how (the command, the run's name,
a dry run, detaching, the output's shape, what to pull back), and what ``sweep`` has beyond a
run (``--warm``). None of them is a config file's key.

Part of the settings schema (``multihost.settings.schema`` re-exports every name here).
"""

from __future__ import annotations

from pathlib import Path

from multihost.defaults import DEFAULTS as D
from multihost.settings.flag import Flag, Group
from multihost.settings.types import command_text

__all__ = [
    "CMD",
    "DETACH",
    "DRY_RUN",
    "GATHER",
    "JSON",
    "PULL",
    "PULL_TO",
    "RUN_NAME",
    "SWEEP",
    "WARM",
]

# -- flags that are no settings: what a command does, not how --------------------------------
CMD = Flag(
    "cmd",
    type=command_text,
    setting=False,
    help="command to run under sh -c on every host",
    group="launch",
)
RUN_NAME = Flag(
    "run-name",
    metavar="NAME",
    setting=False,
    help="default: a timestamp and a random suffix, e.g. 20250101-120000-3f9a0c",
    group="launch",
)
DRY_RUN = Flag(
    "dry-run",
    kind="switch",
    setting=False,
    help="print each host's command and env",
    group="launch",
)
DETACH = Flag(
    "detach",
    kind="switch",
    setting=False,
    help="exit once every host has started; follow later with attach",
    group="launch",
)
JSON = Flag(
    "json", kind="switch", setting=False, help="a JSON array instead of a table", group="output"
)
GATHER = Flag(
    "gather",
    kind="switch",
    setting=False,
    help="every host's output as it comes, identical lines shown once with their hosts "
    f"('[s0/w0-3] step 100 ...'), like clush -b; a line waits up to {D.gather_window:g} s "
    "for the other hosts' same line (each host's log stays whole)",
    group="output",
)
PULL = Flag(
    "pull",
    kind="append",
    metavar="REMOTE_PATH",
    setting=False,
    help="after the run, whatever its outcome, copy this path or glob back from every "
    "host (repeatable; see multihost pull; default: none)",
    group="output",
)
PULL_TO = Flag(
    "pull-to",
    type=Path,
    metavar="DIR",
    setting=False,
    help="where --pull copies to (default ./multihost-pull/RUN)",
    group="output",
)


# -- what `sweep` has beyond a run -----------------------------------------------------------
WARM = Flag(
    "warm",
    kind="switch",
    default=False,
    setting=False,
    help="run every point in one long-lived Python per host, JAX imported and the job joined "
    "once (jit caches carry over; imported modules and JAX's config are not reset between "
    "points); the command must be [NAME=VALUE ...] python SCRIPT ARGS (default: each point "
    "starts its own processes)",
    group="sweep",
)
SWEEP: Group = (WARM,)
"""The flags only ``sweep`` takes that the API takes too (``run_sweep``'s keywords)."""
