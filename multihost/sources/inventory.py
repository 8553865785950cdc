"""Hosts from a comma list, a TOML inventory file, or ``--local N``. Pure parsing."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from multihost.errors import InventoryError
from multihost.model import Fleet, Host

_TARGET = re.compile(
    r"^(?:(?P<user>[^@\s:/]+)@)?(?P<host>\[[0-9a-fA-F:.]+\]|[^@\s:/\[\]]+)(?::(?P<port>\d+))?$"
)
_HOST_KEYS = {"address", "user", "port", "identity", "internal_address", "remote_dir"}


def parse_target(text: str) -> Host:
    """``[user@]host[:port]`` → Host (IPv6 literals in brackets)."""
    m = _TARGET.match(text.strip())
    if not m:
        raise InventoryError(f"not a host: {text!r} (expected [user@]host[:port])")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise InventoryError(f"bad port in {text!r}")
    return Host(address=m["host"].strip("[]"), user=m["user"], port=port)


def parse_host_list(text: str) -> Fleet:
    """A comma list: one slice, workers in the given order."""
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    if not items:
        raise InventoryError("the host list is empty")
    return Fleet.from_slices([[parse_target(t) for t in items]])


def _host_entry(entry: Any, defaults: Mapping[str, Any], where: str) -> Host:
    if isinstance(entry, str):
        host = parse_target(entry)
        fields: dict[str, Any] = {}
    elif isinstance(entry, dict):
        unknown = set(entry) - _HOST_KEYS
        if unknown:
            raise InventoryError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        if not isinstance(entry.get("address"), str) or not entry["address"]:
            raise InventoryError(f"{where}: a host table needs an 'address' string")
        host = parse_target(entry["address"])
        fields = {k: v for k, v in entry.items() if k != "address"}
    else:
        raise InventoryError(f"{where}: a host is a string or a table, not {type(entry).__name__}")
    merged = {**{k: v for k, v in defaults.items() if k in _HOST_KEYS - {"address"}}, **fields}
    for key, value in merged.items():
        ok = (
            isinstance(value, int) and not isinstance(value, bool)
            if key == "port"
            else (isinstance(value, str))
        )
        if not ok:
            raise InventoryError(f"{where}: {key} has the wrong type ({value!r})")
        if key == "remote_dir" and not value.strip().strip("/"):
            raise InventoryError(f"{where}: remote_dir must name a directory ({value!r})")
    return Host(
        address=host.address,
        user=host.user or merged.get("user"),
        port=host.port or merged.get("port"),
        identity=merged.get("identity"),
        internal_address=merged.get("internal_address"),
        remote_dir=merged.get("remote_dir"),
    )


def parse_inventory(data: Mapping[str, Any], source: str = "inventory") -> Fleet:
    """An inventory document: optional ``[defaults]`` and one ``[[slices]]`` table per slice."""
    unknown = set(data) - {"slices", "defaults"}
    if unknown:
        raise InventoryError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = data.get("defaults", {})
    slices = data.get("slices")
    if not isinstance(defaults, dict):
        raise InventoryError(f"{source}: [defaults] must be a table")
    if not isinstance(slices, list) or not slices:
        raise InventoryError(f"{source}: needs at least one [[slices]] entry with hosts = [...]")
    parsed: list[list[Host]] = []
    for s, sl in enumerate(slices):
        hosts = sl.get("hosts") if isinstance(sl, dict) else None
        if not isinstance(hosts, list) or not hosts:
            raise InventoryError(f"{source}: slice {s} needs a non-empty hosts = [...] list")
        parsed.append(
            [_host_entry(h, defaults, f"{source}: slice {s} host {w}") for w, h in enumerate(hosts)]
        )
    return Fleet.from_slices(parsed)


def load_inventory(path: Path) -> Fleet:
    """Read a TOML inventory file."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InventoryError(f"cannot read inventory {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: not valid TOML: {exc}") from None
    return parse_inventory(data, str(path))


def local_fleet(n: int, base: str = "~/.cache/multihost/local") -> Fleet:
    """N workers on this machine, each with its own directory under ``base``."""
    if n < 1:
        raise InventoryError(f"--local needs at least 1 worker, got {n}")
    hosts = [
        Host(
            address=f"local{i}", local=True, internal_address="127.0.0.1", remote_dir=f"{base}/w{i}"
        )
        for i in range(n)
    ]
    return Fleet.from_slices([hosts])


def resolve_hosts(spec: str) -> Fleet:
    """``--hosts`` value: a TOML file if one exists at that path (or ends in .toml), else a list."""
    if spec.endswith(".toml"):
        return load_inventory(Path(spec).expanduser())
    if "," not in spec:
        try:
            if Path(spec).expanduser().is_file():
                return load_inventory(Path(spec).expanduser())
        except OSError:  # e.g. a name too long to be a file: it is a host list
            pass
    return parse_host_list(spec)
