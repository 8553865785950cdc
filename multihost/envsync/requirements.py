"""``--requirements FILE``: a fully pinned requirements file instead of ``uv.lock``.

Every requirement is ``name==version`` (extras, an environment marker and ``--hash`` options
allowed); the only other lines are comments and where to get them (``--index-url``,
``--extra-index-url``, ``--find-links``, ``--no-index``). Anything else (a range, a bare name,
``-r``/``-c``/``-e``, a path or URL) does not pin one content and is refused before anything
starts, naming the file and the line. The builder installs exactly these lines (``uv pip
sync``) and checks that nothing they need is missing (``uv pip check``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import UsageError

_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[[A-Za-z0-9._,\s-]*\])?"
    r"\s*==\s*(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)$"
)
_HASH = re.compile(r"^--hash=(sha256|sha384|sha512):[0-9a-fA-F]+$")
_WHERE = ("--index-url", "-i", "--extra-index-url", "--find-links", "-f")  # take a value
_ALONE = ("--no-index",)


@dataclass(frozen=True)
class Pinned:
    """A requirements file that pins every package: its bytes and what it pins."""

    path: Path
    content: bytes
    pins: tuple[tuple[str, str], ...]  # (normalized name, version)

    def version(self, name: str) -> str | None:
        return dict(self.pins).get(name)


def normalize(name: str) -> str:
    """PEP 503: ``Tiny_A`` and ``tiny-a`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read(path: Path) -> Pinned:
    """``path`` checked: every requirement pinned, or a UsageError naming the line."""
    try:
        content = path.read_bytes()
        text = content.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--requirements {path}: cannot read it: {exc}") from None
    pins: list[tuple[str, str]] = []
    for number, line in _logical_lines(text):
        try:
            pin = _check(line)
        except ValueError as exc:
            why = f"--requirements {path}, line {number}: {exc}; nothing started"
            raise UsageError(why) from None
        if pin is not None:
            pins.append(pin)
    if not pins:
        raise UsageError(f"--requirements {path}: no requirement in it (name==version lines)")
    return Pinned(path, content, tuple(pins))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line's number, text) with ``\\`` continuations joined and comments cut."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        if joined:
            out.append((start, joined))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _check(line: str) -> tuple[str, str] | None:
    """The pin on ``line`` (None for an index option); ValueError says why it is refused."""
    if line.startswith("-"):
        word, _, value = line.replace("=", " ", 1).partition(" ")
        if (word in _ALONE and not value.strip()) or (word in _WHERE and _one_word(value)):
            return None
        raise ValueError(
            f"{line!r}: only name==version lines (with --hash) and --index-url, "
            "--extra-index-url, --find-links, --no-index are allowed"
        )
    words = line.replace("--hash ", "--hash=").split()
    hashes = [w for w in words if w.startswith("--")]
    if any(not _HASH.match(h) for h in hashes):
        raise ValueError(f"{line!r}: only --hash=ALGO:HEX may follow a pin")
    requirement = " ".join(w for w in words if not w.startswith("--")).partition(";")[0].strip()
    found = _PIN.match(requirement)
    if found is None:
        raise ValueError(f"{requirement!r} is not pinned (name==version)")
    return normalize(found["name"]), found["version"]


def _one_word(value: str) -> bool:
    return bool(value.strip()) and len(value.split()) == 1
