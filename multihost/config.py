"""Defaults from config files: ``[tool.multihost]`` in the project's ``pyproject.toml``, the
user's ``$XDG_CONFIG_HOME/multihost/config.toml`` (``~/.config/...``), and named profiles in
either (``[tool.multihost.profiles.NAME]``, ``[profiles.NAME]``).

Precedence, lowest first: ``defaults.py`` < user file < project table < profile (the user's,
then the project's) < flags. Keys are flag names without the dashes (``remote-dir``); this
module reads and layers the tables; ``multihost.settings.layers`` checks each value with its
flag's own type, the CLI makes it that flag's default (``--help`` shows it) and the API layers
it under its keywords, so the run is planned from the same settings either way.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multihost.errors import UsageError

PROJECT_TABLE = "tool.multihost"


class ConfigError(UsageError):
    """A config file that cannot be used: it names the file, the table and the key."""


@dataclass(frozen=True)
class Layer:
    """One table of one file: its keys as TOML gave them."""

    path: Path
    table: str  # "tool.multihost", "tool.multihost.profiles.pod", "profiles.pod" or "" (top)
    values: Mapping[str, Any]
    profile: str | None = None  # the profile this table is, if it is one

    @property
    def source(self) -> str:
        """Where a value came from, as ``multihost config`` shows it: ``FILE [table]``."""
        return f"{self.path} [{self.table}]" if self.table else str(self.path)

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source} {key}: {problem}")


@dataclass(frozen=True)
class Config:
    """The layers that apply, lowest precedence first, and the profile they were chosen for."""

    layers: tuple[Layer, ...] = ()
    profile: str | None = None
    others: tuple[Layer, ...] = ()  # the profiles not chosen: checked all the same

    @property
    def every_layer(self) -> tuple[Layer, ...]:
        return self.layers + self.others

    def winner(self, key: str) -> Layer | None:
        """The layer whose value of ``key`` counts (the last one that sets it)."""
        return next((layer for layer in reversed(self.layers) if key in layer.values), None)


def user_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/multihost/config.toml``, else ``~/.config/multihost/config.toml``."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "multihost" / "config.toml"


def project_table(start: Path) -> tuple[Path, object] | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a ``[tool.multihost]``,
    and that table."""
    folder = start.expanduser().resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file() and (found := _read(path, project=True)):
            return path, found[PROJECT_TABLE]
    return None


def _read(path: Path, *, project: bool = False) -> dict[str, Any]:
    """The file's tables. For a ``project`` (a pyproject.toml) only ``tool.multihost``, under
    that one key; one that never says "multihost" is not parsed, and one that is broken but
    has no such table is not ours to complain about."""
    try:
        text = _text(path)
    except (OSError, UnicodeDecodeError) as exc:
        if project:
            return {}
        raise ConfigError(f"{path}: cannot be read: {_why(exc)}") from None
    if project and "multihost" not in text:
        return {}
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if project and "[tool.multihost" not in text:
            return {}
        raise ConfigError(f"{path}: not a valid TOML file: {exc}") from None
    if project:
        tool = data.get("tool", {})
        return {PROJECT_TABLE: tool["multihost"]} if "multihost" in tool else {}
    return data


class _NotAFile(OSError):
    """A path that is there but no regular file (a FIFO, a device, a socket)."""


def _text(path: Path) -> str:
    """A regular file's text. Anything else is refused before a byte is read: a FIFO would
    wait for a writer for ever (so it is opened without waiting), a device may never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "a directory")
        if not stat.S_ISREG(mode):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device or socket"
            raise _NotAFile(errno.EINVAL, f"{kind}, not a file")
        return f.read().decode()


def _why(exc: OSError | UnicodeDecodeError) -> str:
    """Why a config file cannot be read, in words."""
    if isinstance(exc, UnicodeDecodeError):
        return "not text (UTF-8)"
    if isinstance(exc, _NotAFile):
        return exc.strerror or str(exc)
    if isinstance(exc, IsADirectoryError):
        return "a directory, not a file"
    if exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    return exc.strerror or str(exc)


def _split(path: Path, table: str, data: object) -> tuple[Layer, dict[str, Any]]:
    """A table → its own keys (a layer) and its ``profiles`` sub-tables."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path} [{table}]: must be a table")
    values = dict(data)
    profiles = values.pop("profiles", {})
    where = f"{table}.profiles" if table else "profiles"
    if not isinstance(profiles, dict) or not all(isinstance(p, dict) for p in profiles.values()):
        raise ConfigError(f"{path} [{where}]: must hold tables, one per profile")
    for name, body in profiles.items():
        if "profiles" in body:
            raise ConfigError(f"{path} [{where}.{name}] profiles: profiles do not nest")
    return Layer(path, table, values), profiles


def load(start: Path, profile: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Every layer that applies from ``start`` (the code dir or the current directory) with
    ``profile`` chosen; an unknown profile is an error naming the ones there are."""
    found: list[tuple[Layer, dict[str, Any]]] = []
    user = user_config_path(env)
    if os.path.lexists(user):  # a directory or a broken link there is an error, not "none"
        found.append(_split(user, "", _read(user)))
    project = project_table(start)
    if project is not None:
        found.append(_split(project[0], PROJECT_TABLE, project[1]))
    tops = [layer for layer, _ in found]
    profiles = [
        Layer(layer.path, f"{layer.table + '.' if layer.table else ''}profiles.{name}", body, name)
        for layer, bodies in found
        for name, body in bodies.items()
    ]
    chosen = [p for p in profiles if p.profile == profile]
    if profile is not None and not chosen:
        known = sorted({str(p.profile) for p in profiles})
        where = ", ".join(str(layer.path) for layer in tops) or "no config file found"
        raise ConfigError(
            f"no profile {profile!r} ({where}; profiles: {', '.join(known) or 'none'})"
        )
    others = tuple(p for p in profiles if p.profile != profile)
    return Config(tuple(tops + chosen), profile, others)
