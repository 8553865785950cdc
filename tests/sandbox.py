"""Try multihost without a cloud: the loopback fleet and the stand-in cloud, started and
stopped by one command, for a shell that then uses ``--prefix``, ``up``, ``down`` and ``job``.

    sudo python -m tests.sandbox up [--hosts N]    # from a checkout; root: users and sshds
    eval "$(python -m tests.sandbox env)"          # this shell now talks to the stand-ins
    python -m tests.sandbox down                   # stops everything, removes the state dir

``up`` starts one background process (its pid in ``STATE/pid``) that runs the fleet (one sshd
and one Unix user per host, ``tests/fleet.py``) and the stand-in servers (``tests/cloud``: the
TPU API, fake-gcs-server with bucket ``mh-test``, Secret Manager) until ``down`` asks it to stop.
STATE is ``$MULTIHOST_SANDBOX_DIR`` (default ``/tmp/multihost-sandbox``), 0700; the fleet's
port and user names come from ``MULTIHOST_FLEET_PORT`` and ``MULTIHOST_FLEET_USER`` as for
``tests/fleet.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests import fleet as loopback

STATE = Path(os.environ.get("MULTIHOST_SANDBOX_DIR", "/tmp/multihost-sandbox"))
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parent.parent  # the checkout: ``-m tests.sandbox`` runs there


class Refused(Exception):
    """Bad use: one line, exit 2."""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().find(b"tests.sandbox") >= 0
    except OSError:
        return False


def running_pid(state: Path = STATE) -> int | None:
    """The background process's pid, if it runs."""
    try:
        pid = int((state / "pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def fleet_dir_of(state: Path) -> Path:
    """Beside the state dir, not in it: each host's sshd reads ``authorized_keys`` there as
    that host's user, who may not enter the 0700 state dir."""
    return state.with_name(state.name + "-fleet")


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _ssh_config(fleet: loopback.Fleet) -> str:
    """Host blocks for the workers' addresses (what the TPU API reports), as a user has them."""
    blocks = []
    for h in fleet.hosts:
        blocks.append(
            f"Host {h.address}\n  Port {h.port}\n  User {h.user}\n"
            f"  UserKnownHostsFile {fleet.known_hosts}\n"
        )
    blocks.append(f"Host *\n  IdentityFile {fleet.key}\n  IdentitiesOnly yes\n  BatchMode yes\n")
    return "\n".join(blocks)


def _exports(env: dict[str, str], state: Path) -> str:
    chosen = {k: v for k, v in env.items() if k.startswith("CLOUDSDK_") and os.environ.get(k) != v}
    chosen["MULTIHOST_LOG_DIR"] = str(state / "logs")
    chosen["XDG_CONFIG_HOME"] = str(state / "config")  # multihost's config.toml, below
    chosen["XDG_STATE_HOME"] = str(state / "xdg-state")  # the sandbox's pod records
    chosen["MULTIHOST_SANDBOX_DIR"] = str(state)
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(chosen.items()))


def serve(hosts: int, state: Path) -> None:
    """The background process: the fleet and the stand-ins until SIGTERM."""
    from tests.cloud.fixture import standin

    tempfile.tempdir = str(state)  # the stand-ins' files (gcloud config, GCS) in the state dir
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    fleet_dir = fleet_dir_of(state)
    try:
        fleet = loopback.up(hosts, fleet_dir)
        with standin(fleet) as cloud:
            # its VMs serve what a real TPU VM serves to an SSH session: the metadata server
            # (the queued resource's name, the token) and gcloud, so autodown can delete a pod
            cloud.tpu.vm_image = True
            _write(state / "ssh_config", _ssh_config(fleet))
            config = state / "config" / "multihost"
            config.mkdir(parents=True, mode=0o700)
            _write(
                config / "config.toml",
                f'ssh-config = "{state / "ssh_config"}"\nno-add-key = true\n',
            )
            (state / "xdg-state").mkdir(mode=0o700, exist_ok=True)
            _write(state / "env", _exports(cloud.env, state))
            print(f"sandbox: {hosts} hosts, TPU API {cloud.tpu.endpoint}", flush=True)
            stop.wait()
            cloud.tpu.reset()  # the pods still up: their workers' processes killed
            cloud.guest.forget()
    finally:
        loopback.down(fleet_dir)
        (state / "env").unlink(missing_ok=True)


def _kill_leftovers(state: Path) -> None:
    """After a background process that was killed: its fleet, and what it started (their
    command lines name the state dir: fake-gcs-server)."""
    loopback.down(fleet_dir_of(state))
    mark = f"{state}/".encode()
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if p.name.isdigit() and mark in (p / "cmdline").read_bytes():
                os.kill(int(p.name), signal.SIGKILL)


def up(hosts: int, state: Path) -> int:
    if os.geteuid() != 0:
        raise Refused("sandbox: needs root (it makes one Unix user and one sshd per host)")
    if running_pid(state) is not None:
        raise Refused(f"sandbox: already up ({state}); `python -m tests.sandbox down` first")
    if not 1 <= hosts <= 64:
        raise Refused(f"sandbox: --hosts must be 1..64, not {hosts}")
    taken = _taken_addresses(hosts)
    if taken:
        raise Refused(
            f"sandbox: {taken[0]} is taken (by another loopback fleet? `python tests/fleet.py "
            "down` stops the tests' own; MULTIHOST_FLEET_PORT=N puts the sandbox on another port)"
        )
    shutil.rmtree(state, ignore_errors=True)  # what a killed one left
    shutil.rmtree(fleet_dir_of(state), ignore_errors=True)
    state.mkdir(mode=0o700, parents=True)
    os.chmod(state, 0o700)
    with open(state / "log", "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.sandbox",
                "serve",
                "--hosts",
                str(hosts),
                "--dir",
                str(state),
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _write(state / "pid", f"{proc.pid}\n")
    deadline = time.monotonic() + READY_TIMEOUT
    while not (state / "env").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            tail = (state / "log").read_text().strip().splitlines()[-5:]
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(fleet_dir_of(state), ignore_errors=True)
            print("sandbox: did not start:\n  " + "\n  ".join(tail), file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"sandbox: up, {hosts} hosts (state in {state}); in your shell:", file=sys.stderr)
    print('  eval "$(python -m tests.sandbox env)"', file=sys.stderr)
    return 0


def _taken_addresses(hosts: int) -> list[str]:
    """The hosts' ADDRESS:PORT that something already listens on (their sshd could not)."""
    taken = []
    for i in range(hosts):
        where = (loopback.address(i), loopback.PORT)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # only a listener blocks it
            try:
                s.bind(where)
            except OSError:
                taken.append(f"{where[0]}:{where[1]}")
    return taken


def env(state: Path) -> int:
    if running_pid(state) is None or not (state / "env").exists():
        raise Refused("sandbox: not up; `sudo python -m tests.sandbox up` first")
    sys.stdout.write((state / "env").read_text())
    return 0


def down(state: Path) -> int:
    pid = running_pid(state)
    if pid is None:
        if state.exists():  # a killed one's leftovers
            _kill_leftovers(state)
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(fleet_dir_of(state), ignore_errors=True)
            raise Refused("sandbox: not up (removed what a stopped one left)")
        raise Refused("sandbox: not up")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _kill_leftovers(state)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(fleet_dir_of(state), ignore_errors=True)
    print("sandbox: down; nothing left", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sandbox", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("action", choices=["up", "down", "env", "serve"])
    parser.add_argument("--hosts", type=int, default=8, help="loopback hosts (default 8)")
    parser.add_argument("--dir", type=Path, default=STATE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    state = args.dir.resolve()
    try:
        if args.action == "serve":
            serve(args.hosts, state)
            return 0
        return {
            "up": lambda: up(args.hosts, state),
            "env": lambda: env(state),
            "down": lambda: down(state),
        }[args.action]()
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
