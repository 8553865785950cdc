"""``multihost config``: every setting's effective value and where it came from (the config
files are read and checked in ``multihost.settings.layers``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.settings.layers import Resolved
from multihost.settings.schema import SETTINGS

if TYPE_CHECKING:
    from rich.console import Console


def cmd_config(args: argparse.Namespace, err: Console) -> int:
    """Every setting: its effective value and where it came from (a file's table, a flag, or
    the default)."""
    resolved: Resolved = args.config
    rows = []
    for key, flag in SETTINGS.items():
        value = getattr(args, flag.dest)
        if key in resolved.values:
            from_config, source = resolved.values[key]
            source = source if value == from_config else "flag"
        else:
            source = "default" if value == flag.initial else "flag"
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
