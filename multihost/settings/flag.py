"""What a setting is: a :class:`Flag` (its option, type, default and help), exclusive
:class:`OneOf` sets of them, and the groups the commands share (``multihost.settings.schema``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from multihost.defaults import DEFAULTS

Kind = Literal["value", "append", "switch", "bool", "optional", "pick", "csv"]

GROUPS: dict[str, str] = {
    "hosts": "hosts: which ones",
    "connection": "connection: how they are reached",
    "cloud": "cloud: Cloud TPU and gcloud",
    "staging": "staging: the code on every host",
    "environment": "environment: packages and variables",
    "launch": "launch: what runs and how it goes",
    "sweep": "sweep: the grid and its points",
    "output": "output: what is shown and kept",
}
"""Every flag's heading in ``--help`` (and the CLI reference), in the order shown."""
# switch: store_true; bool: --x/--no-x; optional: --x [VALUE], ``const`` when bare; pick:
# --x CHOICE, or one switch per choice (--spot for --capacity spot); csv: --x A,B,C (a tuple,
# each item by ``type``; a config file may give a list)


class _ByDest:
    def __repr__(self) -> str:
        return "BY_DEST"


BY_DEST: Any = _ByDest()
"""A flag's default when none is given: ``multihost.defaults.DEFAULTS``' field of its dest, if
there is one (else None); ``default=None`` says "none" even where that field exists."""


@dataclass(frozen=True)
class Flag:
    """One setting as a flag: ``--name``, its value type and default, and its help."""

    name: str  # the long option without dashes; also its config-file key
    help: str | None
    type: Callable[[str], Any] | None = None
    default: Any = BY_DEST  # the value in multihost.defaults under the dest's name, if any
    kind: Kind = "value"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    setting: bool = True  # a key the config files may set (and `multihost config` shows)
    const: Any = None  # kind "optional": the value of the bare flag
    group: str = "launch"  # its heading in --help and the reference: a key of GROUPS
    aliases: tuple[str, ...] = ()  # other options for it on the command line (--async)

    def __post_init__(self) -> None:
        if self.default is BY_DEST:  # the one source of defaults, read by name
            object.__setattr__(self, "default", getattr(DEFAULTS, self.dest, None))

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def dest(self) -> str:
        """Its name in ``vars(args)``, in the API's keywords and in the planner's settings."""
        return self.name.replace("-", "_")

    def items(self, text: str) -> tuple[Any, ...]:
        """A ``csv`` flag's value: ``A,B,C`` split, each item by the flag's type."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        return tuple(self.type(p) if self.type is not None else p for p in parts)

    @property
    def initial(self) -> Any:
        """The value when the flag is not given (a fresh list for an ``append`` flag)."""
        return list(self.default or ()) if self.kind == "append" else self.default

    def but(self, **changes: Any) -> Flag:
        """The same flag as one command shows it (another help or default)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class OneOf:
    """Flags that exclude each other; with ``required``, one of them must be given."""

    flags: tuple[Flag, ...]
    required: bool = False


Item = Flag | OneOf
Group = tuple[Item, ...]
