"""``job status``, ``logs``, ``stop``: read (or end) a job from its record and its objects."""

from __future__ import annotations

from dataclasses import dataclass

from multihost.cloud.bucket import parse_host_object
from multihost.cloud.gcloud import Gcloud
from multihost.job import cloud
from multihost.job.record import JobRecord, JobState


@dataclass(frozen=True)
class JobWorker:
    """One worker of one attempt of a job, as its objects in the bucket say (a job's hosts are
    not reached over SSH: this is not a ``HostResult``)."""

    slice_id: int
    worker: int
    started: bool
    exit_code: int | None
    log_bytes: int

    @property
    def state(self) -> str:
        if self.exit_code is not None:
            return "done" if self.exit_code == 0 else "failed"
        return "running" if self.started else "waiting"


@dataclass(frozen=True)
class JobStatus:
    record: JobRecord
    resource_state: str | None
    hosts: tuple[JobWorker, ...]


def host_statuses(gcloud: Gcloud, record: JobRecord, attempt: int) -> tuple[JobWorker, ...]:
    objects = gcloud.objects(record.attempt_prefix(attempt))
    seen: dict[tuple[int, int], dict[str, int]] = {}
    for url, size in objects.items():
        parsed = parse_host_object(url)
        if parsed:
            seen.setdefault(parsed[:2], {})[parsed[2]] = size
    exited = [key for key, kinds in sorted(seen.items()) if "exit" in kinds]
    urls = [record.host_url(s, w, "exit", attempt) for s, w in exited]
    texts = gcloud.cat_many(urls).decode().split() if urls else []  # one line per exit object
    pairs = zip(exited, texts, strict=False)  # an exit object caught empty has no line yet
    codes = {k: int(t) if t.lstrip("-").isdigit() else 255 for k, t in pairs}
    return tuple(
        JobWorker(s, w, "started" in kinds, codes.get((s, w)), kinds.get("log", 0))
        for (s, w), kinds in sorted(seen.items())
    )


def status(gcloud: Gcloud, record: JobRecord) -> JobStatus:
    record = cloud.load_record(gcloud, record)
    state = cloud.describe_state(gcloud, record)
    return JobStatus(record, state, host_statuses(gcloud, record, record.attempt))


def stop(gcloud: Gcloud, record: JobRecord) -> tuple[JobRecord, bool]:
    """Delete the current attempt's queued resource and record the job as stopped."""
    record = cloud.load_record(gcloud, record)
    deleted = cloud.delete(gcloud, record)
    if not record.state.final:
        record = record.evolve(
            state=JobState.STOPPED, exit_code=130, message="stopped by multihost job stop"
        )
        cloud.save_record(gcloud, record)
    return record, deleted


def log_text(gcloud: Gcloud, record: JobRecord, attempt: int, host: tuple[int, int]) -> bytes:
    return gcloud.cat(record.host_url(host[0], host[1], "log", attempt))
