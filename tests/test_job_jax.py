"""Real JAX jobs on the stand-in: payloads/shardings.py as a 2-process ``multihost job`` on the
fleet's CPUs gives the same checksum as ``multihost run --local 2``; payloads/train.py preempted
in the middle of training resumes from its checkpoint in attempt 1."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from multihost.staging.archive import pack
from tests.clitools import REPO, cli, host_logs
from tests.cloud.fixture import Cloud
from tests.helpers import free_port, wait_for
from tests.test_job_cloud import multihost, record, started_times, submit_args, watch_proc

pytestmark = [pytest.mark.jax, pytest.mark.slow]
PAYLOADS = REPO / "payloads"  # the code dir the jobs stage (small: fetched quickly)
SHARDINGS = "shardings.py -if 4 -d 256 -b 16 -n 2 --tries 2"


def _result(text: str) -> dict[str, object]:
    lines = [ln for ln in text.splitlines() if ln.startswith("MULTIHOST_RESULT ")]
    assert len(lines) == 1, text[-2000:]
    return json.loads(lines[0].split(" ", 1)[1])  # type: ignore[no-any-return]


def test_shardings_job_matches_run(
    cloud: Cloud, remote_jax: dict[str, str], tmp_path: Path
) -> None:
    done = multihost(
        cloud,
        *submit_args(
            "jaxjob",
            PAYLOADS,
            f"{remote_jax['PYTHON']} {SHARDINGS}",
            "--env",
            "JAX_NUM_CPU_DEVICES=2",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--env",
            f"PYTHONPATH={remote_jax['PYTHONPATH']}",
            "--env",
            f"XLA_FLAGS={remote_jax['XLA_FLAGS']}",
            "--coordinator-port",
            str(free_port()),
            "--watch",
        ),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert record(cloud, "jaxjob")["code_hash"] == pack(PAYLOADS).digest  # the hash `run` stages
    job = [
        _result(cloud.read(f"multihost/jobs/jaxjob/attempt-0/slice-0-worker-{w}.log"))
        for w in (0, 1)
    ]
    assert sorted(r["process_index"] for r in job) == [0, 1]  # type: ignore[type-var]
    assert job[0]["num_devices"] == 4
    local = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(PAYLOADS),
            "--log-dir",
            str(tmp_path),
            "--run-name",
            "loc",
            "--env",
            "JAX_NUM_CPU_DEVICES=2",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--coordinator-port",
            str(free_port()),
            "--timeout",
            "240",
            "--cmd",
            f"{sys.executable} {SHARDINGS}",
        ],
        timeout=300,
        HOME=str(tmp_path / "home"),
    )
    assert local.returncode == 0, local.stderr[-3000:]
    ran = [_result(t) for t in host_logs(tmp_path, "loc").values()]
    assert {r["checksum"] for r in job} == {r["checksum"] for r in ran}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every fleet user can write (the hosts share this machine's disk, as TPU VMs
    share a mounted bucket or filestore)."""
    path = Path(tempfile.mkdtemp(prefix="multihost-ckpt-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _checkpoints(path: Path) -> list[str]:
    """Steps both processes have saved."""
    steps = [p.name.split(".")[0] for p in path.glob("step-*.process-*.npz")]
    return sorted(s for s in set(steps) if steps.count(s) == 2)


def test_preempted_training_resumes_from_its_checkpoint(
    cloud: Cloud, remote_jax: dict[str, str], shared_dir: Path
) -> None:
    """train.py with --checkpoint-dir: Ctrl-C on the first watch leaves the job running; a
    second watch sees the preemption in the middle of training, creates attempt 1
    (MULTIHOST_ATTEMPT=1), which resumes at the last checkpoint and finishes; attempt 0's logs
    are kept; the job ends exit 0 with its resource deleted."""
    train = (
        f"{remote_jax['PYTHON']} train.py --model mlp --d_model 32 --d_ff 64 "
        f"--num_layers 1 --dtype f32 --steps 24 --warmup 0 -if 2 "
        f"--checkpoint-dir {shared_dir} --checkpoint-every 2"
    )
    # attempt 0 is slowed down, so that the preemption comes in the middle of it
    slow = "--step_sleep $((MULTIHOST_ATTEMPT == 0))"
    cmd = f'echo "attempt=$MULTIHOST_ATTEMPT"; exec {train} {slow}'
    first = watch_proc(
        cloud,
        *submit_args(
            "tr",
            PAYLOADS,
            cmd,
            "--env",
            "JAX_NUM_CPU_DEVICES=1",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--env",
            f"PYTHONPATH={remote_jax['PYTHONPATH']}",
            "--env",
            f"XLA_FLAGS={remote_jax['XLA_FLAGS']}",
            "--coordinator-port",
            str(free_port()),
            "--max-restarts",
            "1",
            "--watch",
        ),
    )
    second = None
    try:
        ran = wait_for(lambda: started_times(cloud, "tr", 0, 2), 120, "attempt 0 to run")
        wait_for(lambda: "step-00000002" in _checkpoints(shared_dir), 120, "a checkpoint")
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=30)
        assert first.returncode == 130, err
        assert "keeps running" in err
        assert "multihost job watch tr" in err
        assert "tr-a0" in cloud.tpu.resources
        second = watch_proc(cloud, "watch", "tr", "--poll", "2")
        assert second.stderr is not None
        assert "job tr: attempt 0" in second.stderr.readline()  # it follows the job now
        saved = _checkpoints(shared_dir)
        assert "step-00000024" not in saved  # the middle of training
        preempted_at = time.time()
        cloud.preempt("tr-a0", notice=5.0)  # time for the notice to send the log
        again = wait_for(lambda: started_times(cloud, "tr", 1, 2), 120, "attempt 1 to run")
        out, err = second.communicate(timeout=240)
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
    submit_to_running = max(ran) - record(cloud, "tr")["created_at"]
    print(
        f"submit→all running {submit_to_running:.1f}s; preemption→attempt 1 running "
        f"{max(again) - preempted_at:.1f}s",
        file=sys.stderr,
    )
    assert second.returncode == 0, err
    assert re.search(r"preempted \(SUSPEND(ING|ED)\) in attempt 0", err)
    assert "s0/w0 | attempt=1" in out
    log0 = cloud.read("multihost/jobs/tr/attempt-0/slice-0-worker-0.log")
    log1 = cloud.read("multihost/jobs/tr/attempt-1/slice-0-worker-0.log")
    assert "attempt=0" in log0  # attempt 0's log kept as it was
    assert "step 23:" not in log0
    resumed_at = int(re.search(r"checkpoint: resuming at step (\d+) from", log1)[1])  # type: ignore[index]
    assert 2 <= resumed_at < 24
    assert f"\nstep {resumed_at}: loss" in log1
    assert f"\nstep {resumed_at - 1}: loss" not in log1
    assert _result(log1)["first_step"] == resumed_at
    assert record(cloud, "tr")["attempt"] == 1
    assert record(cloud, "tr")["state"] == "succeeded"
    wait_for(lambda: cloud.tpu.resources == {}, 30, "the resources to go")  # --async delete
    creates = [r.query["queuedResourceId"][0] for r in cloud.tpu.requests if r.method == "POST"]
    assert creates == ["tr-a0", "tr-a1"]
