"""``job submit``: check everything, pack as ``run`` stages, upload once, record, create."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multihost.cloud import checks
from multihost.cloud.bucket import check_bucket, code_url, env_prefix, uv_binary_url
from multihost.cloud.gcloud import Gcloud
from multihost.defaults import DEFAULTS, given_fields
from multihost.envsync.request import request
from multihost.envsync.uvbin import uv_binary, uv_version
from multihost.errors import UsageError
from multihost.job import cloud, startup
from multihost.job.record import JobRecord, check_name
from multihost.remote.commands import parse_env
from multihost.secrets import parse_secrets
from multihost.staging.archive import excluded, pack


@dataclass(frozen=True)
class JobRequest:
    """What ``job submit`` was asked, before any check."""

    name: str
    bucket: str
    tpu_type: str
    runtime_version: str
    command: str
    num_slices: int = DEFAULTS.num_slices
    project: str | None = None
    zone: str | None = None
    capacity: str = DEFAULTS.capacity
    max_restarts: int = DEFAULTS.max_restarts
    script_dir: Path = Path(".")
    excludes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()  # KEY=NAME: Secret Manager secrets, read by each host
    log_interval: int = DEFAULTS.log_interval
    start_timeout: float = DEFAULTS.start_timeout
    coordinator_port: int = DEFAULTS.coordinator_port
    megascale_port: int = DEFAULTS.megascale_port
    # the locked environment, as for run: uv.lock in script_dir, or requirements
    sync: bool = True
    extras: tuple[str, ...] = ()
    all_extras: bool = False
    groups: tuple[str, ...] = ()
    no_dev: bool = False
    requirements: Path | None = None
    env_wait: float = DEFAULTS.env_wait
    compile_cache: int = DEFAULTS.compile_cache_max  # each worker's cap in bytes; 0: none


# JobRequest's fields that a setting of another name gives (``job submit``'s flags by dest,
# ``multihost.submit_job``'s keywords)
_BY_DEST = {
    "cmd": "command",
    "exclude": "excludes",
    "secret": "secrets",
    "extra": "extras",
    "group": "groups",
}
_REQUIRED = {
    "tpu_type": "--tpu-type is required to submit a job (e.g. --tpu-type v4-16; a profile's "
    "tpu-type does too)",
    "runtime_version": "--runtime-version is required to submit a job (e.g. "
    "tpu-ubuntu2204-base; a profile's runtime-version does too)",
    "bucket": "--bucket is required to submit a job (gs://BUCKET; a profile's bucket does too)",
    "command": "--cmd is required: the command every worker runs",
}


def request_of(name: str, given: Mapping[str, Any]) -> JobRequest:
    """The request a job's settings make (``vars(args)`` of ``job submit``, or the keywords of
    ``multihost.submit_job``; by the schema's dests, None: not given, the default)."""
    values = {_BY_DEST.get(k, k): v for k, v in given.items() if v is not None}
    for key, why in _REQUIRED.items():
        if not values.get(key):
            raise UsageError(why)
    if "no_sync" in values:
        values["sync"] = not values.pop("no_sync")
    cache = values.pop("compile_cache", True)
    limit = values.pop("compile_cache_max", DEFAULTS.compile_cache_max)
    values["compile_cache"] = limit if cache else 0
    for key in ("excludes", "env", "secrets", "extras", "groups"):
        if key in values:
            values[key] = _strings(values[key])
    if "script_dir" in values:
        values["script_dir"] = Path(values["script_dir"]).expanduser()
    return JobRequest(**{**given_fields(JobRequest, values), "name": name})


def _strings(value: object) -> tuple[str, ...]:
    """A repeatable setting as given: one string, a list, or (``env``) a mapping."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping):
        return tuple(f"{k}={v}" for k, v in value.items())
    return tuple(str(v) for v in value)  # type: ignore[attr-defined]


def startup_script(record: JobRecord) -> str:
    """The rendered startup script of the record's current attempt."""
    env = None
    if record.env_lock:
        env = startup.EnvValues(
            record.env_lock,
            record.env_select,
            record.env_requirements,
            record.env_wait,
            uv_url=record.uv_url,
            uv_sha256=record.uv_sha256,
            uv_version=record.uv_version,
        )
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
            environment=env,
            compile_cache_url=record.compile_cache_url,
            compile_cache_max=record.compile_cache,
        )
    )


