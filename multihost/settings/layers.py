"""The config files' values checked against the schema, and layered under what was given.

``multihost.config`` finds and reads the tables; here each value is checked and converted by
its flag's own type (:func:`convert`), and :func:`layered` puts what the caller gave (keywords,
flags) over them: ``env`` merged, a given fleet source replacing the configured one.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multihost.config import Config, Layer, load
from multihost.errors import UsageError
from multihost.settings.flag import Flag
from multihost.settings.schema import SETTINGS, SOURCES


def convert(layer: Layer, key: str, raw: object, flag: Flag) -> Any:
    """A TOML value checked and converted by its flag's own type; a ConfigError if it fits not."""
    if flag.kind in ("switch", "bool"):  # --kill-stale, --no-fail-fast: true or false
        if not isinstance(raw, bool):
            raise layer.error(key, f"must be true or false, not {raw!r}")
        return raw
    if flag.kind == "append":  # --exclude, --env: a list (env: a table too)
        if key == "env" and isinstance(raw, dict):
            raw = [f"{k}={v}" for k, v in raw.items()]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise layer.error(key, f"must be a list of strings, not {raw!r}")
        if key == "env":
            from multihost.remote.commands import parse_env  # only for a config that sets env

            try:
                parse_env(raw)
            except UsageError as exc:
                raise layer.error(key, str(exc)) from None
        return list(raw)
    if flag.kind == "csv":  # --zones A,B: a list, or one string of them
        if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
            raw = ",".join(raw)
        if not isinstance(raw, str):
            raise layer.error(key, f"must be a list of strings, not {raw!r}")
        try:
            return flag.items(raw)
        except (ArgumentTypeError, TypeError, ValueError) as exc:
            raise layer.error(key, str(exc) or f"bad value {raw!r}") from None
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise layer.error(key, f"must be a string or a number, not {raw!r}")
    text = str(raw)
    if flag.type is Path:
        path = Path(text).expanduser()
        return path if path.is_absolute() else layer.path.parent / path
    if key == "hosts" and (layer.path.parent / text).is_file():  # an inventory beside the file
        text = str(layer.path.parent / text)
    try:
        value = flag.type(text) if flag.type is not None else text
    except (ArgumentTypeError, TypeError, ValueError) as exc:
        raise layer.error(key, str(exc) or f"bad value {raw!r}") from None
    if flag.choices is not None and value not in flag.choices:
        raise layer.error(key, f"must be one of {', '.join(map(str, flag.choices))}")
    return value


@dataclass(frozen=True)
class Resolved:
    """Each setting's value from the config files, with its source."""

    values: dict[str, tuple[Any, str]]  # key -> (value, "FILE [table]")

    @classmethod
    def of(cls, config: Config) -> Resolved:
        values: dict[str, tuple[Any, str]] = {}
        for layer in config.every_layer:  # every table is checked, the chosen ones count
            for key, raw in layer.values.items():
                if key not in SETTINGS:
                    raise layer.error(key, _unknown(key))
                value = convert(layer, key, raw, SETTINGS[key])
                if layer in config.layers:
                    values[key] = (value, layer.source)
        return cls(values)

    @classmethod
    def load(cls, start: Path, profile: str | None) -> Resolved:
        """The config files that apply from ``start`` (a code dir), with ``profile`` chosen."""
        return cls.of(load(start, profile))

    @property
    def gives_source(self) -> bool:
        return any(k in self.values for k in SOURCES)

    def source_for(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The configured fleet source (by dest), unless ``given`` names one of its own."""
        if any(given.get(k) is not None for k in SOURCES):
            return {}
        return {k: self.values[k][0] for k in SOURCES if k in self.values}


def _unknown(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(SETTINGS), 1, 0.7)
    return "unknown key" + (f" (did you mean {close[0]}?)" if close else "")


def layered(resolved: Resolved, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (by dest) over the configured settings: ``env`` merged (given over the
    configured), and a given ``hosts/local/prefix`` replaces the configured fleet."""
    configured = {
        key.replace("-", "_"): value
        for key, (value, _) in resolved.values.items()
        if key not in SOURCES
    }
    merged = {**configured, **resolved.source_for(given), **given}
    if "env" in configured and given.get("env") is not None:
        from multihost.remote.commands import parse_env

        merged["env"] = {**parse_env(configured["env"]), **_env_dict(given["env"])}
    return merged


def _env_dict(env: Mapping[str, object] | list[str] | tuple[str, ...]) -> dict[str, str]:
    if isinstance(env, Mapping):
        return {str(k): str(v) for k, v in env.items()}
    from multihost.remote.commands import parse_env

    return parse_env(list(env))
