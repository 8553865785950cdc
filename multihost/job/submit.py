"""``job submit``: check everything, pack as ``run`` stages, upload once, record, create."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import UsageError
from multihost.job import startup
from multihost.job.cloud import Gcloud
from multihost.job.record import (
    CAPACITIES,
    JobRecord,
    check_bucket,
    check_name,
    check_tpu_type,
    code_url,
)
from multihost.plan import parse_env
from multihost.secrets import parse_secrets
from multihost.stage import pack


@dataclass(frozen=True)
class JobRequest:
    """What ``job submit`` was asked, before any check."""

    name: str
    bucket: str
    tpu_type: str
    runtime_version: str
    command: str
    num_slices: int = 1
    project: str | None = None
    zone: str | None = None
    capacity: str = "on-demand"
    max_restarts: int = 0
    script_dir: Path = Path(".")
    excludes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()  # KEY=NAME: Secret Manager secrets, read by each host
    log_interval: int = 10
    start_timeout: float = 600.0
    coordinator_port: int = 8476
    megascale_port: int = 8081


def startup_script(record: JobRecord) -> str:
    """The rendered startup script of the record's current attempt."""
    return startup.render(
        startup.StartupValues(
            job=record.name,
            attempt=record.attempt,
            bucket=record.bucket,
            code_hash=record.code_hash,
            command=record.command,
            env=record.env,
            secrets=record.secrets,
            project=record.project,
            log_interval=record.log_interval,
            coordinator_port=record.coordinator_port,
            megascale_port=record.megascale_port,
        )
    )


def check(req: JobRequest) -> JobRequest:
    """Every check that needs no cloud call; raises ``UsageError`` (exit 2)."""
    check_name(req.name)
    check_tpu_type(req.tpu_type)
    if req.capacity not in CAPACITIES:
        raise UsageError(f"bad capacity {req.capacity!r}")
    if not req.command.strip():
        raise UsageError("--cmd is empty")
    if not req.runtime_version.strip():
        raise UsageError("--runtime-version is empty")
    for value, what in ((req.num_slices, "--num-slices"), (req.log_interval, "--log-interval")):
        if value < 1:
            raise UsageError(f"{what} must be at least 1")
    if req.max_restarts < 0:
        raise UsageError("--max-restarts must be 0 or more")
    if not req.script_dir.is_dir():
        raise UsageError(f"script dir {req.script_dir} does not exist or is not a directory")
    env = parse_env(list(req.env))
    both = sorted({k for k, _ in parse_secrets(req.secrets)} & set(env))
    if both:
        raise UsageError(f"{both[0]} is given both as --env and as --secret")
    return JobRequest(**{**req.__dict__, "bucket": check_bucket(req.bucket)})


@dataclass(frozen=True)
class Submitted:
    record: JobRecord
    uploaded: bool
    code_bytes: int


def submit(
    req: JobRequest, gcloud: Gcloud, note: Callable[[str], None] = lambda _: None
) -> Submitted:
    """Returns once the queued resource request is accepted."""
    req = check(req)
    env = tuple(parse_env(list(req.env)).items())
    secrets = parse_secrets(req.secrets)
    archive = pack(req.script_dir, req.excludes)
    record = JobRecord(
        name=req.name, bucket=req.bucket, tpu_type=req.tpu_type, num_slices=req.num_slices,
        runtime_version=req.runtime_version, command=req.command, code_hash=archive.digest,
        project=req.project, zone=req.zone, capacity=req.capacity, env=env, secrets=secrets,
        max_restarts=req.max_restarts, log_interval=req.log_interval,
        start_timeout=req.start_timeout, coordinator_port=req.coordinator_port,
        megascale_port=req.megascale_port, created_at=time.time(),
    )  # fmt: skip
    url = code_url(req.bucket, archive.digest)
    there = gcloud.existing(record.record_url, url)
    if record.record_url in there:
        raise UsageError(f"job {req.name!r} already exists in {req.bucket}: pick another name")
    uploaded = url not in there
    record = record.evolve(attempt_times=(time.time(),))
    # The code and the record go up side by side (each gcloud call costs about a second);
    # the queued resource is asked for only once both are there.
    with ThreadPoolExecutor(2) as pool:
        saved = pool.submit(gcloud.save_record, record)
        if uploaded:
            note(f"uploading code {archive.short} ({archive.files} files, {len(archive.data)} B)")
            gcloud.put_bytes(archive.data, url)
        else:
            note(f"code {archive.short} is already in {req.bucket}: nothing to upload")
        saved.result()
    gcloud.create(record, startup_script(record))
    return Submitted(record, uploaded, len(archive.data))
