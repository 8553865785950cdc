"""``multihost job submit`` of a locked project on the stand-in: process 0
builds the environment once with real uv against a package index served here, the bucket caches
the pack, the other workers and a later attempt after a preemption take it from there."""

from __future__ import annotations

import pwd
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cloud.fixture import Cloud
from tests.helpers import wait_for
from tests.pyindex import Index, tinyab, uv_project
from tests.test_job_cloud import multihost, started_times, submit_args, watch_proc

pytestmark = pytest.mark.slow
HOSTS = [(s, w) for s in (0, 1) for w in (0, 1)]
CHECK = (
    'python -c "import os, sys, tinya, tinyb; '
    "print(sys.prefix == os.environ['VIRTUAL_ENV'], tinya.X + tinyb.Y)\"; "
    'echo "VE=$VIRTUAL_ENV"; echo "P1=${PATH%%:*}"'
)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    idx = tinyab(tmp_path / "index", blob=1_000_000)
    with idx.serving():
        yield idx


@pytest.fixture
def project(tmp_path: Path, index: Index) -> Path:
    root = uv_project(tmp_path / "proj", index.url)
    index.hits.clear()
    return root


def _work_dirs(cloud: Cloud, resource: str) -> list[Path]:
    """The job's work directory on each of the resource's hosts (startup.py's ``base``)."""
    hosts = [cloud.fleet.hosts[w.host] for w in cloud.tpu.resources[resource].workers]
    return [Path(f"/var/tmp/multihost-{pwd.getpwnam(h.user).pw_uid}") for h in hosts]


def _log(cloud: Cloud, job: str, attempt: int, s: int, w: int) -> str:
    name = f"multihost/jobs/{job}/attempt-{attempt}/slice-{s}-worker-{w}.log"
    return cloud.read(name) if name in cloud.objects(f"multihost/jobs/{job}/") else ""


def _all_checked(cloud: Cloud, job: str, attempt: int) -> list[str] | None:
    logs = [_log(cloud, job, attempt, s, w) for s, w in HOSTS]
    return logs if all("True 3" in text for text in logs) else None


def test_locked_job_builds_once_and_a_preempted_attempt_takes_it_from_the_bucket(
    cloud: Cloud, project: Path, index: Index
) -> None:
    """2 slices x 2 workers: process 0 builds, the index sees each file once, the other three
    take the pack from the bucket; after a preemption, attempt 1 on hosts without it takes it
    from the bucket too and the index sees nothing; the command runs in the environment."""
    cmd = f'{CHECK}; [ "$MULTIHOST_ATTEMPT" = 1 ] || sleep 300'
    proc = watch_proc(
        cloud,
        *submit_args(
            "lock",
            project,
            cmd,
            "--num-slices",
            "2",
            "--spot",
            "--max-restarts",
            "1",
            "--watch",
        ),
    )
    wiped: list[Path] = []
    try:
        logs = wait_for(lambda: _all_checked(cloud, "lock", 0), 180, "attempt 0 to run")
        assert index.downloads() == len(index.files())  # each file once, for the whole job
        downloads = {p: n for p, n in index.hits.items() if p.startswith("/files/")}
        assert downloads == dict.fromkeys(index.files(), 1)
        packs = [k for k in cloud.objects("multihost/envs/") if k.endswith(".tar.gz")]
        assert len(packs) == 1, packs
        key = packs[0].split("/")[2]
        assert "building it with uv (process 0" in logs[0]
        for text in logs[1:]:
            assert f"environment {key}: taken from gs://mh-test/{packs[0]}" in text
        # fresh VMs for the next attempt: nothing of the environment left on these hosts
        wiped = _work_dirs(cloud, "lock-a0")
        for d in wiped:
            shutil.rmtree(d / "envs")
        index.hits.clear()
        cloud.preempt("lock-a0")
        wait_for(lambda: started_times(cloud, "lock", 1, 4), 180, "attempt 1 to run")
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert re.search(r"preempted \(SUSPEND(ING|ED)\) in attempt 0", err)
    assert "process 0 builds it (or finds it)" in err
    assert not index.hits  # attempt 1 never touched the index
    for s, w in HOSTS:
        text = _log(cloud, "lock", 1, s, w)
        assert f"environment {key}: taken from gs://mh-test/{packs[0]}" in text, text
        assert "True 3" in text
        venv = re.search(r"^VE=(.*)$", text, re.M)
        assert venv is not None
        assert venv[1].endswith(f"/envs/{key}")
        assert f"P1={venv[1]}/bin" in text
    assert [k for k in cloud.objects("multihost/envs/") if k.endswith(".tar.gz")] == packs
    assert len(cloud.objects("multihost/uv/")) == 1  # the runner's uv, for hosts without one
    wait_for(lambda: cloud.tpu.resources == {}, 30, "the resources to go")
    for d in _work_dirs_all(cloud):
        shutil.rmtree(d / "envs", ignore_errors=True)


def _work_dirs_all(cloud: Cloud) -> list[Path]:
    return [Path(f"/var/tmp/multihost-{pwd.getpwnam(h.user).pw_uid}") for h in cloud.fleet.hosts]


def test_a_failing_build_stops_every_worker_at_once(
    cloud: Cloud, project: Path, index: Index
) -> None:
    """The index is down: process 0's build fails with uv's error in its log and leaves the
    marker; the other workers stop on it without waiting out --env-wait (no watch here, so
    nothing deletes the resource under them); each exits 121, and the watch names it."""
    index.down = True
    done = multihost(
        cloud,
        *submit_args("broken", project, "echo started", "--num-slices", "2", "--env-wait", "600"),
    )
    assert done.returncode == 0, done.stderr

    def exits() -> list[str] | None:
        # each worker's last log and its exit go up in one gcloud call that may finish either
        # first: wait for both
        names = [f"multihost/jobs/broken/attempt-0/slice-{s}-worker-{w}" for s, w in HOSTS]
        there = cloud.objects("multihost/jobs/broken/attempt-0/")
        if not all(f"{n}.exit" in there and f"{n}.log" in there for n in names):
            return None
        return [cloud.read(f"{n}.exit") for n in names]

    assert wait_for(exits, 120, "every worker to exit") == ["121\n"] * 4
    text = _log(cloud, "broken", 0, 0, 0)
    assert "the build failed" in text
    assert "404" in text
    for s, w in HOSTS[1:]:
        other = _log(cloud, "broken", 0, s, w)
        assert "process 0 could not build it" in other, other
        assert "started" not in other
    watched = multihost(cloud, "watch", "broken", "--poll", "2")
    assert watched.returncode == 121, watched.stderr
    assert "could not get the locked environment with code 121" in watched.stderr
    for d in _work_dirs_all(cloud):
        shutil.rmtree(d / "envs", ignore_errors=True)
