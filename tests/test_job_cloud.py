"""``multihost job`` end to end on the stand-in control plane (multihost/sandbox/standin/): the
real gcloud CLI, fake GCS, the TPU API stand-in, startup scripts on the loopback fleet."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multihost.model import Fleet, Host, Job
from multihost.remote.commands import host_env
from tests.cloud.fixture import BUCKET, Cloud
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

ENV_CMD = (
    # (MULTIHOST_TEST_*: the stand-in VMs' own, the way to the tests' gcloud zygote)
    "env | grep -E '^(JAX|MULTIHOST|MEGASCALE)_|^EXTRA=' | grep -v '^MULTIHOST_TEST_' | sort; "
    # multihost's hook is the sitecustomize Python finds (bare jax.distributed.initialize())
    """python3 -c 'import sitecustomize; print("HOOK=" + sitecustomize.__file__)'; """
    "echo payload-done"
)


def code_dir(tmp_path: Path, body: str = "print('hello')\n") -> Path:
    d = tmp_path / "code"
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.py").write_text(body)
    return d


def multihost(cloud: Cloud, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "multihost", "job", *args],
        env=cloud.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def submit_args(name: str, script_dir: Path, cmd: str, *extra: str) -> list[str]:
    return [
        "submit",
        name,
        "--tpu-type",
        "v4-16",
        "--runtime-version",
        "tpu-ubuntu2204-base",
        "--bucket",
        f"gs://{BUCKET}",
        "--script-dir",
        str(script_dir),
        "--cmd",
        cmd,
        "--log-interval",
        "3",
        # a poll is one or two runs of gcloud (about half a second of CPU each): every 2 s
        # shows a test each state soon enough, every second would double what the watch costs
        "--poll",
        "2",
        *extra,
    ]


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def started_times(cloud: Cloud, job: str, attempt: int, n: int) -> list[float] | None:
    prefix = f"multihost/jobs/{job}/attempt-{attempt}/"
    names = [k for k in cloud.objects(prefix) if k.endswith(".started")]
    if len(names) < n:
        return None
    return [float(cloud.read(k).split()[2]) for k in names]


def record(cloud: Cloud, job: str) -> dict:  # type: ignore[type-arg]
    return json.loads(cloud.read(f"multihost/jobs/{job}/job.json"))  # type: ignore[no-any-return]


def watch_proc(cloud: Cloud, *args: str) -> subprocess.Popen[str]:
    """``multihost job ARGS`` in the background (for signals, or side by side)."""
    return subprocess.Popen(
        [sys.executable, "-m", "multihost", "job", *args],
        env=cloud.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_slices_env_code_uploaded_once_and_stop(cloud: Cloud, tmp_path: Path) -> None:
    """A 2-slice x 2-worker job gets run's environment and ends exit 0 with its resource gone;
    a second job of the same code uploads nothing; stop leaves no process on its hosts."""
    code = code_dir(tmp_path)
    started = time.monotonic()
    first = multihost(
        cloud,
        *submit_args(
            "envjob",
            code,
            ENV_CMD,
            "--num-slices",
            "2",
            "--spot",
            "--env",
            "EXTRA=x y",
            "--coordinator-port",
            "9123",
        ),
    )
    assert first.returncode == 0, first.stderr
    assert "uploading code" in first.stderr
    assert "multihost job watch envjob" in first.stderr
    second = multihost(cloud, *submit_args("idle", code, "sleep 300"))
    assert second.returncode == 0, second.stderr
    assert "already in gs://mh-test: nothing to upload" in second.stderr
    assert len(cloud.objects("multihost/code/")) == 1
    done = multihost(cloud, "watch", "envjob", "--poll", "2")
    assert done.returncode == 0, done.stderr
    assert "s0/w0 | payload-done" in done.stdout
    assert "job envjob succeeded" in done.stderr
    print(f"2x2 env job: {time.monotonic() - started:.1f}s", file=sys.stderr)
    post = next(r for r in cloud.tpu.requests if r.method == "POST")
    assert post.query["queuedResourceId"] == ["envjob-a0"]
    assert "spot" in (post.body or {})
    deletes = [r.path for r in cloud.tpu.requests if r.method == "DELETE"]
    assert any(p.endswith("/envjob-a0") for p in deletes), cloud.requests()  # deleted on success
    # --async: the API finishes the delete (stopping the hosts' processes) on its own time
    wait_for(lambda: "envjob-a0" not in cloud.tpu.resources, 30, "envjob-a0 to be deleted")
    logs = {
        (s, w): parse_env(cloud.read(f"multihost/jobs/envjob/attempt-0/slice-{s}-worker-{w}.log"))
        for s in (0, 1)
        for w in (0, 1)
    }
    coordinator = logs[0, 0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[0]
    fleet = Fleet.from_slices([[Host(coordinator), Host("b")], [Host("c"), Host("d")]])
    job = Job(ENV_CMD, "envjob", {"EXTRA": "x y"}, coordinator_port=9123)
    for (s, w), env in logs.items():
        stack_dir = env.pop("MULTIHOST_STACK_DIR")
        assert stack_dir.endswith(f"/attempt-0/slice-{s}-worker-{w}/hook"), stack_dir
        assert env.pop("HOOK") == f"{stack_dir}/sitecustomize.py"
        # the job's compile cache: one path in every attempt, beside them (run's: REMOTE_DIR's)
        assert env.pop("MULTIHOST_COMPILE_CACHE") == stack_dir.split("/attempt-")[0] + (
            "/compile-cache"
        )
    for host in fleet:
        expected = host_env(host, fleet, job, {}) | {
            "MULTIHOST_JOB": "envjob",
            "MULTIHOST_ATTEMPT": "0",
        }
        del expected["MULTIHOST_COMPILE_CACHE"]
        assert logs[host.slice_id, host.worker_id] == expected
    for s in (0, 1):
        for w in (0, 1):
            assert cloud.read(f"multihost/jobs/envjob/attempt-0/slice-{s}-worker-{w}.exit") == "0\n"
    logs11 = multihost(cloud, "logs", "envjob", "--host", "1/1", "--json").stdout.splitlines()
    assert {"host": "s1/w1", "attempt": 0, "line": "payload-done"} in map(json.loads, logs11)

    wait_for(lambda: started_times(cloud, "idle", 0, 2), 60, "idle to run")
    hosts = [w.host for w in cloud.tpu.resources["idle-a0"].workers]
    assert all(any("sleep 300" in c for _, c in cloud.fleet.user_processes(h)) for h in hosts)
    stopped = multihost(cloud, "stop", "idle")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not any(cloud.fleet.user_processes(h) for h in hosts), 10, "no process")
    listed = {j["name"]: j["state"] for j in json.loads(multihost(cloud, "ls", "--json").stdout)}
    assert listed == {"envjob": "succeeded", "idle": "stopped"}


def test_failures_are_named_at_once_and_not_retried(cloud: Cloud, tmp_path: Path) -> None:
    """Side by side: a worker exiting 3 (named, exit 3, no retry, resource deleted) and a code
    fetch that cannot work (named within --start-timeout)."""
    cloud.break_storage("dark-a0")
    fails = 'if [ "$MULTIHOST_WORKER_ID" = 1 ]; then echo boom; exit 3; fi; sleep 300'
    bad = watch_proc(
        cloud,
        *submit_args("bad", code_dir(tmp_path / "a"), fails, "--max-restarts", "2", "--watch"),
    )
    unique = code_dir(tmp_path / "b", f"print({time.time()!r})\n")  # in no host's cache
    dark = watch_proc(
        cloud, *submit_args("dark", unique, "true", "--start-timeout", "8", "--watch")
    )
    try:
        _, bad_err = bad.communicate(timeout=150)
        _, dark_err = dark.communicate(timeout=150)
    finally:
        bad.kill()
        dark.kill()
    assert bad.returncode == 3, bad_err
    assert "s0/w1 (slice 0, worker 1) exited with code 3 in attempt 0" in bad_err
    assert "boom" in bad_err
    assert dark.returncode == 1, dark_err
    assert "s0/w0, s0/w1 never reported within --start-timeout 8s" in dark_err
    creates = [r.query["queuedResourceId"][0] for r in cloud.tpu.requests if r.method == "POST"]
    assert sorted(creates) == ["bad-a0", "dark-a0"]
    wait_for(lambda: cloud.tpu.resources == {}, 10, "the resources to go")
    assert not any(cloud.fleet.user_processes(i) for i in range(len(cloud.fleet.hosts)))
    assert record(cloud, "bad")["state"] == record(cloud, "dark")["state"] == "failed"


@pytest.mark.parametrize(
    "bad",
    [
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true", "Bad_Name"],
        ["--tpu-type", "tpu16", "--bucket", "gs://mh-test", "--cmd", "true", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "s3://x", "--cmd", "true", "ok"],
        ["--tpu-type", "v4-16", "--bucket", "gs://mh-test", "--cmd", "true", "--env", "1=2", "ok"],
        [
            "--tpu-type",
            "v4-16",
            "--bucket",
            "gs://mh-test",
            "--cmd",
            "true",
            "--spot",
            "--reserved",
            "ok",
        ],
        [
            "--tpu-type",
            "v4-16",
            "--bucket",
            "gs://mh-test",
            "--cmd",
            "true",
            "--script-dir",
            "/nonexistent",
            "ok",
        ],
        [
            "--tpu-type",
            "v4-16",
            "--bucket",
            "gs://mh-test",
            "--cmd",
            "true",
            "--num-slices",
            "0",
            "ok",
        ],
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(cloud: Cloud, bad: list[str]) -> None:
    before = cloud.objects("multihost/")
    done = multihost(cloud, "submit", "--runtime-version", "v", *bad)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("multihost: error:")
    assert cloud.tpu.requests == []
    assert cloud.objects("multihost/") == before
