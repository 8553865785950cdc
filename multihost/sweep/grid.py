"""Sweep grids: ``--grid`` axes, the command template, points. Pure.

Grid values are text, inserted into the command verbatim (they come from the user's own
command line or grid file); they are also read as numbers for ``--where`` and sorting. In the
template ``{name}`` is a grid value and ``{{`` / ``}}`` are literal braces.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import keyword
import math
import re
import string
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import UsageError
from multihost.sweep.where import Value, Where

Grid = Mapping[str, tuple[str, ...]]

# Column names of every results row; an axis with one of these names would collide.
RESERVED = frozenset({"point", "repeat", "status", "run", "command", "started", "ended"})
MAX_POINTS = 100_000
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_UNSAFE = re.compile(r"[^A-Za-z0-9._]")


def parse_value(text: str) -> Value:
    """A grid value as a number when it reads as one (int, then float), else the text."""
    try:
        if _INT.match(text):
            return int(text)
        if _FLOAT.match(text):
            return float(text)
    except ValueError:  # more digits than int() accepts
        pass
    return text


def _check_axis(name: str, values: Sequence[str], source: str) -> None:
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise UsageError(f"{source}: {name!r} is not a valid grid name (letters, digits, _)")
    if name in RESERVED:
        raise UsageError(f"{source}: grid name {name!r} is reserved for a results column")
    if not values or any(not v for v in values):
        raise UsageError(f"{source}: grid {name!r} needs non-empty values")
    dups = sorted(v for v, n in Counter(values).items() if n > 1)
    if dups:
        raise UsageError(f"{source}: grid {name!r} repeats {', '.join(dups)}")


def parse_grid_arg(text: str) -> tuple[str, tuple[str, ...]]:
    """``"fsdp=1,2,4"`` → ``("fsdp", ("1", "2", "4"))``; values stay text."""
    name, sep, rest = text.partition("=")
    if not sep:
        raise UsageError(f"--grid {text!r}: expected NAME=V1,V2,...")
    name, values = name.strip(), tuple(v.strip() for v in rest.split(","))
    _check_axis(name, values, f"--grid {text!r}")
    return name, values


def merge_grids(*grids: Grid) -> dict[str, tuple[str, ...]]:
    """Axes of several grids in order; a name given twice (even file + flag) is an error."""
    merged: dict[str, tuple[str, ...]] = {}
    for grid in grids:
        for name, values in grid.items():
            if name in merged:
                raise UsageError(f"grid {name!r} given twice")
            merged[name] = values
    return merged


def parse_grid_args(args: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Every ``--grid`` flag, in order, as one grid."""
    return merge_grids(*(dict([parse_grid_arg(a)]) for a in args))


@dataclass(frozen=True)
class GridFile:
    """What a ``--grid-file`` TOML says: ``[grid]`` axes and optional where/cmd/metric."""

    grid: Mapping[str, tuple[str, ...]]
    where: str | None = None
    cmd: str | None = None
    metric: str | None = None


def _toml_text(value: object) -> str | None:
    if isinstance(value, bool):  # bool is an int; true/false would surprise in a command
        return None
    if isinstance(value, int | float):
        return repr(value)
    return value if isinstance(value, str) else None


