"""A runner without uv (no uv on PATH, no ``uv`` package): the lock is checked where uv is, on
the builder, on the real sshd fleet against an index served here. The runner is the real CLI run
by a Python that has every package of the test venv but ``uv``."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from multihost.defaults import DEFAULTS
from multihost.envsync import uv_binary
from tests import fleet as loopback
from tests.clitools import no_processes
from tests.helpers import wait_for
from tests.pyindex import Index, tinyab, uv_project

pytestmark = pytest.mark.usefixtures("fresh_runs")
N = 4
PATH = "/usr/local/bin:/usr/bin:/bin"  # this machine's programs: no uv among them
BASE = ".multihost-nouv"  # a remote dir of its own: no uv shipped there by another test
TOUCH = "/tmp/mh-nouv-$MULTIHOST_TEST_HOST"  # what the job would leave, had it started


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    idx = tinyab(tmp_path / "index")
    with idx.serving():
        yield idx


def python_without_uv(root: Path) -> Path:
    """A venv whose site-packages are the test venv's, the ``uv`` package left out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    (site,) = (root / "lib").glob("python*/site-packages")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name != "uv" and not entry.name.startswith("uv-"):
            (site / entry.name).symlink_to(entry)
    return root / "bin" / "python"


def test_a_stale_lock_is_refused_by_the_builder(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    """pyproject.toml asks for more than uv.lock has, and the runner cannot check it: the
    builder (which fetches uv with its own pip) does, before it syncs anything; the run ends
    with exit 2 naming the lock and ``uv lock``, and nothing started on any host."""
    if shutil.which("uv", path=PATH):
        pytest.skip(f"uv is on {PATH}: no runner without uv here")
    python = python_without_uv(tmp_path / "nouv")
    env = {"PATH": PATH, "HOME": str(tmp_path / "home"), "COLUMNS": "300"}
    probe = subprocess.run([python, "-c", "from multihost.envsync import uv_binary; "
                            "print(uv_binary())"], env=env, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert probe.stdout.strip() == "None", probe  # the runner has no uv at all
    real = uv_binary()
    assert real is not None
    tag = f"py3-none-manylinux_2_17_{platform.machine()}"
    wheel = index.add("uv", DEFAULTS.uv_version,
                      {f"uv-{DEFAULTS.uv_version}.data/scripts/uv": Path(real).read_bytes()},
                      tag=tag)  # fmt: skip
    proj = uv_project(tmp_path / "proj", index.url)
    text = (proj / "pyproject.toml").read_text()
    (proj / "pyproject.toml").write_text(text.replace('["tinya"]', '["tinya", "tinyb"]'))
    index.hits.clear()
    homes = [ssh_fleet.hosts[i].home for i in range(N)]
    conf = homes[0] / ".config" / "pip" / "pip.conf"
    made = not (homes[0] / ".config").exists()
    marks = [Path(f"/tmp/mh-nouv-{h.alias}") for h in ssh_fleet.hosts[:N]]
    for m in marks:
        m.unlink(missing_ok=True)
    try:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(f"[global]\nindex-url = {index.url}\n")
        argv = [str(python), "-m", "multihost", "run", "--hosts", "h0,h1,h2,h3",
                "--ssh-config", str(ssh_fleet.ssh_config), "--script-dir", str(proj),
                "--log-dir", str(tmp_path / "logs"), "--remote-dir", f"~/{BASE}",
                "--run-name", "stale", "--cmd", f"touch {TOUCH}"]  # fmt: skip
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL)  # fmt: skip
        assert res.returncode == 2, res.stderr
        error = res.stderr.strip().splitlines()[-1]
        assert error.startswith(f"multihost: error: {proj / 'uv.lock'} is out of date with "
                                "pyproject.toml: run `uv lock` (nothing started; checked on the "
                                "builder s0/w0 ("), error  # fmt: skip
        assert "Traceback" not in res.stderr
        # the builder fetched uv to check the lock, and synced nothing
        assert index.hits[f"/files/{wheel.name}"] == 1
        assert not [p for p in index.hits if p.startswith("/files/tiny")]
        assert not [m for m in marks if m.exists()]
        for home in homes:
            runs = home / BASE / "runs"
            assert not runs.exists() or not any(runs.iterdir())
            envs = home / BASE / "envs"
            assert not envs.exists() or not [p for p in envs.iterdir() if p.is_dir()]
        wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")
    finally:
        shutil.rmtree(homes[0] / ".config" if made else conf.parent, ignore_errors=True)
        for home in homes:
            shutil.rmtree(home / BASE, ignore_errors=True)
