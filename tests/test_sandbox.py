"""``python -m tests.sandbox``, as the docs tell a user to run it: up, ``eval`` its env in a
shell, a pod's life (``up``, ``run --prefix``, ``down``), sandbox down; nothing left after."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
HOSTS = 2

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's fleet needs root"),
    pytest.mark.skipif(not os.access(loopback.SSHD, os.X_OK), reason=f"{loopback.SSHD} missing"),
]


@pytest.fixture
def sandbox_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Its own state dir (in /tmp: the fleet's users read the fleet dir beside it), port and
    user names, so it runs beside the session's fleet."""
    state = Path(f"/tmp/multihost-sandbox-test-{os.getpid()}")
    # beside this process's fleet (under pytest-xdist, its worker's): the sandbox is told its
    # port and users outright, not as a worker, which would move them again
    port = loopback.PORT + 400
    users = loopback.USER_PREFIX + "sb"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"} | {
        "MULTIHOST_SANDBOX_DIR": str(state),
        "MULTIHOST_FLEET_PORT": str(port),
        "MULTIHOST_FLEET_USER": users,
        "HOME": str(tmp_path / "home"),
    }
    (tmp_path / "home").mkdir()
    yield env
    subprocess.run(
        [sys.executable, "-m", "tests.sandbox", "down"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
    )
    # A user's sandbox keeps its users for the next `up`; the test's are the session's own.
    loopback.remove_users([f"{users}{i}" for i in range(HOSTS)])


def sandbox(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.sandbox", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def shell(env: dict[str, str], script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in a bash that first did what the docs say: eval the sandbox's env."""
    bin_dir = Path(sys.executable).parent
    prelude = (
        f'export PATH="{bin_dir}:$PATH"; cd {ROOT} && '
        f'eval "$(python -m tests.sandbox env)" && cd {cwd} && '
    )
    return subprocess.run(
        ["bash", "-c", prelude + script], env=env, capture_output=True, text=True, timeout=300
    )


def _parents() -> dict[int, int]:
    found = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                found[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return found


def descendants(root: int) -> set[int]:
    parents = _parents()
    found = {root}
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def started(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), None once it is gone or a zombie
    (dead, waiting for init to reap it); a pid reused is another process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def alive(pids: dict[int, int | None]) -> dict[int, str]:
    """Those of ``pids`` (with their start times) that still run, with their command lines."""
    left = {}
    for pid, since in pids.items():
        if since is not None and started(pid) == since:
            left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return left


def mentioning(text: str, pids: bool = False) -> list[str]:
    """The command lines (or the pids) of the processes whose command line has ``text``."""
    lines = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if p.name.isdigit() and text in cmd:
            lines.append(p.name if pids else cmd)
    return lines


def owned_by(users: list[str]) -> list[int]:
    uids = {pwd.getpwnam(u).pw_uid for u in users}
    owned = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and p.stat().st_uid in uids:
                owned.append(int(p.name))
        except OSError:
            pass
    return owned


def test_documented_sequence_then_nothing_left(sandbox_env: dict[str, str], tmp_path: Path) -> None:
    env = sandbox_env
    state = Path(env["MULTIHOST_SANDBOX_DIR"])
    res = sandbox(env, "up", "--hosts", str(HOSTS))
    assert res.returncode == 0, res.stderr
    assert 'eval "$(python -m tests.sandbox env)"' in res.stderr
    assert state.stat().st_mode & 0o777 == 0o700
    served = {p: started(p) for p in descendants(int((state / "pid").read_text()))}
    sshds = mentioning(f"{state}-fleet/hosts/")  # one per host, daemons of their own
    assert len(served) >= 2, served  # itself and fake-gcs-server
    assert len(sshds) == HOSTS, sshds
    again = sandbox(env, "up")
    assert (again.returncode, again.stderr.count("\n")) == (2, 1), again.stderr
    assert "already up" in again.stderr
    exported = sandbox(env, "env")
    assert "export CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=http://127.0.0.1:" in exported.stdout
    code = tmp_path / "code"
    code.mkdir()
    res = shell(
        env,
        "multihost up demo --tpu-type v4-16 --runtime-version "
        "tpu-ubuntu2204-base --zone us-central2-b",
        code,
    )
    assert res.returncode == 0, res.stderr
    assert "pod demo is up: 2/2 workers accept SSH" in res.stderr
    res = shell(env, "multihost run --prefix demo --cmd 'echo on $MULTIHOST_TEST_HOST'", code)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr  # host 0's lines, and every host's last line in the table
    assert "on h0" in res.stdout
    assert "on h1" in out
    assert "all 2 hosts succeeded" in out
    res = shell(env, "multihost down demo", code)
    assert res.returncode == 0, res.stderr
    assert "deleted pod demo in us-central2-b" in res.stderr
    users = [env["MULTIHOST_FLEET_USER"] + str(i) for i in range(HOSTS)]
    res = sandbox(env, "down")
    assert res.returncode == 0, res.stderr
    assert alive(served) == {}
    assert mentioning(str(state)) == []
    assert owned_by(users) == []
    assert loopback.scratch_of(users) == []  # the stand-in VMs' scratch in /tmp and /var/tmp
    assert not state.exists()
    assert not Path(f"{state}-fleet").exists()
    for argv in (["down"], ["env"]):
        res = sandbox(env, *argv)
        assert (res.returncode, res.stderr.count("\n")) == (2, 1), argv
        assert res.stderr.startswith("sandbox: not up"), argv


def test_not_root_is_one_line(sandbox_env: dict[str, str]) -> None:
    """As ``nobody``, with the system's python (the checkout's venv may be root's alone)."""
    nobody = pwd.getpwnam("nobody")
    res = subprocess.run(
        ["/usr/bin/python3", "-m", "tests.sandbox", "up"],
        cwd=ROOT,
        env=sandbox_env,
        capture_output=True,
        text=True,
        timeout=60,
        user=nobody.pw_uid,
        group=nobody.pw_gid,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr == "sandbox: needs root (it makes one Unix user and one sshd per host)\n"
    assert not Path(sandbox_env["MULTIHOST_SANDBOX_DIR"]).exists()


def test_a_taken_address_is_one_line_and_nothing_starts(sandbox_env: dict[str, str]) -> None:
    """Another fleet (the tests', a benchmark's) on the sandbox's first host address and port:
    ``up`` says so and how to get out of it, starts nothing, leaves no state dir."""
    port = int(sandbox_env["MULTIHOST_FLEET_PORT"])
    with socket.socket() as other:
        # an earlier test's connections to that port may linger in TIME_WAIT: only a listener
        # is what this test is about
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.2", port))
        other.listen()
        res = sandbox(sandbox_env, "up", "--hosts", "2")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"sandbox: 127.0.0.2:{port} is taken (by another loopback fleet?")
    assert len(res.stderr.splitlines()) == 1
    assert not Path(sandbox_env["MULTIHOST_SANDBOX_DIR"]).exists()
    assert not mentioning(sandbox_env["MULTIHOST_SANDBOX_DIR"])


def test_down_after_the_background_process_was_killed(sandbox_env: dict[str, str]) -> None:
    env = sandbox_env
    state = Path(env["MULTIHOST_SANDBOX_DIR"])
    res = sandbox(env, "up", "--hosts", "1")
    assert res.returncode == 0, res.stderr
    pid = int((state / "pid").read_text())
    served = {p: started(p) for p in descendants(pid)}
    sshds = {p: started(p) for p in map(int, mentioning(f"{state}-fleet/hosts/", pids=True))}
    os.kill(pid, signal.SIGKILL)
    res = sandbox(env, "down")
    assert res.returncode == 2, res.stderr
    assert res.stderr == "sandbox: not up (removed what a stopped one left)\n"
    assert alive(served | sshds) == {}
    assert mentioning(str(state)) == []
    assert not state.exists()
    assert not Path(f"{state}-fleet").exists()


def test_autodown_fires_in_the_sandbox(sandbox_env: dict[str, str], tmp_path: Path) -> None:
    """The try-it-without-a-cloud path shows autodown working: the sandbox's VMs serve what a
    real TPU VM serves (the queued resource's name, the project, a token, gcloud), so an idle
    pod deletes itself; ``up`` there needs no --zone (gcloud's default zone is the sandbox's)."""
    env = sandbox_env
    res = sandbox(env, "up", "--hosts", "1")
    assert res.returncode == 0, res.stderr
    code = tmp_path / "code"
    code.mkdir()
    res = shell(
        env,
        "multihost up idle --tpu-type v4-8 --runtime-version tpu-ubuntu2204-base --autodown 3",
        code,
    )
    assert res.returncode == 0, res.stderr
    assert "pod idle deletes itself once idle for 3 s (watched on s0/w0)" in res.stderr
    seen: list[str] = []

    def gone() -> bool:
        listed = shell(env, "multihost pods --json", code)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        seen.append(str(row["autodown"]))
        return row["state"] == "GONE"

    wait_for(gone, 120, "autodown to delete the idle pod")
    assert not [s for s in seen if "failed" in s], seen
    res = shell(env, "multihost gc", code)
    assert "deleted idle in us-central2-b: gone already (record only)" in res.stderr
    assert sandbox(env, "down").returncode == 0
