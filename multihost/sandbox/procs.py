"""Processes, read from /proc: what is below a process, what is still alive, and killing a set
of them until they are gone (the sandbox's own: it never kills by name or by user)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat``'s fields after the command name (state, ppid, ...), None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running (or stopped), not gone nor a zombie waiting to be reaped."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def below(roots: Iterable[int]) -> set[int]:
    """The live processes below any of ``roots`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        fields = _stat(pid)
        if fields is not None and fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it."""
    found = set()
    while pid > 0 and pid not in found:
        found.add(pid)
        fields = _stat(pid)
        if fields is None:
            break
        pid = int(fields[1])
    return found


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether the process's environment (as it was exec'd) has a variable starting with
    ``entry`` (``NAME=VALUE-PREFIX``); False for one that is not this user's to read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return any(v.startswith(entry) for v in raw.split(b"\0"))


def matching(test: Callable[[int], bool]) -> set[int]:
    """The live processes ``test`` says yes to."""
    return {pid for pid in pids() if alive(pid) and test(pid)}


def kill(victims: Iterable[int], timeout: float = 10.0) -> set[int]:
    """SIGKILL ``victims`` and wait until each is gone or a zombie; those still alive after
    ``timeout``."""
    left = set(victims)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        left = {pid for pid in left if alive(pid)}
        if left:
            time.sleep(0.01)
    return left
