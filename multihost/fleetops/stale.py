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
import shlex
from dataclasses import dataclass

from multihost.defaults import DEFAULTS

DEFAULT_DEVICE_GLOB = "/dev/accel* /dev/vfio/[0-9]*"
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
DEVICE_GLOB_ENV = "MULTIHOST_DEVICE_GLOB"

# Runs as root when it can. Holders are found by stat-ing /proc/*/fd/* (-ef: same device and
# inode; only character devices when every device is one), so lsof is not needed and no
# process is forked per descriptor. The script's own shell and its parent (sudo) are skipped.
_BODY = """\
devglob=@GLOB@ lock=@LOCK@ kill=@KILL@ ticks=@TICKS@ me=$$ parent=$PPID
if [ "$(id -u)" = 0 ]; then echo "scope root"; else echo "scope user"; fi
set --
for d in $devglob; do
  if [ -e "$d" ]; then echo "device $d"; set -- "$@" "$d"; fi
done
holders='' seen='' chars=1
for d in "$@"; do [ -c "$d" ] || chars=0; done
if [ $# -gt 0 ]; then
  for f in /proc/[0-9]*/fd/*; do
    [ "$chars" = 0 ] || [ -c "$f" ] || continue
    p=${f#/proc/}; p=${p%%/*}
    [ "$p" = "$me" ] || [ "$p" = "$parent" ] && continue
    for d in "$@"; do
      [ "$f" -ef "$d" ] || continue
      case " $seen " in *" $p:$d "*) continue ;; esac
      seen="$seen $p:$d"
      { read -r comm < "/proc/$p/comm"; } 2>/dev/null || comm="?"
      echo "holder $p $d $comm"
      case " $holders " in *" $p "*) ;; *) holders="$holders $p" ;; esac
    done
  done
fi
[ -e "$lock" ] && echo "lockfile $lock"
[ "$kill" = 1 ] || exit 0
alive() {
  { read -r st < "/proc/$1/stat"; } 2>/dev/null || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}
nap() { sleep 0.1 2>/dev/null || { sleep 1; t=$((t + 9)); }; }
await() {
  t=0
  while [ "$t" -lt "$1" ]; do
    left=
    for p in $holders; do alive "$p" && left=1; done
    [ -z "$left" ] && return 0
    nap; t=$((t + 1))
  done
}
if [ -n "$holders" ]; then
  for p in $holders; do kill -s TERM "$p" 2>/dev/null; done
  await "$ticks"
  hard=
  for p in $holders; do
    if alive "$p"; then kill -s KILL "$p" 2>/dev/null; hard="$hard $p"
    else echo "killed $p TERM"; fi
  done
  holders=$hard
  await 30
  for p in $hard; do
    if alive "$p"; then echo "survived $p"; else echo "killed $p KILL"; fi
  done
fi
if [ -e "$lock" ]; then rm -f "$lock" && echo "removed $lock"; fi
exit 0
"""

_WRAPPER = """\
# shellcheck disable=SC2016 # the body is code for the shell that runs it, not for this one
body=@BODY@
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  exec sudo -n sh -c "$body"
fi
eval "$body"
"""


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
    body = (
        _BODY.replace("@GLOB@", shlex.quote(device_glob or DEFAULT_DEVICE_GLOB))
        .replace("@LOCK@", shlex.quote(lockfile))
        .replace("@KILL@", "1" if kill else "0")
        .replace("@TICKS@", str(math.ceil(grace * 10)))
    )
    return _WRAPPER.replace("@BODY@", shlex.quote(body))


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
