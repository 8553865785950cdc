"""Hosts from a comma list (with ``h[0-3]`` ranges), a TOML inventory or a plain hosts file,
or ``--local N``. Pure parsing."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from multihost.defaults import DEFAULTS
from multihost.errors import InventoryError
from multihost.model import Fleet, Host

_TARGET = re.compile(
    r"^(?:(?P<user>[^@\s:/]+)@)?(?P<host>\[[0-9a-fA-F:.]+\]|[^@\s:/\[\]]+)(?::(?P<port>\d+))?$"
)
MAX_HOSTS = 100_000  # a host list or range that names more is refused before it is expanded
_RANGE = re.compile(r"\[([0-9][0-9,\s-]*)\]")  # h[01-03,7]; an IPv6 literal has colons
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


def split_host_list(text: str) -> list[str]:
    """Split at commas outside brackets (``h[1,3],g`` is two items); an empty item or an
    unbalanced bracket is an error naming the item."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0:
            item = text[start:].split(",", 1)[0].strip()
            raise InventoryError(
                f"unbalanced bracket in the host list: {item!r} has a ']' without its '['"
            )
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    if depth > 0:
        item = text[start:].strip()
        raise InventoryError(
            f"unbalanced bracket in the host list: {item!r} has a '[' without its ']'"
        )
    if all(not t for t in items):
        raise InventoryError("the host list is empty")
    if "" in items:
        raise InventoryError(f"empty entry in the host list {text!r} (two commas in a row?)")
    return items


def expand_ranges(pattern: str, limit: int = MAX_HOSTS) -> list[str]:
    """``h[0-3]``, ``10.0.0.[2-9]``, ``h[01-03,7]`` → the names in order, zero padding kept
    (pdsh/ClusterShell NodeSet syntax); several ranges expand as a product. More than
    ``limit`` names is refused before any is made."""
    parts = _RANGE.split(pattern)
    if len(parts) == 1:
        if any(":" not in body for body in re.findall(r"\[([^\]]*)\]", pattern)):
            # a bracket that holds no range and no IPv6 literal (which has colons)
            raise InventoryError(f"bad range in {pattern!r} (e.g. h[0-3] or h[01-03,7])")
        return [pattern]
    bodies = parts[1::2]
    count = 1
    for body in bodies:
        count *= _range_size(body, pattern)
    if count > limit:
        raise InventoryError(f"{pattern!r} expands to {count} hosts: more than {MAX_HOSTS} in all")
    choices: list[list[str]] = []
    for i, part in enumerate(parts):
        choices.append([part] if i % 2 == 0 else _range_values(part, pattern))
    return ["".join(p) for p in itertools.product(*choices)]


def _range_items(body: str, pattern: str) -> list[tuple[str, str, str]]:
    items = []
    for item in (x.strip() for x in body.split(",")):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise InventoryError(f"bad range [{body}] in {pattern!r} (e.g. h[0-3] or h[01-03,7])")
        if sep and int(hi) < int(lo):
            raise InventoryError(f"bad range [{body}] in {pattern!r}: {hi} < {lo}")
        items.append((lo, sep, hi))
    return items


def _range_size(body: str, pattern: str) -> int:
    return sum(int(hi) - int(lo) + 1 if sep else 1 for lo, sep, hi in _range_items(body, pattern))


def _range_values(body: str, pattern: str) -> list[str]:
    values: list[str] = []
    for lo, sep, hi in _range_items(body, pattern):
        if not sep:
            values.append(lo)
            continue
        width = len(lo) if lo.startswith("0") else 0
        values += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return values


def parse_host_list(text: str) -> Fleet:
    """A comma list (ranges expanded): one slice, workers in the given order."""
    items = expand_all(split_host_list(text))
    return check_unique(Fleet.from_slices([[parse_target(t) for t in items]]))


