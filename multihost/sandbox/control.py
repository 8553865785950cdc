"""``multihost sandbox up|env|down``: the sandbox's background process started, its shell
settings printed, everything it started stopped and its state dir removed.

The state dir is ``$MULTIHOST_SANDBOX_DIR``, else ``$XDG_STATE_HOME/multihost/sandbox``
(``~/.local/state/multihost/sandbox``), 0700; nothing of the sandbox is anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multihost.cloud.gcloud import binary, require
from multihost.defaults import DEFAULTS
from multihost.errors import GcloudMissing, MultihostError, UsageError
from multihost.sandbox import procs
from multihost.sandbox.hosts import MARK, find_client, find_sshd
from multihost.sandbox.serve import FAILED, READY
from multihost.sandbox.standin import gcs

DIR_ENV = "MULTIHOST_SANDBOX_DIR"
MAX_HOSTS = 64  # 127.0.0.2 to 127.0.0.65
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
SERVE = "multihost.sandbox.serve"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$MULTIHOST_SANDBOX_DIR``, else the user's state dir's ``multihost/sandbox``."""
    env = os.environ if env is None else env
    if env.get(DIR_ENV):
        return Path(env[DIR_ENV]).expanduser().absolute()
    home = env.get("HOME") or str(Path.home())
    base = env.get("XDG_STATE_HOME") or f"{home}/.local/state"
    return Path(base).expanduser().absolute() / "multihost" / "sandbox"


def _serves(pid: int, state: Path) -> bool:
    """Whether ``pid`` is the background process of the sandbox in ``state``."""
    argv = procs.cmdline(pid)
    return SERVE in argv and str(state) in argv


def running_pid(state: Path) -> int | None:
    """The background process's pid, if it runs."""
    try:
        pid = int((state / "pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if procs.alive(pid) and _serves(pid, state) else None


def _started_here(pid: int, state: Path) -> bool:
    """One of the processes the sandbox in ``state`` started, by its command line (its
    background process, a host's init or sshd, fake-gcs-server), or one of a host's, by the
    mark in its environment."""
    if _serves(pid, state):
        return True
    argv = procs.cmdline(pid)
    hosts = f"{state}/hosts/"
    if any(a.startswith(hosts) and a.endswith("/sshd_config") for a in argv):
        return True
    if f"{state}/gcs" in argv:
        return True
    return procs.environ_has(pid, f"{MARK}={hosts}".encode())


def leftovers(state: Path) -> set[int]:
    """Every live process of the sandbox in ``state`` and what is below them (never this
    process nor one above it)."""
    mine = procs.ancestors(os.getpid())
    found = procs.matching(lambda pid: pid not in mine and _started_here(pid, state))
    return (found | procs.below(found)) - mine


def _clean(state: Path) -> int:
    """Kill what a sandbox left, remove its state dir; how many processes were killed."""
    victims = leftovers(state)
    still = procs.kill(victims)
    if still:
        raise MultihostError(f"sandbox: processes {sorted(still)} would not die")
    try:
        made = (state / "made").read_text().split("\n")
    except OSError:
        made = []
    shutil.rmtree(state, ignore_errors=True)
    for d in reversed([m for m in made if m]):  # the folders `up` made above it, if empty
        with contextlib.suppress(OSError):
            os.rmdir(d)
    return len(victims)


@dataclass(frozen=True)
class Started:
    """A sandbox that is up: where, how many hosts, how long ``up`` took."""

    state: Path
    hosts: int
    seconds: float


@dataclass(frozen=True)
class Stopped:
    """What ``down`` did: ``was_up``: its background process was running (else it removed
    what a stopped one left); ``killed``: processes it had to kill besides."""

    state: Path
    was_up: bool
    killed: int


def check(state: Path, hosts: int, sshd: str | None) -> str:
    """Everything ``up`` needs, refused before anything starts (one line, exit 2); the sshd."""
    if not sys.platform.startswith("linux"):
        raise UsageError("the sandbox needs Linux (its hosts listen on 127.0.0.2 and up)")
    if any(c.isspace() for c in str(state)):
        raise UsageError(f"the sandbox's dir must not contain whitespace: {state}")
    if running_pid(state) is not None:
        raise UsageError(f"the sandbox is already up ({state}); `multihost sandbox down` first")
    if not 1 <= hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts must be 1..{MAX_HOSTS}, not {hosts}")
    found = find_sshd(sshd)
    find_client("ssh")
    find_client("ssh-keygen")
    try:
        require()
    except GcloudMissing:  # the user's own gcloud is what talks to the stand-ins
        raise UsageError(
            f"the sandbox needs the Google Cloud CLI: {binary()!r} not found (install it: "
            "https://cloud.google.com/sdk/docs/install)"
        ) from None
    if gcs.binary() is None:
        raise UsageError(f"the sandbox needs {gcs.MISSING}")
    return found


def up(
    hosts: int = DEFAULTS.sandbox_hosts, sshd: str | None = None, state: Path | None = None
) -> Started:
    """Start the sandbox: returns once its hosts and the stand-in cloud answer."""
    t0 = time.monotonic()
    state = state or state_dir()
    found = check(state, hosts, sshd)
    if state.exists():  # what a killed one left
        _clean(state)
    made = [p for p in reversed(state.parents) if not p.exists()]  # removed again by `down`
    for d in (*made, state):
        d.mkdir(mode=0o700)
    (state / "made").write_text("".join(f"{d}\n" for d in made))
    argv = [sys.executable, "-m", SERVE, "--dir", str(state), "--hosts", str(hosts)]
    with open(state / "log", "w") as log:
        proc = subprocess.Popen(
            [*argv, "--sshd", found],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not the terminal's: a Ctrl-C there leaves it running
        )
    (state / "pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while not (state / READY).exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise MultihostError(f"the sandbox did not start: {_why(state, proc)}")
            time.sleep(0.02)
    except BaseException:  # it failed, or Ctrl-C: nothing of it left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _clean(state)
        raise
    return Started(state, hosts, time.monotonic() - t0)


def _why(state: Path, proc: subprocess.Popen[bytes]) -> str:
    """What the background process said when it gave up (else its log's last lines)."""
    lines = (state / "log").read_text(errors="replace").strip().splitlines()
    said = [ln[len(FAILED) :] for ln in lines if ln.startswith(FAILED)]
    if said:
        return said[-1]
    if proc.poll() is None:
        return f"not ready after {READY_TIMEOUT:.0f} s"
    return "\n  ".join(["its log ends:", *lines[-5:]])


def env(state: Path | None = None) -> str:
    """The shell's ``export`` lines (``eval "$(multihost sandbox env)"``)."""
    state = state or state_dir()
    if running_pid(state) is None or not (state / READY).exists():
        raise UsageError(f"the sandbox is not up ({state}); `multihost sandbox up` first")
    return (state / READY).read_text()


def down(state: Path | None = None) -> Stopped:
    """Stop every process the sandbox started (the pods' too) and remove its state dir."""
    state = state or state_dir()
    pid = running_pid(state)
    if pid is None:
        if not state.exists():
            raise UsageError(f"the sandbox is not up ({state})")
        return Stopped(state, False, _clean(state))
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return Stopped(state, True, _clean(state))
