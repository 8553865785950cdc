"""Autodown: the pod deletes itself once idle. The daemon is ``multihost/remote/autodown.sh``
(it runs on worker 0 of slice 0, with the VM's own credentials); this module builds the
commands that arm, disarm and read it over SSH, and reads its status line."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from importlib import resources

from multihost.defaults import DEFAULTS

# Arm (or disarm) the daemon. Args: BASE (multihost's remote dir), IDLE (seconds or "off"),
# TICK (seconds between looks), OWNER (the queued resource the state is for: a host reused by
# a later pod shows nothing of the earlier one's); the daemon's script on stdin. A daemon
# already running keeps running (it reads idle and since on each tick); else one is started
# detached. The command
# that starts it again after a reboot is written to DIR/reboot; with crontab on the host, an
# @reboot line runs it (the daemon restarts the idle timer when it starts). Says "armed cron"
# or "armed nocron" (no crontab: a reboot ends the watch until the next arm), or "off".
ARM = """\
umask 077
b=$1
case $b in \\~/*) b=$HOME/${b#\\~/} ;; esac
d=$b/autodown
mkdir -p "$d" || exit 1
cat > "$d/autodown.sh.tmp" && mv -f "$d/autodown.sh.tmp" "$d/autodown.sh" || exit 1
printf '%s\\n' "$2" > "$d/idle.tmp" && mv -f "$d/idle.tmp" "$d/idle" || exit 1
printf '%s\\n' "$4" > "$d/owner.tmp" && mv -f "$d/owner.tmp" "$d/owner" || exit 1
mark='# multihost-autodown'
line="sh '$d/autodown.sh' '$d' '$b/runs' $3 </dev/null >>'$d/log' 2>&1"
printf '%s\n' "$line" > "$d/reboot"
cron=nocron
if command -v crontab >/dev/null 2>&1; then
  { crontab -l 2>/dev/null | grep -v "$mark\\$"
    [ "$2" = off ] || echo "@reboot $line $mark"
  } | crontab - 2>/dev/null && cron=cron
fi
if [ "$2" = off ]; then echo off; exit 0; fi
date +%s > "$d/since"
setsid sh "$d/autodown.sh" "$d" "$b/runs" "$3" </dev/null >>"$d/log" 2>&1 &
echo "armed $cron"
"""

# The daemon's setting, its status line, and whether it runs (its pid alive, running the
# daemon), for one queued resource. Args: BASE, OWNER. State armed for another resource (a host
# reused by a later pod) or none at all: "off", "none".
STATUS = """\
b=$1
case $b in \\~/*) b=$HOME/${b#\\~/} ;; esac
d=$b/autodown
owner=
read -r owner < "$d/owner" 2>/dev/null
if [ "$owner" != "$2" ]; then printf 'off\\nnone\\nstopped\\n'; exit 0; fi
idle=off; st=none; pid=; run=stopped
read -r idle < "$d/idle" 2>/dev/null
read -r st < "$d/status" 2>/dev/null
read -r pid < "$d/pid" 2>/dev/null
case $pid in
  ''|*[!0-9]*) ;;
  *) grep -q autodown "/proc/$pid/cmdline" 2>/dev/null && run=running ;;
esac
echo "$idle"
echo "$st"
echo "$run"
"""


def script() -> str:
    return resources.files("multihost.remote").joinpath("autodown.sh").read_text()


def tick(seconds: float) -> int:
    """Seconds between the daemon's looks: 10, or less for a short idle time."""
    return max(1, min(10, int(seconds // 5)))


def owner(name: str, created_at: float) -> str:
    """Which queued resource autodown's state on a host is for: the pod's name and when its
    request was made (a later pod of the same name is another resource)."""
    return f"{name}@{int(created_at)}"


def arm_command(seconds: float | None, who: str, base: str = DEFAULTS.remote_dir) -> str:
    idle = "off" if seconds is None else str(math.ceil(seconds))
    every = tick(seconds or 10)
    return f"sh -c {shlex.quote(ARM)} sh {shlex.quote(base)} {idle} {every} {shlex.quote(who)}"


def status_command(who: str, base: str = DEFAULTS.remote_dir) -> str:
    return f"sh -c {shlex.quote(STATUS)} sh {shlex.quote(base)} {shlex.quote(who)}"


@dataclass(frozen=True)
class Status:
    """What the daemon on worker 0 last said: ``state`` busy, idle, deleted, failed, off or
    none (never armed for this pod); ``at`` when; ``words`` the rest (why busy, since when
    idle, why its delete failed); ``running``: whether the daemon runs now."""

    idle: float | None
    state: str
    at: float | None
    words: str
    running: bool = True

    def fires_in(self, now: float) -> float | None:
        """Seconds until the delete, when idle now; None when busy or off."""
        if self.state != "idle" or self.idle is None:
            return None
        since = self.words.removeprefix("since ").strip()
        try:
            return max(0.0, float(since) + self.idle - now)
        except ValueError:
            return None

    def describe(self, now: float) -> str:
        if self.state == "none":
            return "not armed on the pod"
        if self.idle is None:
            return "off"
        head = f"{self.idle:g}s idle"
        if not self.running and self.state in ("idle", "busy"):
            return f"{head}; its daemon is not running (it last said: {self.state})"
        fires = self.fires_in(now)
        if fires is not None:
            return f"{head}, fires in {fires:.0f}s"
        if self.state in ("busy", "failed"):
            return f"{head}; {self.state}: {self.words}"
        return f"{head}; {self.state}"


def parse_status(text: str) -> Status:
    lines = [*text.splitlines(), "", "", ""]
    idle = None if lines[0].strip() in ("off", "") else float(lines[0])
    state, _, rest = lines[1].strip().partition(" ")
    at, _, words = rest.partition(" ")
    try:
        when = float(at)
    except ValueError:
        when, words = None, rest
    return Status(idle, state or "none", when, words, lines[2].strip() != "stopped")
