"""``multihost job``, pure tier: the record, the gcloud command lines, the startup script
(``sh -n`` + shellcheck), and the watch verdicts."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from multihost.cloud.bucket import check_bucket, parse_host_object
from multihost.errors import UsageError
from multihost.job import cloud, startup
from multihost.job.record import JobRecord, JobState, check_name, workers_per_slice
from multihost.job.submit import startup_script
from multihost.job.watch.verdict import HostView, Snapshot, Verdict, decide
from multihost.remote.envsync import BUILD, INSTALL

REC = JobRecord(
    name="train",
    bucket="gs://bkt",
    tpu_type="v4-16",
    num_slices=2,
    runtime_version="tpu-ubuntu2204-base",
    command="python payloads/train.py --x 'a b'",
    code_hash="ab" * 32,
    zone="us-central2-b",
    capacity="spot",
    env=(("K", "v w"),),
)


def test_record_round_trips_and_layout() -> None:
    rec = REC.evolve(attempt=2, state=JobState.FAILED, attempt_times=(1.0, 2.0))
    assert JobRecord.from_json(rec.to_json()) == rec
    assert rec.resource == "train-a2"
    assert (
        rec.host_url(1, 0, "log") == "gs://bkt/multihost/jobs/train/attempt-2/slice-1-worker-0.log"
    )
    assert rec.code_url == f"gs://bkt/multihost/code/{'ab' * 32}.tar.gz"
    assert parse_host_object(rec.host_url(1, 3, "exit")) == (1, 3, "exit")
    assert workers_per_slice("v4-16") == 2
    assert workers_per_slice("v5litepod-16") == 4


@pytest.mark.parametrize("name", ["Bad", "1x", "a_b", "x-", "a" * 41])
def test_bad_names(name: str) -> None:
    with pytest.raises(UsageError):
        check_name(name)


def test_bucket_check() -> None:
    assert check_bucket("gs://bkt/") == "gs://bkt"
    with pytest.raises(UsageError):
        check_bucket("gs://bkt/path")


def test_gcloud_command_lines() -> None:
    assert cloud.create_argv(REC, "/tmp/s.sh") == [
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "train-a0",
        "--accelerator-type",
        "v4-16",
        "--runtime-version",
        "tpu-ubuntu2204-base",
        "--node-count",
        "2",
        "--node-prefix",
        "train-a0",
        "--spot",
        "--metadata-from-file",
        "startup-script=/tmp/s.sh",
        "--async",
        "--zone",
        "us-central2-b",
    ]
    one = REC.evolve(num_slices=1, capacity="on-demand", zone=None, project="p")
    argv = cloud.create_argv(one, "f")
    assert argv[argv.index("--node-id") + 1] == "train-a0"
    assert "--spot" not in argv
    assert argv[-2:] == ["--project", "p"]
    assert cloud.delete_argv(REC, 3)[3:8] == ["delete", "train-a3", "--force", "--async", "--quiet"]


@pytest.mark.skipif(not shutil.which("gcloud"), reason="needs the Google Cloud CLI")
def test_real_gcloud_parses_the_create_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The real CLI accepts every flag (it fails later, at the network, not at parsing)."""
    script = tmp_path / "s.sh"
    script.write_text(startup_script(REC))
    (tmp_path / "cfg").mkdir()
    with _refusing_api() as endpoint:  # answers at once: no connection retries
        env = {
            "PATH": os.environ["PATH"],
            "CLOUDSDK_CONFIG": str(tmp_path / "cfg"),
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": "p",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": endpoint,
        }
        proc = subprocess.run(
            ["gcloud", *cloud.create_argv(REC, str(script))],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert proc.returncode != 2, proc.stderr
    assert "unrecognized arguments" not in proc.stderr
    assert "refused by the test" in proc.stderr  # it got as far as sending the request


@contextlib.contextmanager
def _refusing_api() -> Iterator[str]:
    """An HTTP endpoint that answers every request 403 with a JSON error."""

    class Handler(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            body = b'{"error": {"code": 403, "message": "refused by the test"}}'
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _refuse

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


ENV_REC = REC.evolve(
    env_lock="cd" * 32,
    env_select="--extra tpu --no-dev",
    env_requirements="a==1\nb'c==2 $x\n",
    uv_url="gs://bkt/multihost/uv/" + "ef" * 32,
    uv_sha256="ef" * 32,
    uv_version="0.9.1",
)


def _values(text: str) -> dict[str, str]:
    """The startup script's values by name, as its shell sees them (``set --`` read by sh)."""
    said = subprocess.run(
        ["sh", "-c", text.removesuffix(startup.STARTUP.text) + 'printf "%s\\0" "$@"'],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return dict(zip(startup.STARTUP.args, said.split("\0")[:-1], strict=True))


@pytest.mark.parametrize("rec", [REC, ENV_REC], ids=["plain", "locked-environment"])
def test_startup_script_is_clean_sh(rec: JobRecord, tmp_path: Path) -> None:
    text = startup_script(rec)
    # the script's own text after its values, given as its arguments, each quoted once
    assert text.startswith(startup.HEAD + "set -- ")
    assert text.endswith("\n" + startup.STARTUP.text)
    assert shlex.quote("python payloads/train.py --x 'a b'") in text
    # the exit codes the watch names are the ones the script reports (kept in two languages)
    assert f"report_exit {startup.FETCH_FAILED}\n" in startup.STARTUP.text
    assert f"report_exit {startup.WORK_DIR_REFUSED}\n" in startup.STARTUP.text
    assert f"|| report_exit {startup.ENV_FAILED}\n" in startup.STARTUP.text
    assert f"read_secrets || exit {startup.SECRET_FAILED};" in startup.STARTUP.text
    values = _values(text)
    assert values["command"] == "python payloads/train.py --x 'a b'"
    if rec.env_lock:  # the run path's own scripts, whole
        assert values["env_requirements"] == "a==1\nb'c==2 $x\n"
        assert values["env_requirements_bytes"] == "15"
        assert values["env_build"] == BUILD.text
        assert values["env_install"] == INSTALL.text
    else:
        assert values["env_lock"] == ""
        assert values["env_build"] == ""
    path = tmp_path / "startup.sh"
    path.write_text(text)
    subprocess.run(["sh", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", "-s", "sh", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def _snap(state: str | None, *hosts: HostView, expected: int | None = 2) -> Snapshot:
    return Snapshot(state, hosts, expected)


def test_decide() -> None:
    running = (HostView(0, 0, True), HostView(0, 1, True))
    kw = {"active_since": 0.0, "start_timeout": 10.0, "now": 5.0}
    assert decide(_snap("ACTIVE", *running), **kw)[0] is Verdict.CONTINUE
    failed = decide(_snap("ACTIVE", HostView(0, 0, True, 0), HostView(0, 1, True, 3)), **kw)
    assert failed == (Verdict.FAILED, HostView(0, 1, True, 3))
    done = _snap(None, HostView(0, 0, True, 0), HostView(0, 1, True, 0))
    assert decide(done, **kw)[0] is Verdict.SUCCEEDED  # exits win over a resource gone
    assert decide(_snap("SUSPENDED", *running), **kw)[0] is Verdict.PREEMPTED
    assert decide(_snap(None, *running), **kw)[0] is Verdict.DELETED  # not a preemption
    assert decide(_snap("DELETING", *running), **kw)[0] is Verdict.DELETED
    assert decide(_snap("FAILED", *running), **kw)[0] is Verdict.PREEMPTED
    never = {**kw, "seen_active": False}
    assert decide(_snap(None), **never)[0] is Verdict.NEVER_ACTIVE
    assert decide(_snap("FAILED"), **never)[0] is Verdict.NEVER_ACTIVE
    assert decide(_snap("SUSPENDED"), **never)[0] is Verdict.PREEMPTED  # only after ACTIVE
    assert decide(_snap(None, *running), **never)[0] is Verdict.DELETED  # workers had started
    late = {"active_since": 0.0, "start_timeout": 10.0, "now": 11.0}
    assert decide(_snap("ACTIVE", HostView(0, 0, True)), **late)[0] is Verdict.START_TIMEOUT
    assert decide(_snap("ACTIVE", *running), **late)[0] is Verdict.CONTINUE
    queued = {"active_since": None, "start_timeout": 10.0, "now": 1e9}
    assert decide(_snap("WAITING_FOR_RESOURCES"), **queued)[0] is Verdict.CONTINUE
