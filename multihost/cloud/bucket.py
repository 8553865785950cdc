"""The bucket layout every side agrees on (the runner, ``multihost job``, the hosts' scripts).

``gs://BUCKET/multihost/``
  ``code/<sha256>.tar.gz``            a code archive, named by its content
  ``uv/<sha256>``                     the runner's uv binary, for hosts without one
  ``envs/<key>/<sha256>.tar.gz``      a packed environment of lock key ``key``
  ``jobs/<name>/job.json``            a job's record (the truth; mirrored locally)
  ``jobs/<name>/attempt-<n>/slice-S-worker-W.{log,started,exit}``   each host's own objects
  ``jobs/<name>/compile-cache/slice-S-worker-W/``   a worker's compile cache, kept across
  attempts (its keys are its own: a process's programs are compiled for its devices)
"""

from __future__ import annotations

import re

from multihost.errors import UsageError

_BUCKET = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_HOST_OBJECT = re.compile(r"slice-([0-9]+)-worker-([0-9]+)\.(log|started|exit)$")


def check_bucket(bucket: str) -> str:
    """``gs://NAME`` with no path; the trailing ``/`` is dropped."""
    bucket = bucket.rstrip("/")
    if not _BUCKET.match(bucket):
        raise UsageError(f"bad bucket {bucket!r}: expected gs://BUCKET")
    return bucket


def code_url(bucket: str, code_hash: str) -> str:
    return f"{bucket}/multihost/code/{code_hash}.tar.gz"


def uv_binary_url(bucket: str, digest: str) -> str:
    """The runner's uv binary, for hosts that have none: ``…/multihost/uv/<sha256>``."""
    return f"{bucket}/multihost/uv/{digest}"


def env_prefix(bucket: str, key: str) -> str:
    """Where the packed environments of ``key`` are kept: ``…/<key>/``."""
    return f"{bucket}/multihost/envs/{key}/"


def env_url(bucket: str, key: str, digest: str) -> str:
    """One packed environment, named by its content: ``…/envs/<key>/<sha256>.tar.gz``."""
    return f"{env_prefix(bucket, key)}{digest}.tar.gz"


def job_prefix(bucket: str, name: str) -> str:
    """Everything of job ``name``: ``…/multihost/jobs/<name>``."""
    return f"{bucket}/multihost/jobs/{name}"


def compile_cache_prefix(bucket: str, name: str) -> str:
    """The job's workers' compile caches: ``…/jobs/<name>/compile-cache`` (each worker's under
    ``slice-S-worker-W/``)."""
    return f"{job_prefix(bucket, name)}/compile-cache"


def record_url(bucket: str, name: str) -> str:
    return f"{job_prefix(bucket, name)}/job.json"


def attempt_prefix(bucket: str, name: str, attempt: int) -> str:
    return f"{job_prefix(bucket, name)}/attempt-{attempt}"


def host_url(bucket: str, name: str, attempt: int, slice_id: int, worker: int, kind: str) -> str:
    """One host's object of one attempt: ``…/slice-S-worker-W.KIND`` (log, started, exit)."""
    return f"{attempt_prefix(bucket, name, attempt)}/slice-{slice_id}-worker-{worker}.{kind}"


def parse_host_object(name: str) -> tuple[int, int, str] | None:
    """``…/slice-S-worker-W.KIND`` → (S, W, KIND)."""
    m = _HOST_OBJECT.search(name)
    return (int(m[1]), int(m[2]), m[3]) if m else None