def load_grid_file(path: Path) -> GridFile:
    """Read a grid file; a scalar axis value means a one-value axis."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read grid file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"grid", "where", "cmd", "metric"}
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    table = data.get("grid")
    if not isinstance(table, dict) or not table:
        raise UsageError(f"{path}: needs a non-empty [grid] table")
    grid: dict[str, tuple[str, ...]] = {}
    for name, raw in table.items():
        texts = [_toml_text(v) for v in (raw if isinstance(raw, list) else [raw])]
        if any(t is None for t in texts):
            raise UsageError(f"{path}: grid {name!r} values must be numbers or strings")
        grid[name] = tuple(t for t in texts if t is not None)
        _check_axis(name, grid[name], str(path))
    extra: dict[str, str | None] = {}
    for key in ("where", "cmd", "metric"):
        if key in data and not isinstance(data[key], str):
            raise UsageError(f"{path}: {key} must be a string")
        extra[key] = data.get(key)
    return GridFile(grid, **extra)


def _template(cmd: str) -> list[tuple[str, str | None]]:
    """``(literal, name or None)`` pieces of a command template, validated."""
    try:
        parsed = list(string.Formatter().parse(cmd))
    except ValueError as exc:
        raise UsageError(f"--cmd: {exc} (write {{{{ and }}}} for literal braces)") from None
    pieces: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is None:
            pieces.append((literal, None))
        elif name == "" or name.isdigit():
            raise UsageError("--cmd: positional {} fields are not allowed; use {grid_name}")
        elif conversion is not None or spec:
            raise UsageError(f"--cmd: {{{name}}} may not have !conversion or :format in a sweep")
        elif not _NAME.match(name):
            raise UsageError(
                f"--cmd: {{{name}}} is not a {{grid_name}} field (write {{{{ and }}}} for braces)"
            )
        else:
            pieces.append((literal, name))
    return pieces


def placeholders(cmd: str) -> set[str]:
    """The ``{name}`` fields of a command template."""
    return {name for _, name in _template(cmd) if name is not None}


def check_template(cmd: str, grid: Grid) -> None:
    """Every ``{name}`` has a grid and every grid is used, or a UsageError listing both."""
    used = placeholders(cmd)
    problems = []
    if unknown := sorted(used - set(grid)):
        problems.append(f"--cmd uses {', '.join('{' + n + '}' for n in unknown)} with no --grid")
    if unused := [n for n in grid if n not in used]:
        problems.append(f"--grid {', '.join(unused)} not used by --cmd (add {{{unused[0]}}})")
    if problems:
        raise UsageError("; ".join(problems))


def render(cmd: str, values: Mapping[str, str]) -> str:
    """The template with each ``{name}`` replaced verbatim by its value text."""
    pieces = _template(cmd)
    if missing := sorted({n for _, n in pieces if n is not None} - set(values)):
        raise UsageError(f"--cmd uses {', '.join('{' + n + '}' for n in missing)} with no --grid")
    return "".join(lit + (values[name] if name else "") for lit, name in pieces)


@dataclass(frozen=True)
class Point:
    """One combination of grid values, in grid order, with its place in the sweep."""

    index: int
    values: tuple[tuple[str, str], ...]

    @property
    def id(self) -> str:
        """Stable, file- and run-name-safe id from the values alone: ``fsdp4-tp2-b4096``.

        Values changed to be safe (or ids over 80 characters) get a hash of the real values,
        so ids stay unique; with no index in it, editing the grid or --where keeps ids.
        """
        raw = [f"{name}{value}" for name, value in self.values]
        safe = [_UNSAFE.sub("_", part) for part in raw]
        text = "-".join(safe)
        if safe != raw or len(text) > 80:
            digest = hashlib.sha1(json.dumps(self.values).encode()).hexdigest()[:8]
            text = f"{text[:70]}-h{digest}"
        return text if text[0].isalnum() else "p" + text

    @property
    def label(self) -> str:
        """``fsdp=4 tp=2 b=4096`` for tables and charts."""
        return " ".join(f"{name}={value}" for name, value in self.values)

    def command(self, template: str) -> str:
        """The command for this point (values inserted verbatim)."""
        return render(template, dict(self.values))

    def as_dict(self) -> dict[str, Value]:
        """Grid name → value, numbers parsed."""
        return {name: parse_value(value) for name, value in self.values}


def expand(grid: Grid, where: Where | None = None) -> list[Point]:
    """The Cartesian product of the grid in grid order (last axis fastest), filtered."""
    if not grid:
        raise UsageError("a sweep needs at least one --grid")
    total = math.prod(len(v) for v in grid.values())
    if total > MAX_POINTS:
        raise UsageError(f"the grid has {total} points; at most {MAX_POINTS} are allowed")
    points: list[Point] = []
    for combo in itertools.product(*grid.values()):
        values = tuple(zip(grid, combo, strict=True))
        if where is None or where.matches({n: parse_value(v) for n, v in values}):
            points.append(Point(len(points), values))
    if not points:
        raise UsageError(f"--where {where.text if where else ''!r} leaves no points of {total}")
    return points
