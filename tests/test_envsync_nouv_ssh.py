"""A runner without uv (no uv on PATH, no ``uv`` package): the lock is checked where uv is, on
the builder or on a host that has uv, on the real sshd fleet against an index served here. The
runner is the real CLI run by a Python that has every package of the test venv but ``uv``."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from multihost.defaults import DEFAULTS
from multihost.envsync.uvbin import uv_binary
from tests import fleet as loopback
from tests.clitools import no_processes
from tests.helpers import wait_for
from tests.pyindex import Index, tinyab, uv_project

pytestmark = pytest.mark.usefixtures("fresh_runs")
N = 4
PATH = "/usr/local/bin:/usr/bin:/bin"  # this machine's programs: no uv among them
BASE = ".multihost-nouv"  # a remote dir of its own: no uv shipped there by another test
TOUCH = "/tmp/mh-nouv-$MULTIHOST_TEST_HOST"  # what the job leaves where it starts


def python_without_uv(root: Path) -> Path:
    """A venv whose site-packages are the test venv's, the ``uv`` package left out."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (site,) = (root / "lib").glob("python*/site-packages")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name != "uv" and not entry.name.startswith("uv-"):
            (site / entry.name).symlink_to(entry)
    return root / "bin" / "python"


@dataclass
class Runner:
    """The CLI without uv, the index (with a wheel of the real uv binary for the builder's
    pip to fetch), and the project."""

    python: Path
    env: dict[str, str]
    index: Index
    uv_wheel: str
    project: Path
    fleet: loopback.Fleet
    tmp: Path

    def run(self, name: str) -> subprocess.CompletedProcess[str]:
        argv = [
            str(self.python),
            "-m",
            "multihost",
            "run",
            "--hosts",
            "h0,h1,h2,h3",
            "--ssh-config",
            str(self.fleet.ssh_config),
            "--script-dir",
            str(self.project),
            "--log-dir",
            str(self.tmp / "logs"),
            "--remote-dir",
            f"~/{BASE}",
            "--run-name",
            name,
            "--cmd",
            f"touch {TOUCH}",
        ]
        return subprocess.run(
            argv,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )

    def stale(self) -> None:
        """pyproject.toml asks for more than uv.lock has."""
        text = (self.project / "pyproject.toml").read_text()
        (self.project / "pyproject.toml").write_text(
            text.replace('["tinya"]', '["tinya", "tinyb"]')
        )

    def refused(self, res: subprocess.CompletedProcess[str], name: str, where: str) -> None:
        """Exit 2 naming the lock and ``uv lock``; nothing started on any host."""
        assert res.returncode == 2, res.stderr
        error = res.stderr.strip().splitlines()[-1]
        said = (
            f"multihost: error: {self.project / 'uv.lock'} is out of date with "
            f"pyproject.toml: run `uv lock` (nothing started; checked on {where}"
        )
        assert error.startswith(said), error
        assert "Traceback" not in res.stderr
        assert not [p for p in self.index.hits if p.startswith("/files/tiny")]  # nothing synced
        assert not [h for h in self.fleet.hosts[:N] if Path(f"/tmp/mh-nouv-{h.alias}").exists()]
        for h in self.fleet.hosts[:N]:
            assert not (h.home / BASE / "runs" / name).exists()
        wait_for(lambda: no_processes(self.fleet, N), 10, "host processes to end")


@pytest.fixture
def runner(ssh_fleet: loopback.Fleet, tmp_path: Path) -> Iterator[Runner]:
    if shutil.which("uv", path=PATH):
        pytest.skip(f"uv is on {PATH}: no runner without uv here")
    python = python_without_uv(tmp_path / "nouv")
    env = {"PATH": PATH, "HOME": str(tmp_path / "home"), "COLUMNS": "300"}
    probe = subprocess.run(
        [python, "-c", "from multihost.envsync.uvbin import uv_binary; print(uv_binary())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "None", probe  # the runner has no uv at all
    real = uv_binary()
    assert real is not None
    index = tinyab(tmp_path / "index")
    tag = f"py3-none-manylinux_2_17_{platform.machine()}"
    wheel = index.add(
        "uv",
        DEFAULTS.uv_version,
        {f"uv-{DEFAULTS.uv_version}.data/scripts/uv": Path(real).read_bytes()},
        tag=tag,
    )
    homes = [h.home for h in ssh_fleet.hosts[:N]]
    conf = homes[0] / ".config" / "pip" / "pip.conf"  # the builder's pip finds uv there
    made = not (homes[0] / ".config").exists()
    for h in ssh_fleet.hosts[:N]:
        Path(f"/tmp/mh-nouv-{h.alias}").unlink(missing_ok=True)
    try:
        with index.serving():
            project = uv_project(tmp_path / "proj", index.url)
            index.hits.clear()
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(f"[global]\nindex-url = {index.url}\n")
            yield Runner(python, env, index, wheel.name, project, ssh_fleet, tmp_path)
    finally:
        shutil.rmtree(homes[0] / ".config" if made else conf.parent, ignore_errors=True)
        for home in homes:
            shutil.rmtree(home / BASE, ignore_errors=True)


def test_a_stale_lock_is_refused_by_the_builder(runner: Runner) -> None:
    """The runner cannot check the lock: the builder (which fetches uv with its own pip)
    does, before it syncs anything."""
    runner.stale()
    res = runner.run("stale")
    runner.refused(res, "stale", "the builder s0/w0 (")
    assert runner.index.hits[f"/files/{runner.uv_wheel}"] == 1  # the builder's uv, to check
    for h in runner.fleet.hosts[:N]:
        envs = h.home / BASE / "envs"
        assert not envs.exists() or not [p for p in envs.iterdir() if p.is_dir()]


def test_a_stale_lock_is_refused_when_nothing_is_built(runner: Runner) -> None:
    """The environment is on every host already and pyproject.toml changes (the lock, and so
    the key, does not): a host with uv (the one that built it) checks the lock."""
    res = runner.run("fresh")
    assert res.returncode == 0, res.stderr
    assert "built on s0/w0" in res.stderr
    for h in runner.fleet.hosts[:N]:
        Path(f"/tmp/mh-nouv-{h.alias}").unlink()
    runner.index.hits.clear()
    runner.stale()
    res = runner.run("stale")
    runner.refused(res, "stale", "s0/w0 (")
    assert not runner.index.hits  # checked offline: nothing asked of the index
