"""``multihost job``, pure tier: corrupt job records, the patient gcloud (a stand-in gcloud
script that fails, then answers), private local state."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from multihost.cloud.retry import Episode, PatientGcloud, backoff, classify
from multihost.errors import CloudError, CloudPermissionDenied, MultihostError
from multihost.job import cloud
from multihost.job.record import JobRecord, JobRecordError, list_local, save_local
from multihost.secrets import parse_secrets
from tests.clitools import cli
from tests.test_job import REC

CORRUPT: dict[str, bytes | None] = {
    "not utf-8": b"\xff\xfe\x00garbage",
    "torn": b'{"name": "x", "sch',
    "a list": b"[]",
    "no state": REC.to_json().replace('"state": "running",', "").encode(),
    "a string attempt": REC.to_json().replace('"attempt": 0', '"attempt": "0"').encode(),
    "newer schema": REC.to_json().replace('"schema": 1', '"schema": 9').encode(),
    "a directory": None,
}


def _plant(logs: Path, name: str, data: bytes | None) -> None:
    path = logs / "jobs" / name / "job.json"
    path.parent.mkdir(parents=True)
    if data is None:
        path.mkdir()
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("kind", sorted(CORRUPT))
@pytest.mark.parametrize("command", ["status", "watch", "logs", "stop"])
def test_corrupt_record_is_one_line_exit_2(tmp_path: Path, kind: str, command: str) -> None:
    _plant(tmp_path, "train", CORRUPT[kind])
    done = cli(
        ["job", command, "train"], MULTIHOST_LOG_DIR=str(tmp_path), MULTIHOST_GCLOUD="/bin/false"
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, done.stderr
    assert lines[0].startswith("multihost: error: ")
    assert "jobs/train/job.json" in lines[0]


def test_ls_lists_an_unreadable_record_and_fails(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path))
    save_local(REC)
    _plant(tmp_path, "broken", CORRUPT["torn"])
    _plant(tmp_path, "dir", None)
    listed = list_local()
    assert [getattr(r, "name", None) for r in listed] == ["train", "broken", "dir"]
    done = cli(["job", "ls"], MULTIHOST_LOG_DIR=str(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "train" in done.stdout
    assert "broken" in done.stdout
    assert "unreadable" in done.stdout
    assert "Traceback" not in done.stderr
    assert "job broken: unreadable record" in done.stderr
    as_json = cli(["job", "ls", "--json"], MULTIHOST_LOG_DIR=str(tmp_path))
    assert as_json.returncode == 1
    assert '"state": "unreadable"' in as_json.stdout


def test_local_job_state_is_private(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    path = save_local(REC)
    save_local(REC.evolve(attempt=1))
    for p in (tmp_path / "logs", tmp_path / "logs" / "jobs", path.parent):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert JobRecord.from_json(path.read_bytes()).attempt == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["job.json"]


def test_record_reader_refuses_odd_records() -> None:
    for data in CORRUPT.values():
        if data is not None:
            with pytest.raises(JobRecordError):
                JobRecord.from_json(data)
    with pytest.raises(JobRecordError, match="bad job name"):
        JobRecord.from_json(REC.to_json().replace('"name": "train"', '"name": "../x"'))
    assert JobRecord.from_json(REC.evolve(secrets=(("K", "n"),)).to_json()).secrets == (("K", "n"),)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("ERROR: (gcloud.storage.objects.list) UNAVAILABLE: HTTPError 503", "transient"),
        ("crashed (ConnectionError): ('Connection aborted.', ConnectionResetError(", "transient"),
        ("ERROR: (gcloud.x) RESOURCE_EXHAUSTED: Quota exceeded (429)", "transient"),
        ("ERROR: (gcloud.x) PERMISSION_DENIED: caller does not have permission", "denied"),
        ("ERROR: (gcloud.storage.objects.list) gs://nobucket not found: 404.", "no-bucket"),
        (
            "ERROR: (gcloud.x) NOT_FOUND: queued resource x not found. This command is "
            "unauthenticated because the [auth/disable_credentials] property is True",
            "other",
        ),
    ],
)
def test_classify(text: str, kind: str) -> None:
    assert classify(text) == kind


def test_backoff_is_jittered_and_capped() -> None:
    waits = [backoff(n, 300) for n in range(1, 30) for _ in range(20)]
    assert max(waits) <= 30
    assert len(set(waits)) > 100
    assert max(backoff(n, 20) for n in range(1, 30)) <= 2


def _fake_gcloud(tmp_path: Path, fails: int, error: str) -> Path:
    """A gcloud stand-in that fails its first ``fails`` calls with ``error`` on stderr."""
    script = tmp_path / "gcloud"
    count = tmp_path / "count"
    count.write_text("0")
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {count}); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -lt {fails} ]; then echo "ERROR: (gcloud) {error}" >&2; exit 1; fi\n'
        "echo '[]'\n"
    )
    script.chmod(0o755)
    return script


def test_patient_gcloud_one_warning_per_episode(tmp_path: Path) -> None:
    warned: list[str] = []
    episode = Episode(60.0, warned.append)
    binary = _fake_gcloud(tmp_path, 4, "UNAVAILABLE: HTTPError 503")
    g = PatientGcloud(str(binary), 10.0, episode, sleep=lambda _: None)
    assert g.objects("gs://bkt/x") == {}
    assert (tmp_path / "count").read_text().strip() == "5"
    assert len(warned) == 2
    assert warned[0].startswith("the control plane is failing (ERROR: (gcloud) UNAVAILABLE")
    assert warned[1].startswith("the control plane answers again after")
    assert g.objects("gs://bkt/x") == {}
    assert len(warned) == 2  # no episode, no word


def test_patient_gcloud_gives_up_after_the_timeout_and_at_once_on_403(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    episode = Episode(30.0, lambda _: None, clock=lambda: now[0])
    binary = _fake_gcloud(tmp_path, 10**6, "UNAVAILABLE: HTTPError 503")
    g = PatientGcloud(str(binary), 10.0, episode, sleep=sleep)
    with pytest.raises(CloudError, match=r"kept failing for 3[0-9]s .*--control-plane-timeout 30"):
        g.objects("gs://bkt/x")
    denied = _fake_gcloud(tmp_path, 1, "PERMISSION_DENIED: caller does not have permission")
    g = PatientGcloud(str(denied), 10.0, Episode(30.0, lambda _: None), sleep=sleep)
    with pytest.raises(CloudPermissionDenied, match="permission denied by the control plane"):
        cloud.describe_state(g, REC)
    assert (tmp_path / "count").read_text().strip() == "1"


def test_parse_secrets() -> None:
    assert parse_secrets(["A=x", "B_2=y-z"]) == (("A", "x"), ("B_2", "y-z"))
    for bad in (["A"], ["1=x"], ["A=x/y"], ["A=x", "A=y"], ["A="]):
        with pytest.raises(MultihostError):
            parse_secrets(bad)


def test_submit_refuses_bad_secrets_before_any_cloud_call(tmp_path: Path) -> None:
    base = [
        "job",
        "submit",
        "j",
        "--tpu-type",
        "v4-16",
        "--runtime-version",
        "v",
        "--bucket",
        "gs://bkt",
        "--script-dir",
        str(tmp_path),
        "--cmd",
        "true",
    ]
    for extra in (["--secret", "K"], ["--secret", "K=a", "--env", "K=v"]):
        done = cli([*base, *extra], MULTIHOST_LOG_DIR=str(tmp_path), MULTIHOST_GCLOUD="/bin/false")
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_sweep_results_and_stacks_are_private(tmp_path: Path) -> None:
    from multihost.diagnose.collect import parse_collect, save
    from multihost.model import Host
    from multihost.sweep.results import ResultsStore

    store = ResultsStore(tmp_path / "logs" / "sweep-1")
    store.append({"point": "p0", "repeat": 0, "status": "ok"})
    store.write_csv(store.load())
    folder = save([parse_collect(Host("h0"), "")], tmp_path / "logs")
    files = [store.path, store.csv_path, *folder.iterdir()]
    dirs = [tmp_path / "logs", store.directory, folder.parent, folder]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o600"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in dirs} == {"0o700"}
