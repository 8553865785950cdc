"""``multihost job`` where the control plane misbehaves (``multihost.sandbox.standin.faults``:
the REAL gcloud meets 503s, resets and 403s from the stand-in servers), where a queued resource
is deleted, and where a secret must never reach a disk."""

from __future__ import annotations

import hashlib
import pwd
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.cloud.fixture import Cloud
from tests.helpers import wait_for
from tests.test_job_cloud import code_dir, multihost, record, started_times, submit_args

pytestmark = pytest.mark.slow


def watch(cloud: Cloud, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "multihost", "job", "watch", *args],
        env=env or cloud.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def creates(cloud: Cloud) -> list[str]:
    return sorted(r.query["queuedResourceId"][0] for r in cloud.tpu.requests if r.method == "POST")


def ended(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_watch_outlasts_a_flaky_window_with_a_preemption_inside(
    cloud: Cloud, tmp_path: Path
) -> None:
    """503s and resets for 35 s (longer than gcloud's own ~30 s of retries for a 503, so the
    watch's retries are what carries it), a preemption in the middle: each run of failures
    said once with its end, exactly one new attempt, and the job ends 0."""
    cmd = 'if [ "$MULTIHOST_ATTEMPT" = 0 ]; then sleep 300; fi; echo done-$MULTIHOST_ATTEMPT'
    sub = multihost(
        cloud, *submit_args("flaky", code_dir(tmp_path), cmd, "--spot", "--max-restarts", "2")
    )
    assert sub.returncode == 0, sub.stderr
    wait_for(lambda: started_times(cloud, "flaky", 0, 2), 60, "attempt 0 to run")
    proc = watch(
        cloud, "flaky", "--poll", "2", "--control-plane-timeout", "120", env=cloud.faulty_env
    )
    try:
        n = len(cloud.tpu.requests)
        wait_for(lambda: len(cloud.tpu.requests) > n, 30, "the watch to poll")
        started = time.monotonic()
        cloud.faults.window(35)
        wait_for(lambda: len(cloud.faults.injected) >= 3, 10, "faults to be met")
        threading.Thread(target=cloud.preempt, args=("flaky-a0",), daemon=True).start()
        out, err = ended(proc, 240)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    print(
        f"flaky window 35 s with a preemption: watch ended {took:.1f} s after it began; "
        f"{len(cloud.faults.injected)} requests failed",
        file=sys.stderr,
    )
    assert proc.returncode == 0, err
    assert creates(cloud) == ["flaky-a0", "flaky-a1"]
    # Each run of failures that reaches the watch is said once, and its end once. How many
    # reach it is gcloud's: it retries a 503 itself but gives up on some resets, and a call
    # that succeeds (the TPU API's between the storage calls) ends a run; seen: one run in
    # most tries, none in one of about ten (every storage call carried by gcloud's retries)
    failing = err.count("the control plane is failing")
    assert failing == err.count("the control plane answers again after"), err
    assert failing <= len(cloud.faults.injected), err
    assert "attempt 1 created as flaky-a1" in err
    assert "s0/w0 | done-1" in out
    assert record(cloud, "flaky")["attempt"] == 1


def test_permission_denied_ends_the_watch_in_seconds(cloud: Cloud, tmp_path: Path) -> None:
    sub = multihost(cloud, *submit_args("denied", code_dir(tmp_path), "sleep 300"))
    assert sub.returncode == 0, sub.stderr
    proc = watch(cloud, "denied", "--poll", "2", env=cloud.faulty_env)
    n = len(cloud.tpu.requests)
    wait_for(lambda: len(cloud.tpu.requests) > n, 30, "the watch to poll")
    cloud.faults.deny()
    denied = time.monotonic()
    _, err = ended(proc, 60)
    took = time.monotonic() - denied
    print(f"403: the watch ended {took:.1f} s after the first one", file=sys.stderr)
    assert proc.returncode == 1, err
    assert took < 10
    assert "permission denied by the control plane" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3, err
    assert creates(cloud) == ["denied-a0"]


def test_resource_deleted_before_active_is_not_a_preemption(cloud: Cloud, tmp_path: Path) -> None:
    """Two jobs side by side whose resources never become ACTIVE and are deleted by someone:
    one fails at once (no new attempt, although --max-restarts allows three), the other was
    asked to --resubmit and gets exactly one new attempt, which runs to its end."""
    code = code_dir(tmp_path)
    cloud.tpu.held.update({"gone-a0", "again-a0"})
    plain = watch_submit(cloud, "gone", code, "--max-restarts", "3")
    again = watch_submit(cloud, "again", code, "--resubmit")
    wait_for(lambda: {"gone-a0", "again-a0"} <= set(cloud.tpu.resources), 30, "both requested")
    cloud.tpu.remove("gone-a0")
    cloud.tpu.remove("again-a0")
    _, plain_err = ended(plain, 120)
    again_out, again_err = ended(again, 180)
    assert plain.returncode == 1, plain_err
    assert "queued resource gone-a0 was deleted before it was ever ACTIVE" in plain_err
    assert "not a preemption" in plain_err
    assert "--max-restarts" not in plain_err
    assert again.returncode == 0, again_err
    assert "resubmitted once (--resubmit) as attempt 1, again-a1" in again_err
    assert "s0/w0 | hello" in again_out
    assert creates(cloud) == ["again-a0", "again-a1", "gone-a0"]
    assert record(cloud, "gone")["state"] == "failed"
    assert record(cloud, "again")["resubmits"] == 1


def watch_submit(cloud: Cloud, name: str, code: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "multihost",
            "job",
            *submit_args(name, code, "python3 main.py", "--watch", *extra),
        ],
        env=cloud.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _holding(value: bytes, roots: list[Path]) -> list[str]:
    """Files under ``roots`` whose bytes contain ``value`` (grep, binary files as text)."""
    roots = [r for r in roots if r.exists()]
    done = subprocess.run(
        ["grep", "-rlsaF", "--", value.decode(), *map(str, roots)], capture_output=True, text=True
    )
    return done.stdout.splitlines()


def test_secret_is_in_the_jobs_environment_and_on_no_disk(cloud: Cloud, tmp_path: Path) -> None:
    """``--secret``: every worker's job sees the value (its hash in the log); the value is on
    no disk: the bucket, the records, the resource's metadata, the logs, the runner's log dir,
    the hosts' homes, their /tmp and /var/tmp. A secret that does not exist fails the job
    at its start, named. The local job state is private (0700 dirs, 0600 files)."""
    value = f"tok-{uuid.uuid4().hex}".encode()
    cloud.secrets.values["api-token"] = value
    cmd = 'printf %s "$API_TOKEN" | sha256sum'
    good = watch_submit_cmd(
        cloud,
        "sec",
        tmp_path / "a",
        cmd,
        "--secret",
        "API_TOKEN=api-token",
        "--env",
        "PLAIN=not-secret",
    )
    bad = watch_submit_cmd(cloud, "nosec", tmp_path / "b", cmd, "--secret", "API_TOKEN=absent")
    out, err = ended(good, 180)
    _, bad_err = ended(bad, 180)
    assert good.returncode == 0, err
    assert f"s0/w0 | {hashlib.sha256(value).hexdigest()}  -" in out
    for w in (0, 1):
        log = cloud.read(f"multihost/jobs/sec/attempt-0/slice-0-worker-{w}.log")
        assert hashlib.sha256(value).hexdigest() in log
    assert cloud.secrets.accessed.count("api-token") == 2  # once per worker
    assert bad.returncode == 123, bad_err
    assert "could not read a --secret from Secret Manager" in bad_err
    assert "could not read secret absent" in bad_err

    assert record(cloud, "sec")["secrets"] == [["API_TOKEN", "api-token"]]
    bodies = "".join(str(r.body) for r in cloud.tpu.requests if r.body)
    assert "api-token" in bodies  # the metadata: the name only
    assert value.decode() not in bodies
    homes = [h.home for h in cloud.fleet.hosts]
    users = {h.user for h in cloud.fleet.hosts}
    uids = {pwd.getpwnam(u).pw_uid for u in users}
    scratch = [Path(f"/tmp/multihost-cloud-{u}") for u in users]
    work = [Path(f"/var/tmp/multihost-{uid}") for uid in uids]
    logs = Path(cloud.env["MULTIHOST_LOG_DIR"])
    roots = [cloud.gcs.root, logs, *homes, *scratch, *work, Path(cloud.env["CLOUDSDK_CONFIG"])]
    assert _holding(value, roots) == []
    assert _holding(b"not-secret", [cloud.gcs.root]) != []  # --env is not secret (the check works)
    for w in work:
        if w.exists():
            assert w.stat().st_mode & 0o777 == 0o700, w

    jobs = logs / "jobs"
    for path in [jobs, *jobs.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def watch_submit_cmd(
    cloud: Cloud, name: str, where: Path, cmd: str, *extra: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "multihost",
            "job",
            *submit_args(name, code_dir(where), cmd, "--watch", *extra),
        ],
        env=cloud.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_detached_watch_is_seen_by_status_and_resumes_a_preemption(
    cloud: Cloud, tmp_path: Path
) -> None:
    """``job watch --detach`` keeps watching with no terminal; ``job status`` says so (and
    says when nothing watches); the detached watch resumes a preemption and ends with it. The
    preempted attempt's log reaches the bucket at the notice, long before its next upload."""
    cmd = (
        "echo begun-$MULTIHOST_ATTEMPT; "
        'if [ "$MULTIHOST_ATTEMPT" = 0 ]; then sleep 300; fi; echo done-$MULTIHOST_ATTEMPT'
    )
    sub = multihost(
        cloud,
        *submit_args("bg", code_dir(tmp_path), cmd, "--spot", "--max-restarts", "1"),
        "--log-interval",
        "600",
    )
    assert sub.returncode == 0, sub.stderr
    st = multihost(cloud, "status", "bg")
    assert "nothing watches this job from here" in st.stdout, st.stdout
    det = multihost(cloud, "watch", "bg", "--detach", "--poll", "2")
    assert det.returncode == 0, det.stderr
    assert "watching job bg in the background (pid" in det.stderr
    pid = int(det.stderr.split("(pid ")[1].split(")")[0])
    st = multihost(cloud, "status", "bg")
    assert f"watched from here by pid {pid} (detached" in st.stdout, st.stdout
    wait_for(lambda: started_times(cloud, "bg", 0, 2), 60, "attempt 0 to run")
    cloud.preempt("bg-a0", notice=5.0)  # a real notice's 30 s, shortened: time to send a log
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 120, "the watch to end")
    assert record(cloud, "bg")["state"] == "succeeded"
    assert creates(cloud) == ["bg-a0", "bg-a1"]
    log0 = cloud.read("multihost/jobs/bg/attempt-0/slice-0-worker-0.log")
    assert "begun-0" in log0, log0
    assert "preemption notice: the log so far sent" in log0, log0
    log = Path(cloud.env["MULTIHOST_LOG_DIR"]) / "jobs" / "bg" / "watch.log"
    assert "job bg succeeded" in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600
    assert "watched from here" not in multihost(cloud, "status", "bg").stdout


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
