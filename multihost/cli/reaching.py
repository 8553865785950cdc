"""The fleet a command's flags name, reached: for the commands that look at hosts without
running on them (``hosts``, ``envs``, ``kill-stale``, ``forget``) and a pod's first contact."""

from __future__ import annotations

import argparse

from rich.console import Console

from multihost.cli.wiring import note, progress, warn
from multihost.fleetops.reach import Reach, reach


def reach_args(args: argparse.Namespace, err: Console, *, add_key: bool = False) -> Reach:
    """The fleet the flags name and how to reach it, the source's warnings said; ``add_key``:
    a command that logs in (``hosts --check``) makes sure a --prefix fleet takes the key."""
    from multihost.pods.records import located

    given = vars(args)
    zone, project = located(given.get("prefix"), given.get("zone"), given.get("project"))
    found = reach(
        {**given, "zone": zone, "project": project, "progress": progress(err)}, add_key=add_key
    )
    warn(err, found.warnings)
    note(err, found.notes)
    return found
