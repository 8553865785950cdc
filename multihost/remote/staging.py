"""The scripts of ``--stage-via``: a seed that serves the archive, and hosts that fetch it.

``.sh`` files of this package (see :mod:`multihost.remote`). ``stage`` is always the rendered
stage script (``commands.stage_command``): it is what unpacks, so a fetched archive lands exactly
as a sent one does. The token travels on stdin only.
"""

from __future__ import annotations

import functools
from pathlib import Path

from multihost.remote import load

# The seed (seed.sh), its stop (seed_stop.sh), a fetching host (fetch.sh).
SEED = load("seed")
SEED_STOP = load("seed_stop")
FETCH = load("fetch")


@functools.cache
def python_source(name: str) -> str:
    """The text of a stdlib-only script run on hosts with ``python3 -c`` (seed_serve,
    seed_fetch)."""
    return (Path(__file__).parent / f"{name}.py").read_text()
