"""Cut an ssh config down to the blocks that can apply to one host, before asyncssh reads it.

asyncssh parses the whole config for every connection; with a fleet's worth of ``Host``
blocks that parse dominates the runner's CPU. A ``Host`` block whose patterns do not match
the host's alias never applies, so dropping it changes nothing. Configs whose meaning could
depend on more than the alias (``Match``, ``Include``, hostname canonicalisation) are left
whole.
"""

from __future__ import annotations

import atexit
import fnmatch
import functools
import getpass
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def given_config(path: str | Path) -> tuple[Path, ...]:
    """The ssh config files to read: the one given (``--ssh-config``), which must exist."""
    from multihost.errors import SettingError

    found = Path(path).expanduser()
    if not found.is_file():
        why = "is a directory, not a file" if found.is_dir() else "does not exist"
        raise SettingError(f"ssh config {path} {why}")
    return (found,)


_UNSAFE = {"match", "include", "canonicalizehostname"}
_PROXY_JUMP = re.compile(r"^\s*proxyjump\b", re.IGNORECASE | re.MULTILINE)


_WILDCARD = re.compile(r"[*?\[!]")


@dataclass(frozen=True)
class _Parsed:
    """A config cut into blocks, indexed so that finding one host's blocks is not a scan of
    every block (a fleet's config has one ``Host`` block per host)."""

    head: str  # the lines before the first Host block
    blocks: tuple[tuple[tuple[str, ...], str], ...]  # (patterns, block text), in file order
    by_name: Mapping[str, tuple[int, ...]]  # literal pattern -> indices of its blocks
    wild: tuple[int, ...]  # indices of blocks with a wildcard or negated pattern

    def candidates(self, name: str) -> list[int]:
        """Indices of the blocks that may match ``name``, in file order."""
        return sorted((*self.by_name.get(name, ()), *self.wild))


@functools.lru_cache(maxsize=16)
def _blocks(path: str, mtime_ns: int) -> _Parsed | None:
    """The config's blocks, or None when the file must stay whole."""
    del mtime_ns  # part of the cache key only
    head: list[str] = []
    blocks: list[tuple[tuple[str, ...], list[str]]] = []
    for line in Path(path).read_text().splitlines(keepends=True):
        words = line.replace("=", " ", 1).split()
        keyword = words[0].lower() if words and not words[0].startswith("#") else ""
        if keyword in _UNSAFE:
            return None
        if keyword == "host":
            blocks.append((tuple(w.lower() for w in words[1:]), [line]))
        elif blocks:
            blocks[-1][1].append(line)
        else:
            head.append(line)
    by_name: dict[str, list[int]] = {}
    wild: list[int] = []
    for i, (patterns, _) in enumerate(blocks):
        if any(_WILDCARD.search(p) for p in patterns):
            wild.append(i)
        else:
            for p in dict.fromkeys(patterns):
                by_name.setdefault(p, []).append(i)
    return _Parsed(
        "".join(head),
        tuple((p, "".join(lines)) for p, lines in blocks),
        {k: tuple(v) for k, v in by_name.items()},
        tuple(wild),
    )


def _matches(alias: str, patterns: tuple[str, ...]) -> bool:
    """OpenSSH's rule: some positive pattern matches and no negated one does."""
    name = alias.lower()
    if any(p.startswith("!") and fnmatch.fnmatchcase(name, p[1:]) for p in patterns):
        return False
    return any(not p.startswith("!") and fnmatch.fnmatchcase(name, p) for p in patterns)


def filtered_text(path: Path, alias: str) -> str | None:
    """The config with only the blocks that can apply to ``alias``; None to use it whole."""
    try:
        return _filtered(str(path), path.stat().st_mtime_ns, alias)
    except OSError:
        return None


@functools.lru_cache(maxsize=4096)
def _filtered(path: str, mtime_ns: int, alias: str) -> str | None:
    """Cached per host: both the connect decisions and asyncssh's config want it."""
    parsed = _blocks(path, mtime_ns)
    if parsed is None:
        return None
    picked = (parsed.blocks[i] for i in parsed.candidates(alias.lower()))
    text = parsed.head + "".join(text for patterns, text in picked if _matches(alias, patterns))
    if _PROXY_JUMP.search(text):
        return None  # asyncssh reads the jump hosts' blocks from the same config
    return text


