"""One sandbox host's init: what PID 1 is to a VM, for the processes of that host alone.

Run as a script (``python -I -S vminit.py SSHD ARGS...``, the standard library only): it
becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so every process the host's
``sshd`` starts stays below it, a job detached with ``setsid`` included; it runs the ``sshd``
and reaps what is orphaned onto it. On SIGTERM, or when the ``sshd`` ends, it kills everything
below it and exits: a host stopped leaves no process behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


class _Stop(Exception):
    """SIGTERM, SIGINT or SIGHUP arrived."""


def _raise(signum: int, frame: object) -> None:
    raise _Stop


def _below(root: int) -> list[int]:
    """The live (not zombie) processes below ``root``."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            parents[int(name)] = int(fields[1])
    found, todo = [], [root]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                found.append(pid)
                todo.append(pid)
    return found


def _reap() -> None:
    """Collect every child that has ended, without waiting for the others."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_below() -> None:
    """SIGKILL everything below this process until nothing is left (what forks meanwhile is
    found on the next pass)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        victims = _below(os.getpid())
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.01)
    while True:  # the last ones' exit statuses
        try:
            os.wait()
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"vminit: prctl: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise)
    code = 0
    try:
        child = os.posix_spawn(argv[0], argv, dict(os.environ))
        while True:
            pid, status = os.wait()
            if pid == child:  # the sshd ended: the host is down
                code = os.waitstatus_to_exitcode(status)
                break
    except _Stop:
        pass
    except ChildProcessError:
        return code
    _kill_below()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
