"""The payloads that ship with multihost (``run --payload NAME``): where they are installed and
the command that runs one."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from multihost.errors import UsageError

PAYLOADS: tuple[str, ...] = ("shardings", "train")  # the scripts with a main(); the rest help


def payloads_dir() -> Path:
    """``multihost/payloads/`` of an installed wheel, else ``payloads/`` of a checkout (the
    wheel maps the one to the other; see pyproject.toml)."""
    here = Path(__file__).resolve().parent.parent  # the multihost package
    for folder in (here / "payloads", here.parent / "payloads"):
        if (folder / "meshing.py").is_file():
            return folder
    raise UsageError(f"this multihost ({here}) has no payloads: reinstall it from a wheel")


def payload_command(name: str, args: Sequence[str], python: str) -> str:
    """``PYTHON NAME.py ARGS...``, every word quoted, run in the staged payloads dir."""
    if name not in PAYLOADS:
        raise UsageError(f"unknown payload {name!r}: choose from {', '.join(PAYLOADS)}")
    return shlex.join([python, f"{name}.py", *args])
