"""The tests' gcloud (tests/gcloud_zygote.py) is the real gcloud: the same command run both
ways prints the same and exits the same; the environment it runs with is bin/gcloud's own;
a caller killed mid-command leaves no process behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from tests import gcloud_zygote
from tests.helpers import wait_for

pytestmark = pytest.mark.skipif(
    not os.environ.get(gcloud_zygote.SOCKET_ENV), reason="the gcloud zygote is off"
)
SHIM = str(gcloud_zygote.BIN_DIR / "gcloud")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "cfg").mkdir(exist_ok=True)
    return {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp_path / "cfg"),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        **extra,
    }


def _both(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    runs = []
    for switch in ("1", "0"):
        runs.append(
            subprocess.run(
                [SHIM, *argv],
                env=env | {gcloud_zygote.OFF_ENV: switch},
                capture_output=True,
                text=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
        )
    return tuple(runs)


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "list", "--format=json"],
        ["config", "get", "core/project"],
        ["compute", "tpus", "tpu-vm", "list", "--zone"],  # a usage error: exit 2
        ["nonsense"],
        ["info", "--format=json(basic.python_location,installation.python_path,config.paths)"],
    ],
)
def test_the_same_command_both_ways_prints_and_exits_the_same(
    argv: list[str], tmp_path: Path
) -> None:
    env = _env(tmp_path, CLOUDSDK_CORE_PROJECT="p")
    forked, plain = _both(argv, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )


def test_a_config_written_by_one_call_is_read_by_the_next(tmp_path: Path) -> None:
    """A file the import read, changed: the next call does not get a stale import."""
    env = _env(tmp_path)
    for zone in ("info", "error"):
        subprocess.run([SHIM, "config", "set", "core/verbosity", zone], env=env, check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        got = subprocess.run([SHIM, "config", "get", "core/verbosity"], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert got.stdout.strip() == zone


def test_the_environment_is_the_wrappers(tmp_path: Path) -> None:
    """bin/gcloud itself, run in a copy of the SDK's layout whose Python prints its
    environment, gives gcloud.py what ``wrapper_env`` gives the forked gcloud."""
    root = tmp_path / "sdk"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    python = root / "platform" / "bundledpythonunix" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    real_root = gcloud_zygote.sdk_root(shutil.which("gcloud", path=_plain_path()) or "")
    shutil.copy(f"{real_root}/bin/gcloud", root / "bin" / "gcloud")
    python.write_text('#!/bin/sh\n[ "$1" = --version ] && exit 0\nexec env -0\n')
    python.chmod(0o755)
    (tmp_path / "link").symlink_to(root / "bin" / "gcloud")
    for env in (
        {"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        {
            "PATH": os.environ["PATH"],
            "PYTHONHOME": "/x",
            "CLOUDSDK_PYTHON_ARGS": "-S -B",
            "PYTHONIOENCODING": "latin-1",
            "VIRTUAL_ENV": "/v",
        },
    ):
        for gcloud in (str(root / "bin" / "gcloud"), str(tmp_path / "link")):
            ran = subprocess.run([gcloud], env=env, capture_output=True, text=True, check=True)
            want = dict(line.split("=", 1) for line in ran.stdout.split("\0") if line)
            want.pop("PWD", None)
            want.pop("SHLVL", None)
            want.pop("_", None)
            got = gcloud_zygote.wrapper_env(env, gcloud)
            assert got is not None
            assert {
                k: (got.get(k), want.get(k)) for k in {*got, *want} if got.get(k) != want.get(k)
            } == {}


def _plain_path() -> str:
    return os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if p != str(gcloud_zygote.BIN_DIR)
    )


def _in(cwd: Path) -> list[int]:
    """Processes whose working directory is ``cwd``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/cwd") == str(cwd):
                    found.append(int(name))
            except OSError:
                pass
    return found


def test_a_killed_caller_leaves_no_gcloud(tmp_path: Path) -> None:
    """The product kills a hung gcloud's process group (SIGKILL): the forked gcloud and what
    it started go too, as a plain gcloud's would."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
    mark = tmp_path / f"call-{uuid.uuid4().hex}"
    mark.mkdir()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}/"
    env = _env(tmp_path, CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=endpoint)
    proc = subprocess.Popen(
        [SHIM, "compute", "tpus", "tpu-vm", "list", "--zone", "z", "--project", "p"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=mark,
    )
    try:
        wait_for(lambda: held, 60, "gcloud to reach the silent server")
        pids = _in(mark)
        cmds = [Path(f"/proc/{p}/cmdline").read_bytes() for p in pids]
        assert len(pids) >= 2, f"the shim and the forked gcloud: {cmds}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        wait_for(lambda: not _in(mark), 10, "the forked gcloud to go")
    finally:
        if proc.poll() is None:
            proc.kill()
        for s in (*held, server):
            s.close()


def test_a_signal_to_the_caller_ends_the_command_as_it_would_plain(tmp_path: Path) -> None:
    """SIGTERM to the shim reaches gcloud; the shim dies of it, as gcloud itself would."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}/"
    env = _env(tmp_path, CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=endpoint)
    codes = []
    try:
        for switch in ("1", "0"):
            accepted = threading.Event()
            conns: list[socket.socket] = []

            def take(
                conns: list[socket.socket] = conns, accepted: threading.Event = accepted
            ) -> None:
                conns.append(server.accept()[0])
                accepted.set()

            threading.Thread(target=take, daemon=True).start()
            proc = subprocess.Popen(
                [SHIM, "compute", "tpus", "tpu-vm", "list", "--zone", "z", "--project", "p"],
                env=env | {gcloud_zygote.OFF_ENV: switch},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            assert accepted.wait(60)
            proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(30))
            for c in conns:
                c.close()
    finally:
        server.close()
    assert codes[0] == codes[1] == -signal.SIGTERM
