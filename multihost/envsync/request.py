"""What a run asks for: the environment of a staged code dir (:func:`request`, pure, before
anything starts), from its ``uv.lock`` or a fully pinned ``--requirements FILE``
(:mod:`.requirements`); the lock checked against ``pyproject.toml`` (:func:`check_lock`: out of
date is a usage error, exit 2, that says to run ``uv lock``); ``requires-python`` checked against
each host's Python (:func:`satisfies`)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import SettingError, UsageError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
WATCHED = ("jax", "jaxlib", "libtpu")  # their versions go into the run's header


@dataclass(frozen=True)
class Selection:
    """uv's selection flags, by uv's names."""

    extras: tuple[str, ...] = ()
    all_extras: bool = False
    groups: tuple[str, ...] = ()
    no_dev: bool = False

    def flags(self) -> tuple[str, ...]:
        out: list[str] = []
        for e in self.extras:
            out += ["--extra", e]
        if self.all_extras:
            out.append("--all-extras")
        for g in self.groups:
            out += ["--group", g]
        if self.no_dev:
            out.append("--no-dev")
        return tuple(out)


@dataclass(frozen=True)
class EnvRequest:
    """A locked environment to have on every host before the run starts."""

    lock_hash: str  # sha256 of uv.lock's bytes and the selection (or of the requirements)
    selection: Selection
    requires_python: str  # the specifier, "" when pyproject.toml gives none
    versions: tuple[tuple[str, str], ...]  # (name, version) of WATCHED packages in the lock
    requirements: bytes = b""  # --requirements FILE's content: built with uv pip sync
    source: str = "uv.lock"  # what the header names: uv.lock, or the requirements file
    lock: str = ""  # the runner's uv.lock (its path): what a stale lock's error names

    @property
    def header(self) -> str:
        """What the run's header says about it, once."""
        named = ", ".join(f"{n} {v}" for n, v in self.versions) or "no jax in it"
        return f"environment from {self.source} ({named})"


def request(
    script_dir: Path,
    *,
    sync: bool = True,
    extras: tuple[str, ...] = (),
    all_extras: bool = False,
    groups: tuple[str, ...] = (),
    no_dev: bool = False,
    requirements: Path | None = None,
    lock_excluded: bool = False,
    lock_dir: Path | None = None,
) -> EnvRequest | None:
    """The environment a run in ``script_dir`` needs, or None (no uv project, ``--no-sync``).
    ``lock_excluded``: ``--exclude`` leaves ``uv.lock`` out of the staged code; ``lock_dir``:
    the project the staged ``pyproject.toml`` and ``uv.lock`` were copied from (``call``),
    where the lock is checked against its sources."""
    for name in (*extras, *groups):
        if not _NAME.match(name):
            raise SettingError(f"bad extra or group name {name!r}")
    selection = Selection(tuple(extras), all_extras, tuple(groups), no_dev)
    lock, project = script_dir / "uv.lock", script_dir / "pyproject.toml"
    has_lock = project.is_file() and lock.is_file() and not lock_excluded
    if requirements is not None:
        return _from_requirements(
            requirements, sync=sync, lock=has_lock, script_dir=script_dir, selection=selection
        )
    if not sync or not project.is_file():
        return None
    if not has_lock:
        if selection != Selection():
            raise UsageError(f"--extra/--group need a uv.lock in {script_dir}: run `uv lock`")
        return None
    check_lock(lock_dir or script_dir)
    data = lock.read_bytes()
    digest = hashlib.sha256(data + "\0".join(selection.flags()).encode()).hexdigest()
    import tomllib  # only with a uv.lock to read

    try:
        meta = tomllib.loads(project.read_text())
        locked = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {project} or {lock}: {exc}") from None
    spec = str(meta.get("project", {}).get("requires-python", ""))
    found = {p.get("name"): p.get("version") for p in locked.get("package", [])}
    versions = tuple((n, str(found[n])) for n in WATCHED if found.get(n))
    return EnvRequest(
        digest, selection, spec, versions, lock=str((lock_dir or script_dir) / "uv.lock")
    )


def _from_requirements(
    path: Path, *, sync: bool, lock: bool, script_dir: Path, selection: Selection
) -> EnvRequest:
    """``--requirements FILE``: every line pinned, and no second source of the environment."""
    from multihost.envsync.requirements import read

    if not sync:
        raise UsageError("--requirements with --no-sync: give one of them")
    if lock:
        raise UsageError(
            f"--requirements {path} and {script_dir / 'uv.lock'}: two environments for one run; "
            "drop --requirements (the lock wins for a uv project), or leave the lock out of the "
            "staged code with --exclude uv.lock"
        )
    if selection != Selection():
        raise UsageError(
            "--extra/--all-extras/--group/--no-dev select from a uv.lock: not with "
            "--requirements (the file is installed exactly as it is)"
        )
    pinned = read(path.expanduser())
    digest = hashlib.sha256(b"requirements\0" + pinned.content).hexdigest()
    versions = tuple((n, v) for n in WATCHED if (v := pinned.version(n)))
    return EnvRequest(digest, selection, "", versions, pinned.content, path.name)


def check_lock(script_dir: Path) -> None:
    """A lock out of date with pyproject.toml: exit 2 before anything starts."""
    from multihost.envsync.uvbin import uv_binary  # only with a uv.lock to check

    uv = uv_binary()
    if uv is None:
        return  # nothing here to check with; the builder's frozen sync uses the lock as is
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    env.pop("VIRTUAL_ENV", None)
    try:
        res = subprocess.run(
            [uv, "lock", "--check", "--offline"],
            cwd=script_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"cannot check {script_dir / 'uv.lock'}: {exc}") from None
    if res.returncode == 0:
        return
    raise lock_problem(script_dir / "uv.lock", res.stderr)


def lock_problem(lock: Path | str, stderr: str, where: str = "") -> UsageError:
    """What ``uv lock --check --offline`` failing on ``lock`` means (exit 2): a lock uv cannot
    read, or one out of date with pyproject.toml. ``where``: who checked it, when not here."""
    said = [ln for ln in stderr.splitlines() if ln.startswith("error")]
    why = said[0].removeprefix("error: ") if said else stderr.strip()[-200:]
    if "parse" in why.lower() or "no `project` table" in why:
        return UsageError(f"cannot use {lock}: {why}{where}")
    # a lock that matches pyproject.toml is checked without resolving; offline, anything
    # else (a resolution that needs the index) means the lock no longer matches
    return UsageError(
        f"{lock} is out of date with pyproject.toml: run `uv lock` "
        f"(nothing started{where}; uv: {why})"
    )


# -- requires-python, without packaging ------------------------------------------------------
def satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` (X.Y.Z) meets a PEP 440 specifier set such as ``>=3.10,<3.13``."""
    have = _parts(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"^(~=|==|!=|<=|>=|<|>|===)\s*(\S+)$", clause)
        if not m:
            return True  # not understood: uv decides
        op, text = m.groups()
        if text.endswith(".*"):
            want = _parts(text[:-2])
            same = have[: len(want)] == want
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        want = _parts(text)
        n = max(len(have), len(want))
        a, b = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
        ok = {
            "==": a == b,
            "===": a == b,
            "!=": a != b,
            "<=": a <= b,
            ">=": a >= b,
            "<": a < b,
            ">": a > b,
            "~=": a >= b and have[: len(want) - 1] == want[: len(want) - 1],
        }[op]
        if not ok:
            return False
    return True


def _parts(text: str) -> tuple[int, ...]:
    return tuple(int(re.match(r"\d*", p).group() or 0) for p in text.split("."))  # type: ignore[union-attr]
