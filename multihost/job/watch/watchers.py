"""Who is watching a job from this machine, and a watch that needs no terminal.

Each watcher holds an exclusive ``flock`` on its own marker, ``jobs/NAME/watch.PID`` (0600,
"PID MODE STARTED"): the lock lives exactly as long as the process, so ``job status`` tells a
live watcher from a stale marker without trusting a pid. ``detach`` starts ``job watch`` in
its own session with its output appended to ``jobs/NAME/watch.log`` (0600): it survives the
terminal; what survives a reboot is the user's supervisor (a systemd user unit:
docs/how-to/jobs.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import MultihostError
from multihost.job.record import job_dir, local_dir

DETACHED_ENV = "MULTIHOST_WATCH_DETACHED"


@dataclass(frozen=True)
class Watching:
    pid: int
    mode: str  # "detached" or "terminal"
    since: float


@contextlib.contextmanager
def marker(name: str) -> Iterator[Path]:
    """This process watches job ``name`` until the block ends."""
    path = job_dir(name) / f"watch.{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        mode = "detached" if os.environ.get(DETACHED_ENV) else "terminal"
        os.write(fd, f"{os.getpid()} {mode} {time.time():.0f}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def watchers(name: str) -> list[Watching]:
    """Live watchers of job ``name`` on this machine; stale markers are removed."""
    found = []
    for path in sorted((local_dir() / name).glob("watch.[0-9]*")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its watcher lives
                pid, mode, since = (os.read(fd, 200).decode(errors="replace").split() + ["?"] * 3)[
                    :3
                ]
                found.append(
                    Watching(
                        int(pid) if pid.isdigit() else 0,
                        mode,
                        float(since) if since.isdigit() else 0.0,
                    )
                )
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        finally:
            os.close(fd)
    return found


def log_path(name: str) -> Path:
    return local_dir() / name / "watch.log"


def detach(name: str, argv: Sequence[str], *, wait: float = 20.0) -> tuple[int, Path]:
    """Start ``multihost job watch NAME ARGV...`` in its own session, output to its log;
    returns (pid, log) once it watches (MultihostError, with its log's end, if it ends first)."""
    log = log_path(name)
    job_dir(name)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multihost", "job", "watch", name, *argv],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            env=os.environ | {DETACHED_ENV: "1"},
            close_fds=True,
        )
    finally:
        os.close(fd)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if any(w.pid == proc.pid for w in watchers(name)):
            return proc.pid, log
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-2:]
            raise MultihostError(
                f"the detached watch of {name} ended at once (exit {proc.returncode}): "
                + " / ".join(tail)
            )
        time.sleep(0.1)
    return proc.pid, log
