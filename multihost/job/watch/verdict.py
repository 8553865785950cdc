"""What one ``job watch`` poll saw (``Snapshot``, ``HostView``) and what it means (``decide``).

Pure: no gcloud, no clock of its own. ``decide`` says keep going, done, a worker failed, the
resource was preempted or deleted, or the workers never reported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from multihost.job.cloud import GONE_STATES

HostKey = tuple[int, int]  # (slice, worker)


@dataclass(frozen=True)
class HostView:
    """One worker of the current attempt, as the bucket shows it."""

    slice_id: int
    worker: int
    started: bool = False
    exit_code: int | None = None
    log_size: int = 0

    @property
    def name(self) -> str:
        return f"s{self.slice_id}/w{self.worker}"

    @property
    def state(self) -> str:
        if self.exit_code is not None:
            return "done" if self.exit_code == 0 else "failed"
        return "running" if self.started else "waiting"


@dataclass(frozen=True)
class Snapshot:
    """What one poll saw."""

    resource_state: str | None  # None: the queued resource does not exist
    hosts: tuple[HostView, ...]
    expected: int | None  # workers in all slices, when known


class Verdict(enum.Enum):
    CONTINUE = "continue"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    START_TIMEOUT = "start-timeout"
    NEVER_ACTIVE = "never-active"  # gone (or failed) before it was ever ACTIVE
    DELETED = "deleted"  # deleted while ACTIVE: by someone, not by a preemption


def decide(
    snap: Snapshot,
    *,
    active_since: float | None,
    start_timeout: float,
    now: float,
    seen_active: bool = True,
) -> tuple[Verdict, HostView | None]:
    """The job's truth from one snapshot; a failure wins over everything, then success.
    Only a resource seen ACTIVE (or a worker seen started) can have been preempted; one that
    is deleted (absent, or DELETING) was removed by someone."""
    for h in snap.hosts:
        if h.exit_code not in (None, 0):
            return Verdict.FAILED, h
    exited = [h for h in snap.hosts if h.exit_code == 0]
    if snap.expected is not None and len(exited) >= snap.expected:
        return Verdict.SUCCEEDED, None
    seen_active = seen_active or any(h.started or h.exit_code is not None for h in snap.hosts)
    state = snap.resource_state
    if state in ("SUSPENDING", "SUSPENDED"):  # only ever after ACTIVE: a preemption
        return Verdict.PREEMPTED, None
    gone = state in (None, "DELETING")
    if (gone or state in GONE_STATES) and not seen_active:
        return Verdict.NEVER_ACTIVE, None
    if gone:
        return Verdict.DELETED, None
    if state in GONE_STATES:
        return Verdict.PREEMPTED, None
    reported = sum(1 for h in snap.hosts if h.started or h.exit_code is not None)
    all_in = snap.expected is not None and reported >= snap.expected
    if active_since is not None and not all_in and now - active_since > start_timeout:
        return Verdict.START_TIMEOUT, None
    return Verdict.CONTINUE, None