@functools.cache
def scratch() -> Path:
    """This process's private scratch dir (0700), removed at exit."""
    d = Path(tempfile.mkdtemp(prefix="multihost-sshconfig-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


@functools.lru_cache(maxsize=4096)
def _written(text: str) -> str:
    path = scratch() / hashlib.sha256(text.encode()).hexdigest()[:20]
    path.write_text(text)
    return str(path)


def _paths(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    if paths:
        return paths
    default = Path.home() / ".ssh" / "config"
    return (default,) if default.is_file() else ()


def config_for(paths: tuple[Path, ...], alias: str) -> list[str]:
    """Config paths to hand asyncssh for this host: filtered copies where that is safe."""
    out = []
    for path in _paths(paths):
        text = filtered_text(path, alias)
        out.append(str(path) if text is None else _written(text))
    return out


def entries(paths: tuple[Path, ...], alias: str) -> list[tuple[str, str]] | None:
    """Every ``keyword value`` line that can apply to ``alias``, in order, keywords
    lower-cased; None when the configs cannot be read this simply."""
    found: list[tuple[str, str]] = []
    for path in _paths(paths):
        text = filtered_text(path, alias)
        if text is None:
            return None
        found += _entries(text)
    return found


@functools.lru_cache(maxsize=4096)
def _entries(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for line in text.splitlines():
        words = line.strip().replace("=", " ", 1).split(maxsplit=1)
        if len(words) == 2 and not words[0].startswith("#"):
            out.append((words[0].lower(), words[1].strip()))
    return tuple(out)


def settings(paths: tuple[Path, ...], alias: str) -> dict[str, str] | None:
    """The value each keyword gets for ``alias`` (the first one found, as OpenSSH reads it),
    keywords lower-cased; None when the configs cannot be read this simply."""
    found = entries(paths, alias)
    if found is None:
        return None
    first: dict[str, str] = {}
    for keyword, value in found:
        first.setdefault(keyword, value)
    return first


def expand_path(value: str) -> str | None:
    """``~``, ``%d``, ``%u`` and ``%%`` expanded; None if it uses any other token."""
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "%" and i + 1 < len(value):
            token = value[i + 1]
            if token == "%":
                out.append("%")
            elif token == "d":
                out.append(str(Path.home()))
            elif token == "u":
                out.append(getpass.getuser())
            else:
                return None
            i += 2
            continue
        out.append(c)
        i += 1
    return os.path.expanduser("".join(out))


_INCLUDE = re.compile(r"^\s*include[\s=]+(.+)$", re.IGNORECASE | re.MULTILINE)
MAX_INCLUDE_DEPTH = 16  # OpenSSH's own limit (READCONF_MAX_DEPTH)


def include_loop(paths: tuple[Path, ...]) -> str | None:
    """The first ``Include`` chain that comes back to a file it went through (or goes deeper
    than OpenSSH allows), as ``a -> b -> a``; None when there is none. Relative includes are
    under ~/.ssh, as OpenSSH reads a user's config."""
    base = Path.home() / ".ssh"

    def walk(path: Path, chain: tuple[Path, ...]) -> str | None:
        if path in chain or len(chain) >= MAX_INCLUDE_DEPTH:
            return " -> ".join(str(p) for p in (*chain, path))
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return None  # a missing include is OpenSSH's business, not a loop
        for m in _INCLUDE.finditer(text):
            for word in m.group(1).split():
                pattern = os.path.expanduser(word.strip('"'))
                if not os.path.isabs(pattern):
                    pattern = str(base / pattern)
                for found in sorted(Path("/").glob(pattern.lstrip("/"))):
                    loop = walk(found.resolve(), (*chain, path))
                    if loop is not None:
                        return loop
        return None

    for path in _paths(paths):
        loop = walk(path.resolve(), ())
        if loop is not None:
            return loop
    return None
