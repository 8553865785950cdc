"""Config files as the flags' defaults (``multihost.config`` reads them), and ``multihost
config``: every setting's effective value and where it came from."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.config import Config, Layer, load
from multihost.errors import UsageError
from multihost.plan import parse_env

if TYPE_CHECKING:
    from rich.console import Console

CONFIGURED = ("run", "sweep", "hosts", "kill-stale", "forget", "config")  # commands that read it
NOT_SETTINGS = frozenset({"help", "cmd", "payload", "args", "run_name", "dry_run", "detach",
                          "profile", "json"})  # fmt: skip
SOURCES = ("hosts", "local", "prefix")  # one of them picks the fleet: a flag replaces them all
_DEFAULT_NOTE = re.compile(r"\s*\(default(?:[^()]|%\(default\))*\)$")  # the flag's own note


def key_of(action: argparse.Action) -> str | None:
    """The config key of a flag (its long name without dashes), or None if it is not one."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    if not longs or action.dest in NOT_SETTINGS:
        return None
    return action.dest.replace("_", "-")


def settings(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The settings a config file may hold: ``multihost config``'s own flags (run's options)."""
    return {k: a for a in parser._actions if (k := key_of(a)) is not None}


def argv_hints(argv: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    """The command, ``--profile`` and ``--script-dir`` from a command line, read before the
    parser exists (its defaults depend on them)."""
    command = argv[0] if argv and not argv[0].startswith("-") else None
    found: dict[str, str] = {}
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        for flag in ("--profile", "--script-dir"):
            if tok == flag and i + 1 < len(argv):
                found[flag] = argv[i + 1]
            elif tok.startswith(flag + "="):
                found[flag] = tok.split("=", 1)[1]
    return command, found.get("--profile"), found.get("--script-dir")


def read_config(argv: Sequence[str]) -> Config | None:
    """The config that applies to this command line (None for commands that read none)."""
    command, profile, script_dir = argv_hints(argv)
    if command not in CONFIGURED:
        return None
    return load(Path(script_dir or "."), profile)


def convert(layer: Layer, key: str, raw: object, action: argparse.Action) -> Any:
    """A TOML value checked and converted by its flag's own type; a ConfigError if it fits not."""
    if action.nargs == 0:  # --kill-stale, --no-fail-fast: true or false
        if not isinstance(raw, bool):
            raise layer.error(key, f"must be true or false, not {raw!r}")
        return raw
    if isinstance(action, argparse._AppendAction):  # --exclude, --env: a list (env: a table too)
        if key == "env" and isinstance(raw, dict):
            raw = [f"{k}={v}" for k, v in raw.items()]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise layer.error(key, f"must be a list of strings, not {raw!r}")
        if key == "env":
            try:
                parse_env(raw)
            except UsageError as exc:
                raise layer.error(key, str(exc)) from None
        return list(raw)
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise layer.error(key, f"must be a string or a number, not {raw!r}")
    text = str(raw)
    if action.type is Path:
        path = Path(text).expanduser()
        return path if path.is_absolute() else layer.path.parent / path
    if key == "hosts" and (layer.path.parent / text).is_file():  # an inventory beside the file
        text = str(layer.path.parent / text)
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise layer.error(key, str(exc) or f"bad value {raw!r}") from None
    if action.choices is not None and value not in action.choices:
        raise layer.error(key, f"must be one of {', '.join(map(str, action.choices))}")
    return value


@dataclass(frozen=True)
class Resolved:
    """Each setting's value from the config files, with its source; checked against ``parser``."""

    values: dict[str, tuple[Any, str]]  # key -> (value, "FILE [table]")

    @classmethod
    def of(cls, config: Config, parser: argparse.ArgumentParser) -> Resolved:
        known = settings(parser)
        values: dict[str, tuple[Any, str]] = {}
        for layer in config.every_layer:  # every table is checked, the chosen ones count
            for key, raw in layer.values.items():
                if key not in known:
                    raise layer.error(key, _unknown(key, known))
                value = convert(layer, key, raw, known[key])
                if layer in config.layers:
                    values[key] = (value, layer.source)
        return cls(values)

    @property
    def gives_source(self) -> bool:
        return any(k in self.values for k in SOURCES)


def _unknown(key: str, known: dict[str, argparse.Action]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(known), 1, 0.7)
    return "unknown key" + (f" (did you mean {close[0]}?)" if close else "")


def apply(resolved: Resolved, parsers: Iterable[argparse.ArgumentParser]) -> None:
    """Make each configured value the default of its flag in ``parsers``, its help saying so.
    The fleet's source (hosts, local, prefix) is no default: :func:`fill_source` adds it."""
    for parser in parsers:
        for group in parser._mutually_exclusive_groups:
            if resolved.gives_source and any(a.dest in SOURCES for a in group._group_actions):
                group.required = False
        for action in parser._actions:
            key = key_of(action)
            if key is None or key not in resolved.values:
                continue
            value, source = resolved.values[key]
            shown = " ".join(value) if isinstance(value, list) else value
            if action.help and action.help is not argparse.SUPPRESS:
                note = f"(default {shown}, from {source})".replace("%", "%%")
                action.help = f"{_DEFAULT_NOTE.sub('', action.help)} {note}"
            if key not in SOURCES:
                action.default = value


def fill_source(args: argparse.Namespace, resolved: Resolved) -> None:
    """No ``--hosts/--local/--prefix`` on the command line: the config's one picks the fleet."""
    if all(getattr(args, k, None) is None for k in SOURCES):
        for key in SOURCES:
            if key in resolved.values and hasattr(args, key):
                setattr(args, key, resolved.values[key][0])


def cmd_config(args: argparse.Namespace, err: Console) -> int:
    """Every setting: its effective value and where it came from (a file's table, a flag, or
    the default)."""
    from multihost.cli import build_parser, subparser

    resolved: Resolved = args.config
    rows = []
    for key, action in settings(subparser(build_parser(), "config")).items():
        value = getattr(args, action.dest)
        if key in resolved.values:
            from_config, source = resolved.values[key]
            source = source if value == from_config else "flag"
        else:
            source = "default" if value == action.default else "flag"
        rows.append({"key": key, "value": _jsonable(value), "source": source})
    if args.json:
        print(json.dumps({"profile": args.profile, "settings": rows}, indent=1))
        return 0
    for row in rows:
        if row["value"] is None:
            print(f"# {row['key']}: unset  # {row['source']}")
        else:
            print(f"{row['key']} = {json.dumps(row['value'])}  # {row['source']}")
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