def check(req: JobRequest) -> JobRequest:
    """Every check that needs no cloud call; raises ``UsageError`` (exit 2)."""
    check_name(req.name)
    checks.check_tpu_type(req.tpu_type)
    checks.check_capacity(req.capacity)
    checks.check_slices(req.num_slices)
    if req.zone is not None:
        checks.check_zone(req.zone)
    if not req.command.strip():
        raise UsageError("--cmd is empty")
    if not req.runtime_version.strip():
        raise UsageError("--runtime-version is empty")
    if req.log_interval < 1:
        raise UsageError("--log-interval must be at least 1")
    if req.max_restarts < 0:
        raise UsageError("--max-restarts must be 0 or more")
    if req.env_wait <= 0:
        raise UsageError("--env-wait must be more than 0")
    if not req.script_dir.is_dir():
        raise UsageError(f"script dir {req.script_dir} does not exist or is not a directory")
    env = parse_env(list(req.env))
    both = sorted({k for k, _ in parse_secrets(req.secrets)} & set(env))
    if both:
        raise UsageError(f"{both[0]} is given both as --env and as --secret")
    return JobRequest(**{**req.__dict__, "bucket": check_bucket(req.bucket)})


@dataclass(frozen=True)
class _Uv:
    """The runner's uv, shipped through the bucket to hosts that have none."""

    data: bytes
    digest: str
    url: str
    version: str


def _uv(bucket: str) -> _Uv | None:
    binary = uv_binary()
    if binary is None:
        return None  # the hosts must have their own
    data = Path(binary).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    return _Uv(data, digest, uv_binary_url(bucket, digest), uv_version(binary))


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
    environment = request(
        req.script_dir,
        sync=req.sync,
        extras=req.extras,
        all_extras=req.all_extras,
        groups=req.groups,
        no_dev=req.no_dev,
        requirements=req.requirements,
        lock_excluded=excluded("uv.lock", req.excludes),
    )
    archive = pack(req.script_dir, req.excludes)
    uv = _uv(req.bucket) if environment else None
    record = JobRecord(
        name=req.name,
        bucket=req.bucket,
        tpu_type=req.tpu_type,
        num_slices=req.num_slices,
        runtime_version=req.runtime_version,
        command=req.command,
        code_hash=archive.digest,
        project=req.project,
        zone=req.zone,
        capacity=req.capacity,
        env=env,
        secrets=secrets,
        max_restarts=req.max_restarts,
        log_interval=req.log_interval,
        start_timeout=req.start_timeout,
        coordinator_port=req.coordinator_port,
        megascale_port=req.megascale_port,
        compile_cache=req.compile_cache,
        created_at=time.time(),
    )
    if environment:
        record = record.evolve(
            env_lock=environment.lock_hash,
            env_select=" ".join(environment.selection.flags()),
            env_requirements=environment.requirements.decode(),
            env_wait=req.env_wait,
            uv_url=uv.url if uv else "",
            uv_sha256=uv.digest if uv else "",
            uv_version=uv.version if uv else "",
        )
    url = code_url(req.bucket, archive.digest)
    there = gcloud.existing(record.record_url, url, *([uv.url] if uv else []))
    if record.record_url in there:
        raise UsageError(f"job {req.name!r} already exists in {req.bucket}: pick another name")
    uploaded = url not in there
    record = record.evolve(attempt_times=(time.time(),))
    # The code and the record go up side by side (each gcloud call costs about a second);
    # the queued resource is asked for only once both are there.
    with ThreadPoolExecutor(2) as pool:
        saved = pool.submit(cloud.save_record, gcloud, record)
        if uploaded:
            note(f"uploading code {archive.short} ({archive.files} files, {len(archive.data)} B)")
            gcloud.put_bytes(archive.data, url)
        else:
            note(f"code {archive.short} is already in {req.bucket}: nothing to upload")
        if uv and uv.url not in there:
            note(f"uploading uv {uv.version} for hosts without one ({len(uv.data)} B)")
            gcloud.put_bytes(uv.data, uv.url)
        saved.result()
    if environment:
        note(
            f"{environment.header}: process 0 builds it (or finds it) and caches it in "
            f"{env_prefix(req.bucket, '<key>')}; the other hosts and later attempts take it "
            "from there"
        )
    cloud.create(gcloud, record, startup_script(record))
    return Submitted(record, uploaded, len(archive.data))
