"""A script written for a TPU pod (it never calls ``jax.distributed.initialize()``) runs
unmodified as one JAX job under ``--local`` and on an SSH fleet of CPU hosts: the staged hook
joins each process to the run's job before its first JAX call. Real multi-process JAX on CPU;
the script is tests/fixtures/pod_script/shardings.py, written as MaxText's is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from multihost.diagnose.hook import JOIN, joins
from multihost.planner import Settings, plan
from multihost.remote.commands import JOIN_ENV
from tests.clitools import cli, fleet_run_args, host_logs, no_processes, wait_for
from tests.helpers import free_port

POD_SCRIPT = Path(__file__).parent / "fixtures" / "pod_script" / "shardings.py"
SMALL = "-d 64 -b 8 -n 2"  # MaxText's defaults need ~43 GB: small sizes on CPU
RUN_ENV = {
    "JAX_PROCESS_ID": "1",
    "JAX_PROCESS_COUNT": "4",
    "MULTIHOST_RUN": "r",
    "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234",
}


def test_who_joins() -> None:
    assert joins(RUN_ENV, "", 0)  # CPU or GPU hosts: no TPU chip on the bus
    assert joins(RUN_ENV, "cpu", 4)  # a TPU VM told to compute on its CPU
    assert joins(RUN_ENV, "cuda", 0)
    assert not joins(RUN_ENV, "", 4)  # a TPU VM: its runtime joins the hosts
    assert not joins(RUN_ENV, "tpu,cpu", 0)
    assert not joins({**RUN_ENV, JOIN: "0"}, "cpu", 0)  # --no-jax-init
    assert not joins({**RUN_ENV, "JAX_PROCESS_COUNT": "1"}, "cpu", 0)  # nothing to join
    assert not joins({k: v for k, v in RUN_ENV.items() if k != "MULTIHOST_RUN"}, "cpu", 0)
    assert JOIN == JOIN_ENV  # the hook is staged alone: it keeps its own copy of the name


def test_no_jax_init_is_a_setting_that_reaches_the_hosts(tmp_path: Path) -> None:
    base = {"cmd": "true", "local": 2, "log_dir": tmp_path, "script_dir": tmp_path}
    assert JOIN_ENV not in plan(Settings.of(base)).job.env
    assert plan(Settings.of({**base, "jax_init": False})).job.env[JOIN_ENV] == "0"
    dry = cli(
        [
            "run",
            "--local",
            "2",
            "--no-jax-init",
            "--dry-run",
            "--script-dir",
            str(tmp_path),
            "--log-dir",
            str(tmp_path),
            "--cmd",
            "true",
        ]
    )
    assert dry.returncode == 0, dry.stderr
    assert f"{JOIN_ENV}=0" in dry.stdout


@pytest.fixture
def pod_script(code: Path) -> Path:
    shutil.copy(POD_SCRIPT, code / "shardings.py")
    return code


def _local(code: Path, logs: Path, run: str, cmd: str, n: int, *extra: str) -> list[str]:
    return [
        "run",
        "--local",
        str(n),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        run,
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        "JAX_NUM_CPU_DEVICES=2",
        "--no-fail-fast",
        *extra,
        "--cmd",
        cmd,
    ]


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.usefixtures("home")
def test_a_pod_script_runs_unmodified_as_one_job_under_local(
    pod_script: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    # 2 x 4 over 8 devices: 4 processes of 2 CPU devices each must be one job. (Not -dd 2:
    # JAX's CPU devices all say slice_index 0, and MaxText's own slice check refuses it.)
    cmd = f"python shardings.py -id 2 -if 4 {SMALL}"
    res = cli(_local(pod_script, logs, "pod", cmd, 4), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for text in host_logs(logs, "pod").values():
        assert "(num_devices: 8)" in text
        assert "time is " in text
    # the same script, left alone: each process sees only its own 2 devices, as MaxText's did
    alone = cli(_local(pod_script, logs, "alone", cmd, 4, "--no-jax-init"), timeout=300)
    assert alone.returncode == 1
    for text in host_logs(logs, "alone").values():
        assert "Number of devices 2 does not match the product of the parallelism 8" in text


JOINS_ITSELF = """\
import sys
import jax

how = sys.argv[1]
if how == "bare":
    jax.distributed.initialize()
elif how == "args":
    import os
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"],
                               int(os.environ["JAX_PROCESS_COUNT"]),
                               int(os.environ["JAX_PROCESS_ID"]))
else:  # late: a JAX call first (the hook joins there), then the program's own initialize()
    jax.devices()
    jax.distributed.initialize()
print("joined", how, jax.process_index(), jax.process_count(), jax.device_count(), flush=True)
"""


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.usefixtures("home")
def test_a_script_that_initializes_itself_keeps_working(code: Path, tmp_path: Path) -> None:
    (code / "joins.py").write_text(JOINS_ITSELF)
    logs = tmp_path / "logs"
    # each process its own way, in one job: no "should only be called once" anywhere
    cmd = 'python joins.py "$(echo bare args late | cut -d" " -f$((JAX_PROCESS_ID + 1)))"'
    res = cli(_local(code, logs, "own", cmd, 3), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    texts = host_logs(logs, "own")
    for i, how in enumerate(("bare", "args", "late")):
        assert f"joined {how} {i} 3 6" in texts[f"slice_0000_worker_{i:04d}"]


@pytest.mark.jax
@pytest.mark.usefixtures("fresh_runs")
def test_a_pod_script_runs_unmodified_on_a_fleet(  # type: ignore[no-untyped-def]
    ssh_fleet, remote_jax, pod_script: Path, tmp_path: Path
) -> None:
    logs, n = tmp_path / "logs", 4
    cmd = (
        f"{remote_jax['PYTHON']} shardings.py --ici_data_parallelism 2 "
        f"--ici_fsdp_parallelism 4 {SMALL}"
    )
    env = [
        "--env",
        f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--env",
        f"XLA_FLAGS={remote_jax['XLA_FLAGS']}",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        "JAX_NUM_CPU_DEVICES=2",
        # a port of its own: other fleets on this machine (another test worker's) share the
        # loopback hosts' ports, and a run refuses a busy one
        "--coordinator-port",
        str(free_port()),
    ]
    args = fleet_run_args(ssh_fleet, pod_script, logs, "fpod", cmd, n, *env)
    res = cli(args, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    texts = host_logs(logs, "fpod")
    assert len(texts) == n
    for text in texts.values():
        assert "(num_devices: 8)" in text
        assert "Decided on mesh shape: (2, 4, 1)" in text
        assert "time is " in text
    wait_for(lambda: no_processes(ssh_fleet, n), 20, "no process left")
