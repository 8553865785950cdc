"""The job path's cloud calls: its queued resources and its record, through the one gcloud
seam (``multihost.cloud``)."""

from __future__ import annotations

import tempfile

from multihost.cloud import queued
from multihost.cloud.gcloud import Gcloud
from multihost.job.record import JobRecord, JobRecordError, resource_name, save_local

GONE_STATES = ("SUSPENDING", "SUSPENDED", "FAILED")


def create_argv(record: JobRecord, script: str) -> list[str]:
    """``queued-resources create`` for the record's current attempt; ``script``: a file."""
    return queued.create_argv(
        record.resource,
        accelerator_type=record.tpu_type,
        runtime_version=record.runtime_version,
        project=record.project,
        zone=record.zone,
        node_count=record.num_slices,
        capacity=record.capacity,
        metadata_files={"startup-script": script},
    )


def describe_argv(record: JobRecord) -> list[str]:
    return queued.describe_argv(record.resource, record.project, record.zone)


def delete_argv(record: JobRecord, attempt: int | None = None) -> list[str]:
    name = resource_name(record.name, record.attempt if attempt is None else attempt)
    return queued.delete_argv(name, record.project, record.zone)


def describe_state(gcloud: Gcloud, record: JobRecord) -> str | None:
    """The current attempt's queued resource's ``state.state``; None when it does not exist."""
    return gcloud.queued_state(record.resource, record.project, record.zone)


def create(gcloud: Gcloud, record: JobRecord, script: str) -> None:
    """The current attempt's queued resource, its startup script ``script``."""
    with tempfile.NamedTemporaryFile("w", prefix="multihost-startup-", suffix=".sh") as f:
        f.write(script)
        f.flush()
        gcloud.run(create_argv(record, f.name))


def delete(gcloud: Gcloud, record: JobRecord, attempt: int | None = None) -> bool:
    """Delete the attempt's queued resource (its nodes go too); False if it was gone."""
    name = resource_name(record.name, record.attempt if attempt is None else attempt)
    return gcloud.delete_queued(name, record.project, record.zone)


def save_record(gcloud: Gcloud, record: JobRecord) -> None:
    save_local(record)
    gcloud.put_bytes(record.to_json().encode(), record.record_url)


def load_record(gcloud: Gcloud, record: JobRecord) -> JobRecord:
    """The bucket's copy of the record (the truth), mirrored locally."""
    try:
        fresh = JobRecord.from_json(gcloud.cat(record.record_url))
    except JobRecordError as exc:
        raise JobRecordError(f"the bucket's record {record.record_url}: {exc}") from None
    if fresh.name != record.name:
        raise JobRecordError(f"the bucket's record {record.record_url} names {fresh.name!r}")
    save_local(fresh)
    return fresh
