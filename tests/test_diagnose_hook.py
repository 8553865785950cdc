"""A bare ``jax.distributed.initialize()`` in a multihost run: the staged hook registers a JAX
cluster (real multi-process JAX on CPU, locally and over the sshd fleet), and a program that
never imports jax pays nothing for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.remote.commands import hook_text
from tests.clitools import cli, host_logs
from tests.helpers import free_port

BARE = "import jax; jax.distributed.initialize(); print('joined', jax.process_index(), jax.process_count())"  # noqa: E501
RUN_ENV = {
    "MULTIHOST_RUN": "r",
    "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1",
    "JAX_PROCESS_ID": "0",
    "JAX_PROCESS_COUNT": "2",
}
SHOW = "import sys; print(sorted(sys.modules)); print(any(type(f).__name__ == 'JaxWatcher' for f in sys.meta_path))"  # noqa: E501


def _python(code: str, hook_dir: Path | None, **env: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (with the hook as sitecustomize when given)."""
    base = {k: v for k, v in os.environ.items() if k not in RUN_ENV and k != "PYTHONPATH"}
    if hook_dir is not None:
        base["PYTHONPATH"] = str(hook_dir)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return out.splitlines()


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    (tmp_path / "sitecustomize.py").write_text(hook_text())
    return tmp_path


def test_a_program_without_jax_imports_nothing_more(hook_dir: Path, tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    plain = _python(SHOW, None, **RUN_ENV)
    hooked = _python(SHOW, hook_dir, MULTIHOST_STACK_DIR=str(stacks), **RUN_ENV)
    extra = set(eval(hooked[0])) - set(eval(plain[0]))
    assert extra <= {"sitecustomize", "faulthandler", "signal"}, extra  # the stack hook's own
    assert hooked[1] == "True"  # waiting, at the cost of one comparison per import


def test_no_watcher_outside_a_run(hook_dir: Path) -> None:
    assert _python(SHOW, hook_dir)[1] == "False"


PLACE = """\
import os, subprocess, sys
import sitecustomize as hook

hook._take_place()  # what importing jax does
print("launched", hook.holds_place())
ask = "import sitecustomize as h; h._take_place(); print({!r}, h.holds_place(), h.not_the_runs())"
for how in ("child", "grandchild"):  # a helper, and a helper's helper
    code = ask.format(how)
    if how == "grandchild":
        code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"
    print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
if (pid := os.fork()) == 0:  # a multiprocessing worker by fork shares the lock, not the place
    print("fork", hook.holds_place(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
sys.stdout.flush()
os.execv(sys.executable, [sys.executable, "-c", ask.format("exec")])  # the same process
"""


def test_one_python_per_host_holds_the_place_in_the_job(hook_dir: Path, tmp_path: Path) -> None:
    """The first Python of the run that imports jax is the host's JAX process; every Python
    it starts (or forks) while it lives is not; an exec of it still is; the next Python after
    it ends is again (``python a.py; python b.py``)."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    env = {"MULTIHOST_STACK_DIR": str(stacks), **RUN_ENV}
    lines = [ln for ln in _python(PLACE, hook_dir, **env) if ln.strip()]
    said = {ln.split()[0]: ln.split(" ", 2)[1:] for ln in lines}
    assert said["launched"] == ["True"]
    assert said["fork"] == ["False"]
    assert said["exec"][0] == "True"
    for helper in ("child", "grandchild"):
        assert said[helper][0] == "False", lines
        assert "is not the run's JAX process on this host" in said[helper][1]
        assert "as JAX process 0 of 2" in said[helper][1]
    after = "import sitecustomize as h; h._take_place(); print(h.holds_place())"
    assert _python(after, hook_dir, **env) == ["True"]  # the one before has ended
    # without the run's hook dir (not launched by multihost) a process is the run's, as before
    assert _python(after, hook_dir, **RUN_ENV) == ["True"]


@pytest.mark.jax
def test_bare_initialize_local(code: Path, tmp_path: Path) -> None:
    """Two local workers join one JAX job with no arguments, even inside a Slurm allocation
    (multihost's cluster is asked first)."""
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(code),
            "--log-dir",
            str(tmp_path / "logs"),
            "--run-name",
            "bare",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--env",
            "SLURM_JOB_ID=7",
            "--env",
            "SLURM_NTASKS=5",
            "--timeout",
            "120",
            "--cmd",
            f'{sys.executable} -c "{BARE}"',
        ],
        timeout=150,
        HOME=str(tmp_path / "home"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    logs = host_logs(tmp_path / "logs", "bare")
    assert sorted(line for t in logs.values() for line in t.splitlines() if "joined" in line) == [
        "joined 0 2",
        "joined 1 2",
    ]


@pytest.mark.jax
@pytest.mark.usefixtures("fresh_runs")
def test_bare_initialize_over_ssh(
    ssh_fleet, remote_jax: dict[str, str], code: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    res = cli(
        [
            "run",
            "--hosts",
            ",".join(ssh_fleet.aliases[:2]),
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(tmp_path),
            "--run-name",
            "bare-ssh",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--env",
            f"PYTHONPATH={remote_jax['PYTHONPATH']}",
            "--coordinator-port",
            str(free_port()),
            "--timeout",
            "120",
            "--cmd",
            f'{remote_jax["PYTHON"]} -c "{BARE}"',
        ],
        timeout=150,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    joined = [ln for t in host_logs(tmp_path, "bare-ssh").values() for ln in t.splitlines()]
    assert sorted(ln for ln in joined if "joined" in ln) == ["joined 0 2", "joined 1 2"]
