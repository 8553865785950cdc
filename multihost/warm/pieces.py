"""What runs in warm processes: a piece of work, and the process layout it needs. Pure.

A sweep's point is a command line; in warm processes it must be a Python program that needs no
shell: ``[NAME=VALUE ...] PYTHON [-u] SCRIPT ARGS`` or ``... PYTHON -m MODULE ARGS``. The
variables and the interpreter are the layout (a point that needs another gets new processes);
the script or module and its arguments are the piece. A bundled payload (its file the same as
the one multihost ships) runs through its ``main(ARGS)``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multihost.errors import UsageError
from multihost.staging.bundled import PAYLOADS, payloads_dir

_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"python[0-9.]*")
_SHELL = ("&&", "||", ";", "|", "&", ">", ">>", "<", "2>&1", "(", ")")
_SPECIAL = re.compile(r"[$`*?\[\]{}~]|^#")
_IGNORED = ("-u", "-B")  # the warm process decides its buffering and bytecode


@dataclass(frozen=True)
class Layout:
    """What warm processes are started with: the interpreter and the variables a command adds
    to the run's environment."""

    python: str
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Piece:
    """One piece of work for every host: ``script`` (as ``python SCRIPT``), ``module`` (as
    ``python -m``), ``main`` (a bundled payload's ``main(args)``) or ``call`` (``blob``: the
    cloudpickled function, its arguments, its keyword arguments)."""

    kind: str
    target: str = ""  # the script (relative to the staged code) or the module
    args: tuple[str, ...] = ()
    blob: bytes = field(default=b"", repr=False)
    python: tuple[int, int] | None = None  # call: the runner's Python, which pickled it

    def header(self, number: int) -> dict[str, Any]:
        """What the host is told of it (the blob goes after)."""
        head: dict[str, Any] = {"id": number, "kind": self.kind, "target": self.target}
        head["args"] = list(self.args)
        if self.kind == "main":
            head["module"] = Path(self.target).stem
        if self.python is not None:
            head["python"] = list(self.python)
        return head


def from_command(command: str, script_dir: Path) -> tuple[Layout, Piece]:
    """A point's command as a layout and a piece; a UsageError says why it cannot run warm."""
    why = (
        "--warm runs a Python program without a shell ([NAME=VALUE ...] python SCRIPT ARGS, "
        f"or python -m MODULE ARGS), not {command!r}"
    )
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"{why}: {exc}") from None
    if any(w in _SHELL or _SPECIAL.search(w) for w in words):
        raise UsageError(f"{why}: it has shell syntax")
    env = []
    while words and _ASSIGN.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env.append((name, value))
    if not words or not _PYTHON.fullmatch(Path(words[0]).name):
        raise UsageError(f"{why}: it does not start with python")
    python, rest = words[0], words[1:]
    while rest and rest[0] in _IGNORED:
        rest.pop(0)
    if rest[:1] == ["-m"] and len(rest) > 1:
        return Layout(python, tuple(env)), Piece("module", rest[1], tuple(rest[2:]))
    if not rest or rest[0].startswith("-"):
        raise UsageError(f"{why}: the script first (of the interpreter's options, only -u)")
    script, args = rest[0], tuple(rest[1:])
    kind = "main" if bundled(script_dir, script) else "script"
    return Layout(python, tuple(env)), Piece(kind, script, args)


def bundled(script_dir: Path, script: str) -> bool:
    """Whether ``script`` in the staged code is one of the payloads multihost ships, as it
    ships it (a program of the user's own of the same name is run as a script)."""
    name = Path(script)
    if name.suffix != ".py" or name.stem not in PAYLOADS:
        return False
    try:
        ours = (payloads_dir() / name.name).read_bytes()
        theirs = (script_dir / script).read_bytes()
    except (OSError, UsageError):
        return False
    return ours == theirs