def expand_all(entries: list[str], so_far: int = 0) -> list[str]:
    """Every entry's names, in order; more than MAX_HOSTS in all is refused as it grows."""
    names: list[str] = []
    for entry in entries:
        names += expand_ranges(entry, MAX_HOSTS - so_far - len(names))
    return names


def parse_hosts_file(text: str, source: str) -> Fleet:
    """A plain hosts file (pssh's ``-h``): one host (or range) per line, ``#`` comments."""
    items: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            items += expand_all(split_host_list(entry), len(items))
        except InventoryError as exc:
            raise InventoryError(f"{source}:{n}: {exc}") from None
    if not items:
        raise InventoryError(f"{source}: no hosts in the file")
    hosts = []
    for t in items:
        try:
            hosts.append(parse_target(t))
        except InventoryError as exc:
            raise InventoryError(f"{source}: {exc}") from None
    return check_unique(Fleet.from_slices([hosts]))


def check_unique(fleet: Fleet) -> Fleet:
    """Refuse a host given twice (the same ``[user@]host[:port]``): two workers would share
    one run directory."""
    seen: dict[str, str] = {}
    for h in fleet:
        if h.target in seen:
            raise InventoryError(f"host {h.target} appears twice: {seen[h.target]} and {h.name}")
        seen[h.target] = h.name
    return fleet


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
        if key == "port" and not 0 < value < 65536:
            raise InventoryError(f"{where}: port must be 1-65535 ({value!r})")
        if key == "remote_dir" and not value.strip().strip("/"):
            raise InventoryError(f"{where}: remote_dir must name a directory ({value!r})")
    if "remote_dir" in merged:  # a relative one is under the remote user's home
        from multihost.remote import home_based  # its scripts are read only when needed

        try:
            merged["remote_dir"] = home_based(merged["remote_dir"])
        except ValueError as exc:
            raise InventoryError(f"{where}: remote_dir: {exc}") from None
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
    return check_unique(Fleet.from_slices(parsed))


def load_inventory(path: Path) -> Fleet:
    """Read a TOML inventory file, or a plain hosts file (one host per line) if it is not TOML
    and its name does not end in ``.toml``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InventoryError(f"cannot read inventory {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{path}: not a text file: {exc}") from None
    import tomllib  # only for an inventory file

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if path.suffix == ".toml":
            raise InventoryError(f"{path}: not valid TOML: {exc}") from None
        return parse_hosts_file(text, str(path))
    if not data and path.suffix != ".toml":  # empty, or only comments: no hosts either way
        raise InventoryError(f"{path}: no hosts in the file")
    return parse_inventory(data, str(path))


def local_base() -> str:
    """Where ``--local`` workers keep their state: ``$XDG_CACHE_HOME/multihost/local``
    (default ``~/.cache/multihost/local``)."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    return f"{cache}/multihost/local" if os.path.isabs(cache) else "~/.cache/multihost/local"


def local_fleet(n: int, base: str | None = None) -> Fleet:
    """N workers on this machine, each with its own directory under ``base``."""
    if n < 1:
        raise InventoryError(f"--local needs at least 1 worker, got {n}")
    if n > DEFAULTS.local_max:  # each is a process here; refused before any is made
        raise InventoryError(f"--local {n}: at most {DEFAULTS.local_max} workers on this machine")
    base = base or local_base()
    hosts = [
        Host(
            address=f"local{i}", local=True, internal_address="127.0.0.1", remote_dir=f"{base}/w{i}"
        )
        for i in range(n)
    ]
    return Fleet.from_slices([hosts])


def resolve_hosts(spec: str) -> Fleet:
    """``--hosts`` value: a file if one exists at that path (or it ends in .toml), else a list."""
    if spec.endswith(".toml"):
        return load_inventory(Path(spec).expanduser())
    if "," not in spec:
        try:
            if Path(spec).expanduser().is_file():
                return load_inventory(Path(spec).expanduser())
        except OSError:  # e.g. a name too long to be a file: it is a host list
            pass
    return parse_host_list(spec)
