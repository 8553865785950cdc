"""Stale accelerator holders: a POSIX sh script that finds (and stops) them, and its parser.

The script prints one fact a line; `parse_stale` reads them back:

    scope root|user           user: not root and no passwordless sudo, so only own processes
    device <path>             an accelerator device file that exists
    holder <pid> <device> <comm>
    lockfile <path>           the libtpu lockfile exists
    killed <pid> TERM|KILL    the holder is gone, after this signal
    survived <pid>            the holder still runs after SIGKILL
    removed <path>            the lockfile was removed
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from multihost.defaults import DEFAULTS
from multihost.remote import load, script

DEFAULT_DEVICE_GLOB = "/dev/accel* /dev/vfio/[0-9]*"
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
DEVICE_GLOB_ENV = "MULTIHOST_DEVICE_GLOB"

# Runs as root when it can (stale.sh, which runs stale_body.sh).
STALE = load("stale")  # body devglob lock kill ticks
STALE_BODY = load("stale_body")  # devglob lock kill ticks


def stale_command(
    *,
    kill: bool,
    device_glob: str | None = None,
    grace: float = DEFAULTS.stale_grace,
    lockfile: str = LIBTPU_LOCKFILE,
) -> str:
    """A POSIX sh script (for `sh -c`) reporting, and with kill stopping, accelerator holders."""
    if not (math.isfinite(grace) and grace >= 0):
        raise ValueError(f"grace must be a finite number of seconds >= 0, not {grace!r}")
    return script(
        STALE,
        body=STALE_BODY.text,
        devglob=device_glob or DEFAULT_DEVICE_GLOB,
        lock=lockfile,
        kill=1 if kill else 0,
        ticks=math.ceil(grace * 10),
    )


@dataclass(frozen=True)
class Holder:
    """A process with an accelerator device file open."""

    pid: int
    comm: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class StaleReport:
    """What the stale script saw on one host, and what it stopped."""

    holders: tuple[Holder, ...] = ()
    lockfile: str | None = None
    killed: tuple[tuple[int, str], ...] = ()
    removed_lockfile: bool = False
    survivors: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    scope: str = ""

    @property
    def remaining(self) -> tuple[Holder, ...]:
        """Holders that were not stopped."""
        stopped = {pid for pid, _ in self.killed}
        return tuple(h for h in self.holders if h.pid not in stopped)

    def summary(self) -> str:
        """One line for humans: who holds what, what was stopped, the lockfile."""
        signals = dict(self.killed)
        parts = []
        for h in self.holders:
            who = f"pid {h.pid} ({h.comm})"
            devices = ", ".join(h.devices)
            if h.pid in signals:
                parts.append(f"{who} held {devices}: stopped with {signals[h.pid]}")
            elif h.pid in self.survivors:
                parts.append(f"{who} holds {devices}: still running after KILL")
            else:
                parts.append(f"{who} holds {devices}")
        if not parts:
            found = "no process holds an accelerator"
            parts.append(found if self.devices else "no accelerator device files found")
        if self.removed_lockfile:
            parts.append(f"removed {self.lockfile or 'the lockfile'}")
        elif self.lockfile:
            parts.append(f"{self.lockfile} present")
        if self.scope == "user":
            parts.append("only this user's processes checked (not root, no passwordless sudo)")
        return "; ".join(parts)


def parse_stale(output: str) -> StaleReport:
    """Read the stale script's output back; lines it does not know are ignored."""
    holders: dict[int, tuple[str, list[str]]] = {}
    killed: list[tuple[int, str]] = []
    survivors: list[int] = []
    devices: list[str] = []
    lockfile: str | None = None
    removed = False
    scope = ""
    for line in output.splitlines():
        kind, _, rest = line.strip().partition(" ")
        fields = rest.split(" ", 2)
        try:
            if kind == "holder" and len(fields) >= 2:
                comm = fields[2] if len(fields) > 2 else "?"
                holders.setdefault(int(fields[0]), (comm, []))[1].append(fields[1])
            elif kind == "killed" and len(fields) == 2 and fields[1] in ("TERM", "KILL"):
                killed.append((int(fields[0]), fields[1]))
            elif kind == "survived" and rest:
                survivors.append(int(rest))
        except ValueError:
            continue
        if kind == "device" and rest:
            devices.append(rest)
        elif kind == "lockfile" and rest:
            lockfile = rest
        elif kind == "removed" and rest:
            lockfile, removed = lockfile or rest, True
        elif kind == "scope" and rest in ("root", "user"):
            scope = rest
    return StaleReport(
        holders=tuple(Holder(pid, c, tuple(d)) for pid, (c, d) in holders.items()),
        lockfile=lockfile,
        killed=tuple(killed),
        removed_lockfile=removed,
        survivors=tuple(survivors),
        devices=tuple(devices),
        scope=scope,
    )
