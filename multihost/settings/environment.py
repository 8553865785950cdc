"""The locked environment's settings (``multihost.envsync``): uv's own flag names,
and ``--setup`` for projects without a lock."""

from __future__ import annotations

from pathlib import Path

from multihost.settings.flag import Flag, Group
from multihost.settings.types import command_text

NO_SYNC = Flag(
    "no-sync",
    kind="switch",
    help="with pyproject.toml and uv.lock in the code dir: run without the locked environment "
    "(default: build it once with uv and put it on every host; the command runs inside it)",
    group="environment",
)
EXTRA = Flag(
    "extra",
    kind="append",
    metavar="NAME",
    help="uv: include this optional extra (repeatable; default: none)",
    group="environment",
)
ALL_EXTRAS = Flag(
    "all-extras",
    kind="switch",
    help="uv: include every optional extra (default: none)",
    group="environment",
)
GROUP = Flag(
    "group",
    kind="append",
    metavar="NAME",
    help="uv: include this dependency group (repeatable; default: uv's default groups)",
    group="environment",
)
NO_DEV = Flag(
    "no-dev",
    kind="switch",
    help="uv: leave out the dev dependency group (default: included)",
    group="environment",
)
REQUIREMENTS = Flag(
    "requirements",
    type=Path,
    metavar="FILE",
    help="a project without uv.lock: the environment is FILE, fully pinned (every line "
    "name==version, hashes allowed), built once with uv pip sync and put on every host "
    "(default: none)",
    group="environment",
)
HOST_UV = Flag(
    "host-uv",
    choices=("auto", "fetch"),
    help="a builder host without uv: auto (the runner's uv binary when it fits the host's "
    "machine and C library, else fetched there), fetch (always fetched on the host with its "
    "own python3 -m pip download uv==VERSION, from the index its pip uses; nothing shipped) "
    "(default %(default)s)",
    group="environment",
)
SETUP = Flag(
    "setup",
    type=command_text,
    metavar="CMD",
    setting=False,
    help="run CMD (sh -c, in the code dir) on every host before the job; skipped where it "
    "succeeded before for the same command and code (default: none)",
    group="environment",
)
ENVIRONMENT: Group = (NO_SYNC, EXTRA, ALL_EXTRAS, GROUP, NO_DEV, REQUIREMENTS, HOST_UV, SETUP)
