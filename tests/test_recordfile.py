"""The one writer of records: run.json, a pod's pod.json and a job's job.json are each written
by ``multihost.runs.files.save`` (a private dir, a 0600 file, replaced atomically) and read
back by their own class as what was written."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from multihost.errors import UsageError
from multihost.job.record import JobRecord, read_local, save_local
from multihost.model import Host, Job, State
from multihost.pods import records
from multihost.pods.records import PodRecord
from multihost.results.records import HostResult
from multihost.runs import files
from multihost.runs.record import RunRecord, read_record, write_record

POD = PodRecord("p1", "v4-8", 1, "tpu-ubuntu2204-base", "spot", "us-central2-b", created_at=1.0)
JOB = JobRecord("j1", "gs://b", "v4-8", 1, "v", "true", "abc", created_at=1.0)
RUN = RunRecord(
    "r1",
    Job(command="true", run_name="r1"),
    (HostResult(Host("127.0.0.1"), State.DONE, exit_code=0),),
)


def _private(path: Path) -> None:
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_each_record_is_written_by_the_one_writer_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    written: list[Path] = []
    real = files.save

    def spy(path: Path, record: files.TypedRecord) -> Path:
        written.append(path)
        return real(path, record)

    monkeypatch.setattr(files, "save", spy)
    pod = records.save(POD)
    job = save_local(JOB)
    run_dir = tmp_path / "logs" / "runs" / "r1"
    write_record(run_dir, RUN)
    assert written == [pod, job, run_dir / "run.json"]
    for path in written:
        _private(path)
    assert records.find("p1") == POD
    assert read_local(job) == JOB
    back = read_record(run_dir)
    assert (back.run_name, back.hosts[0].state, back.schema) == ("r1", State.DONE, RUN.schema)
    for record in (POD, JOB, RUN):  # each says its version, and reads back what it wrote
        assert record.schema >= 1
        again = type(record).from_json(record.to_json())
        assert again.to_json() == record.to_json()


def test_a_failed_write_keeps_the_old_record_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "d" / "pod.json"
    files.save(path, POD)

    class Broken:
        schema = 1

        def to_json(self) -> str:
            return "\udcff"  # not encodable: the write fails halfway

    with pytest.raises(UnicodeEncodeError):
        files.save(path, Broken())
    assert PodRecord.from_json(path.read_text()) == POD
    _private(path)


def test_no_record_is_written_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "d").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="is a symbolic link"):
        files.save(tmp_path / "d" / "pod.json", POD)
    assert list((tmp_path / "elsewhere").iterdir()) == []
