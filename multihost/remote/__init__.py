"""Every shell script multihost runs on a host, as a ``.sh`` file of this package.

A script never has values spliced into its text: its positional arguments are assigned to
named variables at its top, and :func:`script` sends ``set -- ARG...`` (each value quoted once
by ``shlex.quote``; a remote path's leading ``~/`` becomes ``"$HOME"/`` so the host expands
it) before the script's text. A line ``. ./_NAME.sh`` sources a shared fragment; :func:`load`
puts the fragment's text in its place (as ``.`` would, on a host that had the file), so a
host gets one self-contained script. The pure test tier runs shellcheck on the files
themselves (following the sourced fragments) and ``sh -n`` on what is sent.

What each host is sent of them, with its environment and paths, is planned in
``multihost.remote.commands``.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

_SOURCE = re.compile(r"^\. \./(_[a-z_]+\.sh)\n", re.M)
_ARG = re.compile(r"^([a-z_][a-z0-9_]*)=\$(?:([1-9])|\{([1-9][0-9])\})\n", re.M)


@dataclass(frozen=True)
class Script:
    """A script file: its name, its text as sent (fragments in place, header comments out),
    and the names of its positional arguments, in order."""

    name: str
    text: str
    args: tuple[str, ...]


def _read(name: str) -> str:
    return Path(__file__).with_name(name).read_text()  # a file of the installed package


def _body(text: str) -> str:
    """The text without its leading comment lines (the header: shellcheck reads it, a host
    need not); fragments sourced by ``. ./_NAME.sh`` put in place, recursively."""
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return _SOURCE.sub(lambda m: _body(_read(m[1])), "".join(lines))


@functools.cache
def load(name: str) -> Script:
    """``NAME.sh`` of this package, ready to send (see :class:`Script`)."""
    text = _body(_read(f"{name}.sh"))
    args: list[str] = []
    at = 0
    while m := _ARG.match(text, at):
        if int(m[2] or m[3]) != len(args) + 1:
            raise ValueError(f"{name}.sh: its arguments must be assigned as $1, $2, ... in order")
        args.append(m[1])
        at = m.end()
    return Script(name, text, tuple(args))


STAGE = load("stage")  # b c done: "present", or "absent" and the archive unpacked from stdin
WRAPPER = load("wrapper").text  # the run's wrapper, copied to run.sh from the kit
KIT = load("kit")  # k kh s, then s's own: the kit checked (or received), then its script s
LAUNCH = load("launch")  # b r command env job k
WATCH = load("watch")  # r o
LAUNCH_WATCH = load("launch_watch")  # b r command env job k o
FINISH = load("finish")  # r o
STATUS = load("status")  # r
CLAIM = load("claim")  # b r
CLAIM_STAGE = load("claim_stage")  # b r c done
RELEASE = load("release")  # r
KILL = load("kill")  # r sig ticks
CLEAN = load("clean")  # r b age incoming kit
CLEAN_CACHE = load("clean_cache")  # d mode
PULL_LIST = load("pull_list")  # w pats


def home_based(path: str) -> str:
    """A host's base directory as every script takes it, from ``/`` or from ``~``: a relative
    one is under the remote user's home, as scp takes it (``work`` is ``~/work``), since the
    wrapper and the job run in other directories. ``~USER`` is refused (a ValueError): hosts
    are not asked to expand it."""
    if path.startswith("/") or path == "~" or path.startswith("~/"):
        return path
    if path.startswith("~"):
        raise ValueError(
            f"~USER is not expanded on hosts; give the directory from / or ~/: {path!r}"
        )
    rest = path
    while rest.startswith("./"):
        rest = rest[2:].lstrip("/")
    return "~" if rest in ("", ".") else f"~/{rest}"


def remote_path(path: str) -> str:
    """A remote path as a quoted shell word, a leading ``~/`` left to the host's $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def script(template: Script | str, *, paths: dict[str, str] | None = None, **values: object) -> str:
    """The text to run: a :class:`Script` after ``set --`` with its arguments in its order,
    or a template string after a prelude assigning each value; every value quoted once
    (``paths``: remote paths, whose ``~/`` the host expands)."""
    words = _words(paths, values)
    if isinstance(template, Script):
        return f"set -- {_ordered(template, words)}\n{template.text}"
    return "\n".join(f"{k}={v}" for k, v in words.items()) + "\n" + template


def sourced(
    template: Script, kit: str, *, paths: dict[str, str] | None = None, **values: object
) -> str:
    """``template`` run from the kit a host holds (the folder ``kit``, see :func:`carried`):
    only ``set -- ARG...`` and a line that sources the kit's copy of the file are sent."""
    words = _ordered(template, _words(paths, values))
    return f"set -- {words}\n. {remote_path(kit)}/{template.name}.sh\n"


def carried(
    template: Script,
    kit: str,
    digest: str,
    *,
    paths: dict[str, str] | None = None,
    **values: object,
) -> str:
    """``template`` run from the kit after ``kit.sh`` made sure the host holds it: the kit in
    the folder ``kit`` checked against ``digest`` (its SHA256SUMS' sha256), or asked for
    (``kit`` on stdout; the runner sends its length line and its tar.gz)."""
    words = _ordered(template, _words(paths, values))
    head = f"{remote_path(kit)} {shlex.quote(digest)} {shlex.quote(template.name + '.sh')}"
    return f"set -- {head} {words}\n{KIT.text}"


def _words(paths: dict[str, str] | None, values: dict[str, object]) -> dict[str, str]:
    words = {k: remote_path(v) for k, v in (paths or {}).items()}
    return words | {k: shlex.quote(str(v)) for k, v in values.items()}


def _ordered(template: Script, words: dict[str, str]) -> str:
    if set(words) != set(template.args):
        raise ValueError(f"{template.name}.sh takes {template.args}, not {tuple(words)}")
    return " ".join(words[a] for a in template.args)
