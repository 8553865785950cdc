"""A pod's life against the TPU API: ``up`` (zone by zone, nothing left behind when a zone
cannot give capacity), ``down``, where a pod stands, and ``gc`` of dead requests.

Every gcloud call goes through a :class:`Runner` (the one gcloud runner of the package);
the command lines come from :mod:`multihost.pods.plan`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from multihost.cloud import checks, tpus
from multihost.cloud.gcloud import Gcloud, Ran, one_line, require
from multihost.errors import CloudTimeout, GcloudMissing, MultihostError, UsageError
from multihost.pods import plan, records
from multihost.pods.plan import PodSpec
from multihost.pods.prices import region_of
from multihost.pods.records import PodRecord

Say = Callable[[str], None]


class Runner(Protocol):
    """Runs ``gcloud ARGV`` (the package's gcloud runner satisfies this)."""

    def run(self, argv: list[str], *, check: bool = True) -> Ran[bytes]: ...


class PodError(MultihostError):
    """A pod could not be made or ended; the message says why, zone by zone."""


def gcloud_client(say: Say | None = None) -> Gcloud:
    """The gcloud every pod command uses, found first (a missing CLI is named before anything
    starts: ``GcloudMissing``, exit 2); ``say`` is told what a slow call is waiting for."""
    client = Gcloud.from_env(say)
    require(client.binary)
    return client


def default_zone(gcloud: Runner) -> str | None:
    """gcloud's default zone (``CLOUDSDK_COMPUTE_ZONE``, or its configuration's), if any."""
    proc = gcloud.run(tpus.default_zone_argv(), check=False)
    zone = proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""
    return zone or None


def zones_for(
    zone: str | None, zones: str | Sequence[str] | None, gcloud: Runner
) -> tuple[str, ...]:
    """Where to ask for a pod: ``--zones A,B,C`` or ``--zone Z``, else gcloud's default zone
    (the rule every command on a pod follows; a pod made is then found by its record)."""
    given = plan.zones_of(zone, zones)
    if given:
        return given
    found = default_zone(gcloud)
    if found is None:
        raise UsageError(
            "no zone: give --zone ZONE or --zones A,B,C (gcloud has no default zone; "
            "gcloud config set compute/zone ZONE sets one)"
        )
    return (checks.check_zone(found),)


@dataclass(frozen=True)
class Attempt:
    """One zone tried by ``up``: ``outcome`` is active, quota, capacity, timeout, error or
    skipped (its region refused this capacity type for quota already)."""

    zone: str
    outcome: str
    detail: str

    def line(self) -> str:
        return f"{self.zone}: {self.outcome}: {self.detail}"


def _err(proc: Ran[bytes]) -> str:
    return proc.stderr.decode(errors="replace")


def describe(gcloud: Runner, name: str, zone: str, project: str | None) -> dict[str, Any] | None:
    """The queued resource's JSON; None when it does not exist (in that zone)."""
    proc = gcloud.run(plan.describe_argv(name, zone, project), check=False)
    if proc.returncode != 0:
        if "NOT_FOUND" in _err(proc):
            return None
        raise PodError(f"describing {name} in {zone}: {one_line(_err(proc))}")
    found = json.loads(proc.stdout or b"{}")
    return found if isinstance(found, dict) else None


def state_of(qr: dict[str, Any] | None) -> str:
    return "GONE" if qr is None else str((qr.get("state") or {}).get("state", "UNKNOWN"))


def delete(gcloud: Runner, name: str, zone: str, project: str | None) -> bool:
    """Send the delete (its nodes too); False when there was nothing to delete."""
    proc = gcloud.run(plan.delete_argv(name, zone, project), check=False)
    if proc.returncode == 0:
        return True
    if "NOT_FOUND" in _err(proc):
        return False
    raise PodError(f"deleting {name} in {zone}: {one_line(_err(proc))}")


def wait_gone(
    gcloud: Runner, name: str, zone: str, project: str | None, poll: float, timeout: float = 600
) -> None:
    deadline = time.monotonic() + timeout
    while describe(gcloud, name, zone, project) is not None:
        if time.monotonic() > deadline:
            raise PodError(f"{name} in {zone} still exists {timeout:.0f} s after its delete")
        time.sleep(poll)


def delete_and_wait(gcloud: Runner, name: str, zone: str, project: str | None, poll: float) -> None:
    if delete(gcloud, name, zone, project):
        wait_gone(gcloud, name, zone, project, poll)


def up(spec: PodSpec, gcloud: Runner, say: Say, *, poll: float) -> tuple[PodRecord, list[Attempt]]:
    """Request the pod zone by zone until one is ACTIVE. A quota refusal skips the region's
    other zones; a zone without capacity (its request FAILED, or still queued at the queue
    timeout) has its request deleted, and seen gone, before the next zone is asked. Ctrl-C
    (KeyboardInterrupt) deletes the request in flight. Raises :class:`PodError` naming every
    zone's reason when none worked; then nothing is left anywhere."""
    existing = records.find(spec.name)
    if existing is not None:
        raise UsageError(
            f"pod {spec.name!r} exists already (zone {existing.zone}, "
            f"{existing.state}): multihost down {spec.name} first"
        )
    attempts: list[Attempt] = []
    refused: set[str] = set()  # regions that refused this capacity type for quota
    for zone in spec.zones:
        if region_of(zone) in refused:
            attempts.append(Attempt(zone, "skipped", f"quota refused in {region_of(zone)}"))
            continue
        record = spec.record(zone, time.time())
        records.save(record)
        try:
            attempt, record = _try_zone(spec, record, gcloud, say, poll)
        except CloudTimeout as exc:  # asked to delete, a hung gcloud would hang as long again
            raise PodError(
                f"{exc}; the request in {zone} may exist: it stays recorded (multihost pods), "
                f"the service gives up on it at its valid-until, and multihost down "
                f"{spec.name} deletes it"
            ) from None
        except GcloudMissing:
            records.forget(spec.name)
            raise
        except BaseException as exc:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed ({exc})"
            say(f"{why}: deleting the request in {zone}")
            try:
                delete_and_wait(gcloud, spec.name, zone, spec.project, poll)
            finally:
                records.forget(spec.name)
            raise
        attempts.append(attempt)
        if attempt.outcome == "active":
            return record, attempts
        records.forget(spec.name)
        if attempt.outcome == "quota":
            refused.add(region_of(zone))
        say(f"{attempt.line()}; trying the next zone" if zone != spec.zones[-1] else attempt.line())
    lines = "\n".join(f"  {a.line()}" for a in attempts)
    raise PodError(
        f"no zone could give {spec.name} ({spec.num_slices} x {spec.tpu_type}, "
        f"{spec.capacity}); nothing is left behind:\n{lines}"
    )


def _try_zone(
    spec: PodSpec, record: PodRecord, gcloud: Runner, say: Say, poll: float
) -> tuple[Attempt, PodRecord]:
    zone = record.zone
    proc = gcloud.run(plan.create_argv(spec, zone), check=False)
    if proc.returncode != 0:
        text = _err(proc)
        kind = plan.classify(text)
        if kind == "exists":  # a retried create the service had taken: go on with it
            qr = describe(gcloud, spec.name, zone, spec.project)
            if qr is None or plan.ours(qr) != spec.name:
                return Attempt(zone, "error", one_line(text)), record
        else:
            return Attempt(zone, kind, one_line(text)), record
    say(
        f"requested {spec.name} in {zone} ({spec.num_slices} x {spec.tpu_type}, "
        f"{spec.capacity}); waiting at most {spec.queue_timeout:.0f} s for capacity"
    )
    last = ""
    while True:
        qr = describe(gcloud, spec.name, zone, spec.project)
        state = state_of(qr)
        if state != last:
            say(f"{spec.name} in {zone}: {state}")
            last = state
        if state == "ACTIVE":
            record = record.evolve(state="active", active_at=time.time())
            records.save(record)
            return Attempt(zone, "active", "ACTIVE"), record
        if state == "GONE":
            return Attempt(zone, "error", "the request vanished (deleted elsewhere?)"), record
        if state in plan.DEAD:
            reason = plan.failure(qr or {})
            delete_and_wait(gcloud, spec.name, zone, spec.project, poll)
            kind = "capacity" if ("capacity" in reason or "code 8" in reason) else "failed"
            return Attempt(zone, kind, reason), record
        if time.time() > record.valid_until + max(10.0, 3 * poll):  # the service's own
            # valid-until should have FAILED it by now: a backstop, not the usual way
            delete_and_wait(gcloud, spec.name, zone, spec.project, poll)
            return Attempt(
                zone, "timeout", f"still {state} after {spec.queue_timeout:.0f} s; request deleted"
            ), record
        time.sleep(poll)


def find_zone(gcloud: Runner, name: str, zones: tuple[str, ...], project: str | None) -> str | None:
    """Where a pod with no record lives: the first of ``zones`` with a request labelled as
    multihost's pod ``name``."""
    for zone in zones:
        qr = describe(gcloud, name, zone, project)
        if qr is not None and plan.ours(qr) == name:
            return zone
    return None


def down(
    gcloud: Runner,
    name: str,
    say: Say,
    *,
    wait: bool,
    poll: float,
    zones: tuple[str, ...] = (),
    project: str | None = None,
) -> tuple[PodRecord | None, str, bool]:
    """Delete the pod (every slice). Returns (its record if any, its zone, whether a delete
    was sent). The zone comes from multihost's record, else from a labelled request in one of
    ``zones``; neither: UsageError (exit 2)."""
    record = records.find(name)
    zone = record.zone if record else find_zone(gcloud, name, zones, project)
    if zone is None:
        where = f" in {', '.join(zones)}" if zones else " (give --zone to look for its labels)"
        raise UsageError(f"no pod {name!r}: none recorded here and none labelled{where}")
    project = record.project if record else project
    sent = delete(gcloud, name, zone, project)
    if record is not None:
        records.save(record.evolve(state="deleting"))
    if wait and sent:
        say(f"deleting {name} in {zone}; waiting until it is gone")
        wait_gone(gcloud, name, zone, project, poll)
    if wait or not sent:
        records.forget(name)
    return record, zone, sent


@dataclass(frozen=True)
class Standing:
    """A recorded pod and what the API says of it now."""

    record: PodRecord
    state: str  # the request's state.state, or GONE
    reason: str = ""
    recorded: bool = True  # False: found by its label only (made from another machine)


def standing(gcloud: Runner, record: PodRecord) -> Standing:
    qr = describe(gcloud, record.name, record.zone, record.project)
    state = state_of(qr)
    reason = plan.failure(qr) if qr is not None and state in plan.DEAD else ""
    return Standing(record, state, reason)


def labelled(gcloud: Runner, zones: tuple[str, ...], project: str | None) -> list[Standing]:
    """The requests labelled as multihost's in ``zones`` (one list call per zone), whoever
    made them."""
    found = []
    for zone in zones:
        proc = gcloud.run(plan.list_argv(zone, project), check=False)
        if proc.returncode != 0:
            raise PodError(f"listing the requests in {zone}: {one_line(_err(proc))}")
        listed = json.loads(proc.stdout or b"[]")
        for qr in listed if isinstance(listed, list) else []:
            record = plan.record_of(qr, zone, project) if isinstance(qr, dict) else None
            if record is None:
                continue
            state = state_of(qr)
            reason = plan.failure(qr) if state in plan.DEAD else ""
            found.append(Standing(record, state, reason, recorded=False))
    return found


def standings(
    gcloud: Runner, zones: tuple[str, ...] = (), project: str | None = None
) -> list[Standing]:
    """Every pod recorded here, then every labelled request in ``zones`` with no record here."""
    mine = [standing(gcloud, r) for r in records.all_records()]
    known = {(s.record.name, s.record.zone) for s in mine}
    others = [
        s for s in labelled(gcloud, zones, project) if (s.record.name, s.record.zone) not in known
    ]
    return mine + others


def dead_reason(s: Standing, now: float) -> str | None:
    """Why a pod's request can never run again, or None when it still may (or runs)."""
    if s.state in plan.DEAD:
        return f"{s.state}: {s.reason}" if s.reason else s.state
    if s.state in plan.WAITING and s.record.active_at is None and now > s.record.valid_until:
        return f"{s.state} past its queue deadline"
    if s.state == "GONE":
        return "gone already (record only)"
    return None


def gc(
    gcloud: Runner,
    say: Say,
    *,
    dry_run: bool,
    zones: tuple[str, ...] = (),
    project: str | None = None,
) -> list[tuple[Standing, str]]:
    """Delete the requests multihost made that can never run again (those recorded here, and
    those labelled in ``zones``); their records go too."""
    found = []
    now = time.time()
    for s in standings(gcloud, zones, project):
        record = s.record
        why = dead_reason(s, now)
        if why is None:
            continue
        found.append((s, why))
        if dry_run:
            continue
        if s.state != "GONE":
            delete(gcloud, record.name, record.zone, record.project)
        if s.recorded:
            records.forget(record.name)
    return found
