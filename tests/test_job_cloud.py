"""``multihost job`` end to end on the stand-in control plane (tests/cloud/): the real gcloud CLI,
fake GCS, the TPU API stand-in, startup scripts on the loopback fleet."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.model import Fleet, Host, Job
from multihost.plan import host_env
from tests.cloud.fixture import BUCKET, Cloud

pytestmark = pytest.mark.slow

ENV_CMD = "env | grep -E '^(JAX|MULTIHOST|MEGASCALE)_|^EXTRA=' | sort; echo payload-done"


def code_dir(tmp_path: Path, body: str = "print('hello')\n") -> Path:
    d = tmp_path / "code"
    d.mkdir(exist_ok=True)
    (d / "main.py").write_text(body)
    return d


def multihost(cloud: Cloud, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "multihost", "job", *args],
        env=cloud.env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def submit_args(name: str, script_dir: Path, cmd: str, *extra: str) -> list[str]:
    return ["submit", name, "--tpu-type", "v4-16", "--runtime-version", "tpu-ubuntu2204-base",
            "--bucket", f"gs://{BUCKET}", "--script-dir", str(script_dir), "--cmd", cmd,
            "--log-interval", "3", "--poll", "2", *extra]  # fmt: skip


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_two_slices_get_runs_environment(cloud: Cloud, tmp_path: Path) -> None:
    started = time.monotonic()
    done = multihost(cloud, *submit_args(
        "envjob", code_dir(tmp_path), ENV_CMD, "--num-slices", "2", "--spot",
        "--env", "EXTRA=x y", "--coordinator-port", "9123", "--watch"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "s0/w0 | payload-done" in done.stdout
    assert "job envjob succeeded" in done.stderr
    print(f"2x2 env job: {time.monotonic() - started:.1f}s", file=sys.stderr)
    post = next(r for r in cloud.tpu.requests if r.method == "POST")
    assert post.query["queuedResourceId"] == ["envjob-a0"]
    assert "spot" in (post.body or {})
    assert cloud.tpu.resources == {}  # deleted on success
    logs = {
        (s, w): parse_env(cloud.read(f"multihost/jobs/envjob/attempt-0/slice-{s}-worker-{w}.log"))
        for s in (0, 1) for w in (0, 1)
    }  # fmt: skip
    coordinator = logs[0, 0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[0]
    fleet = Fleet.from_slices([[Host(coordinator), Host("b")], [Host("c"), Host("d")]])
    job = Job(ENV_CMD, "envjob", {"EXTRA": "x y"}, coordinator_port=9123)
    for host in fleet:
        expected = host_env(host, fleet, job, {}) | {"MULTIHOST_JOB": "envjob",
                                                     "MULTIHOST_ATTEMPT": "0"}  # fmt: skip
        assert logs[host.slice_id, host.worker_id] == expected
    for s in (0, 1):
        for w in (0, 1):
            assert cloud.read(f"multihost/jobs/envjob/attempt-0/slice-{s}-worker-{w}.exit") == "0\n"


def wait_for(predicate, timeout: float = 60, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def started_times(cloud: Cloud, job: str, attempt: int, n: int) -> list[float] | None:
    prefix = f"multihost/jobs/{job}/attempt-{attempt}/"
    names = [k for k in cloud.objects(prefix) if k.endswith(".started")]
    if len(names) < n:
        return None
    return [float(cloud.read(k).split()[2]) for k in names]


def record(cloud: Cloud, job: str) -> dict:  # type: ignore[type-arg]
    return json.loads(cloud.read(f"multihost/jobs/{job}/job.json"))  # type: ignore[no-any-return]


def test_preemption_restarts_with_next_attempt(cloud: Cloud, tmp_path: Path) -> None:
    cmd = ('echo "attempt=$MULTIHOST_ATTEMPT"; '
           'if [ "$MULTIHOST_ATTEMPT" = 0 ]; then sleep 300; fi; echo finished')  # fmt: skip
    watch = subprocess.Popen(
        [sys.executable, "-m", "multihost", "job",
         *submit_args("pre", code_dir(tmp_path), cmd, "--max-restarts", "1", "--watch")],
        env=cloud.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = wait_for(lambda: started_times(cloud, "pre", 0, 2), 90, "attempt 0 to run")
        rec = record(cloud, "pre")
        submit_to_running = max(first) - rec["created_at"]
        log0 = "multihost/jobs/pre/attempt-0/slice-0-worker-0.log"
        wait_for(lambda: log0 in cloud.objects(log0) and "attempt=0" in cloud.read(log0),
                 30, "attempt 0's log")  # fmt: skip
        preempted_at = time.time()
        cloud.preempt("pre-a0")
        second = wait_for(lambda: started_times(cloud, "pre", 1, 2), 90, "attempt 1 to run")
        out, err = watch.communicate(timeout=120)
    finally:
        watch.kill()
    preempt_to_running = max(second) - preempted_at
    print(f"submit→all running {submit_to_running:.1f}s; preemption→attempt 1 running "
          f"{preempt_to_running:.1f}s", file=sys.stderr)  # fmt: skip
    assert watch.returncode == 0, err
    assert preempt_to_running < 30
    assert re.search(r"preempted \(SUSPEND(ING|ED)\) in attempt 0", err)
    assert "s0/w0 | attempt=1" in out
    assert "s0/w0 | finished" in out
    assert "attempt=0" in cloud.read(log0)  # attempt 0's logs kept as they were
    assert "finished" not in cloud.read(log0)
    assert record(cloud, "pre")["attempt"] == 1
    assert record(cloud, "pre")["state"] == "succeeded"
    assert cloud.tpu.resources == {}
    creates = [r.query["queuedResourceId"][0] for r in cloud.tpu.requests if r.method == "POST"]
    assert creates == ["pre-a0", "pre-a1"]


def test_failed_worker_fails_fast_without_retry(cloud: Cloud, tmp_path: Path) -> None:
    cmd = 'if [ "$MULTIHOST_WORKER_ID" = 1 ]; then echo boom; exit 3; fi; sleep 300'
    started = time.monotonic()
    done = multihost(
        cloud,
        *submit_args("bad", code_dir(tmp_path), cmd, "--max-restarts", "2", "--watch"),
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "s0/w1 (slice 0, worker 1) exited with code 3 in attempt 0" in done.stderr
    assert "boom" in done.stderr
    assert time.monotonic() - started < 60
    creates = [r for r in cloud.tpu.requests if r.method == "POST"]
    assert len(creates) == 1
    wait_for(lambda: cloud.tpu.resources == {}, 10, "the resource to go")
    assert not any(cloud.fleet.user_processes(i) for i in range(4))
    assert record(cloud, "bad")["state"] == "failed"


def test_startup_that_never_reports_is_named(cloud: Cloud, tmp_path: Path) -> None:
    cloud.break_storage("dark-a0")
    code = code_dir(tmp_path, f"print({time.time()!r})\n")  # not cached on any host: fetched
    started = time.monotonic()
    done = multihost(
        cloud,
        *submit_args("dark", code, "true", "--start-timeout", "8", "--watch"),
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "s0/w0, s0/w1 never reported within --start-timeout 8s" in done.stderr
    assert time.monotonic() - started < 45
    wait_for(lambda: cloud.tpu.resources == {}, 10, "the resource to go")


def test_same_code_uploads_once_and_stop_leaves_nothing(cloud: Cloud, tmp_path: Path) -> None:
    code = code_dir(tmp_path)
    first = multihost(cloud, *submit_args("one", code, "sleep 300"))
    second = multihost(cloud, *submit_args("two", code, "sleep 300"))
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "uploading code" in first.stderr
    assert "already in gs://mh-test: nothing to upload" in second.stderr
    assert "multihost job watch one" in first.stderr
    assert len(cloud.objects("multihost/code/")) == 1
    for job in ("one", "two"):
        wait_for(lambda job=job: started_times(cloud, job, 0, 2), 60, f"{job} to run")
    hosts = [w.host for q in cloud.tpu.resources.values() for w in q.workers]
    assert len(hosts) == 4
    assert all(any("sleep 300" in c for _, c in cloud.fleet.user_processes(h)) for h in hosts)
    for job in ("one", "two"):
        stopped = multihost(cloud, "stop", job)
        assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not any(cloud.fleet.user_processes(h) for h in hosts), 10, "no process")
    assert record(cloud, "one")["state"] == "stopped"
    listed = {j["name"]: j["state"] for j in json.loads(multihost(cloud, "ls", "--json").stdout)}
    assert listed["one"] == listed["two"] == "stopped"


def test_ctrl_c_leaves_the_job_running_and_a_second_watch_ends_it(
    cloud: Cloud, tmp_path: Path
) -> None:
    cmd = 'sleep 8; echo "done on $MULTIHOST_WORKER_ID"'
    assert multihost(cloud, *submit_args("cc", code_dir(tmp_path), cmd)).returncode == 0
    watch = subprocess.Popen(
        [sys.executable, "-m", "multihost", "job", "watch", "cc", "--poll", "2"],
        env=cloud.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: started_times(cloud, "cc", 0, 2), 60, "cc to run")
    watch.send_signal(signal.SIGINT)
    _, err = watch.communicate(timeout=30)
    assert watch.returncode == 130, err
    assert "keeps running" in err
    assert "multihost job watch cc" in err
    assert "cc-a0" in cloud.tpu.resources
    status = multihost(cloud, "status", "cc", "--json")
    assert json.loads(status.stdout)["state"] == "running"
    again = multihost(cloud, "watch", "cc", "--poll", "2", timeout=120)
    assert again.returncode == 0, again.stderr
    assert "s0/w0 | done on 0" in again.stdout
    logs = multihost(cloud, "logs", "cc", "--all")
    assert "s0/w1 | done on 1" in logs.stdout


@pytest.mark.parametrize(
    "bad",
    [
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true", "Bad_Name"],
        ["--tpu-type", "tpu16", "--bucket", "gs://mh-test", "--cmd", "true", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "s3://x", "--cmd", "true", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true", "--env", "1=2", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true", "--spot",
         "--reserved", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true",
         "--script-dir", "/nonexistent", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true",
         "--num-slices", "0", "ok"],
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_creates_nothing(cloud: Cloud, bad: list[str]) -> None:
    before = cloud.objects("multihost/")
    done = multihost(cloud, "submit", "--runtime-version", "v", *bad)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("multihost: error:")
    assert cloud.tpu.requests == []
    assert cloud.objects("multihost/") == before
