"""A pod's life as the commands (and a Python caller) ask for it: make one (``up``), delete
it (``down``), list them (``pods``), collect dead requests (``gc``), set autodown, and one
ephemeral pod around a run or a sweep (``--prefix NAME --up --down``). Each tells what it does
through ``say`` (one line at a time, no ``multihost:`` prefix) and prints nothing itself.

The one rule for where a pod is: ``--zone`` (``--zones``) when given; else, for a pod
multihost made, its record's zone (``records.located``); else gcloud's default zone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from multihost.cloud import checks
from multihost.defaults import DEFAULTS as D
from multihost.errors import MultihostError, UsageError
from multihost.pods import autodown, lifecycle, plan, prices, records, workers
from multihost.pods.plan import PodFlags, PodSpec
from multihost.pods.records import PodRecord

Say = Callable[[str], None]


def poll() -> float:
    """Seconds between gcloud polls (each call costs ~1 s of CPU); tests shorten it."""
    return float(os.environ.get("MULTIHOST_WAIT_POLL", D.wait_poll))


def where(record: PodRecord) -> str:
    """``2 x v4-16 in us-central2-b (on-demand), $51.52/h``."""
    per_hour = prices.hourly(record.tpu_type, record.zone, record.capacity, record.num_slices)
    return (
        f"{record.num_slices} x {record.tpu_type} in {record.zone} ({record.capacity}), "
        f"{prices.money(per_hour, '/h')}"
    )


def ran(record: PodRecord, now: float) -> tuple[str, float | None]:
    """How long the pod has been ACTIVE (``01:12:40``; "" when never) and what that cost
    (None when its price is unknown)."""
    if record.active_at is None:
        return "", None
    seconds = now - record.active_at
    per_hour = prices.hourly(record.tpu_type, record.zone, record.capacity, record.num_slices)
    whole = int(max(0.0, seconds))
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}", prices.cost(
        per_hour, seconds
    )


@dataclass(frozen=True)
class Deleted:
    """What ``down`` did: the pod's record (None: found by its label only), its zone, whether
    a delete was sent (False: it was gone already) and whether it was seen gone."""

    name: str
    zone: str
    record: PodRecord | None
    sent: bool
    waited: bool

    @property
    def line(self) -> str:
        if not self.sent:
            return f"pod {self.name} in {self.zone} was already gone; its record is removed"
        what = (
            f"deleted pod {self.name} in {self.zone}"
            if self.waited
            else (f"delete of pod {self.name} in {self.zone} sent")
        )
        r = self.record
        if r is None:
            return what
        up_for, cost = ran(r, time.time())
        if not up_for:
            return f"{what} ({r.num_slices} x {r.tpu_type}, never ACTIVE)"
        paid = (
            f"cost about {prices.money(cost)}"
            if cost is not None
            else f"cost unknown: {prices.why_unknown(r.tpu_type, r.zone, r.capacity)}"
        )
        return f"{what} ({r.num_slices} x {r.tpu_type}, up {up_for}, {paid})"


# -- up ------------------------------------------------------------------------------------
def up(name: str, flags: PodFlags, access: Mapping[str, Any], say: Say) -> PodRecord:
    """``multihost up NAME``: the pod requested zone by zone until one is ACTIVE, every worker
    accepting SSH, autodown armed when asked. Until it returns, an interrupt (Ctrl-C; the
    command line turns SIGTERM and SIGHUP into one) deletes what it made, and says so."""
    checks.check_name(name)
    gcloud = lifecycle.gcloud_client(say)
    spec = flags.spec(name, lifecycle.zones_for(flags.zone, flags.zones, gcloud))
    return make(spec, flags.autodown_seconds, access, say, gcloud=gcloud, contact=True)


def make(
    spec: PodSpec,
    idle: float | None,
    access: Mapping[str, Any],
    say: Say,
    *,
    gcloud: lifecycle.Runner,
    contact: bool,
) -> PodRecord:
    """The pod of ``spec`` made and, with ``contact``, every worker accepting SSH; autodown
    armed when ``idle`` is given (its first contact made first). Interrupted once the pod is
    ACTIVE: the pod is deleted, said, and the KeyboardInterrupt goes on."""
    record, _ = lifecycle.up(spec, gcloud, say, poll=poll())
    if idle is not None:
        record = record.evolve(autodown=idle)
        records.save(record)
    say(f"pod {spec.name} is ACTIVE: {where(record)}")
    try:
        if contact or idle is not None:
            n = workers.accept_ssh(record, access, say)
            say(f"pod {spec.name} is up: {n}/{n} workers accept SSH")
        if idle is not None:
            record = arm(record, idle, access, say)
    except KeyboardInterrupt:
        say(f"interrupted: deleting pod {spec.name} in {record.zone}, made by this command")
        done = delete(spec.name, say, gcloud=gcloud)
        say(done.line)
        raise
    return record


# -- down ----------------------------------------------------------------------------------
def delete(
    name: str,
    say: Say,
    *,
    wait: bool = True,
    zone: str | None = None,
    project: str | None = None,
    gcloud: lifecycle.Runner | None = None,
) -> Deleted:
    """``multihost down NAME``: the pod deleted (every slice), found by its record, else by
    its label in ``zone``; with ``wait``, seen gone. Says only what it waits for."""
    checks.check_name(name)
    zones = (checks.check_zone(zone),) if zone else ()
    runner = gcloud or lifecycle.gcloud_client(say)
    record, where_, sent = lifecycle.down(
        runner, name, say, wait=wait, poll=poll(), zones=zones, project=project
    )
    return Deleted(name, where_, record, sent, wait)


# -- autodown ------------------------------------------------------------------------------
def arm(record: PodRecord, idle: float | None, access: Mapping[str, Any], say: Say) -> PodRecord:
    """Start (or change, or with None stop) the daemon on worker 0 that deletes the pod once
    idle; the record keeps the setting."""
    reach = workers.reached(record, access, say, add_key=False)
    who = autodown.owner(record.name, record.created_at)
    said = workers.on_worker0(reach, autodown.arm_command(idle, who), autodown.script().encode())
    record = record.evolve(autodown=idle)
    records.save(record)
    host = reach.fleet.hosts[0].name
    if idle is None:
        say(f"autodown of pod {record.name} is off")
        return record
    say(f"pod {record.name} deletes itself once idle for {idle:g} s (watched on {host})")
    if "nocron" in said:
        say(
            f"{host} has no crontab: after a reboot the pod is not watched until autodown is "
            "armed again"
        )
    return record


def set_autodown(name: str, setting: str | float, access: Mapping[str, Any], say: Say) -> PodRecord:
    """``multihost autodown NAME DURATION|off`` on a pod multihost made."""
    idle = plan.parse_autodown(setting)  # a bad setting is named before the pod is looked for
    return arm(records.load(checks.check_name(name)), idle, access, say)


def autodown_status(record: PodRecord, access: Mapping[str, Any], say: Say) -> str:
    """What the daemon on the pod says of itself (one SSH command), or why it was not asked."""
    try:
        reach = workers.reached(record, access, say, add_key=False)
        who = autodown.owner(record.name, record.created_at)
        text = workers.on_worker0(reach, autodown.status_command(who))
    except MultihostError as exc:
        return f"{record.autodown:g}s idle (not asked: {exc})"
    return autodown.parse_status(text).describe(time.time())


# -- pods, gc ------------------------------------------------------------------------------
def listing(
    access: Mapping[str, Any],
    say: Say,
    *,
    zones: tuple[str, ...] = (),
    project: str | None = None,
) -> list[dict[str, object]]:
    """``multihost pods``: each pod recorded here (and each labelled one in ``zones``) as a
    row: where, state (asked of the API now), age, $/h, cost so far, what autodown says."""
    zones = tuple(dict.fromkeys(checks.check_zone(z) for z in zones))
    gcloud = lifecycle.gcloud_client(say)
    now = time.time()
    rows = []
    for s in lifecycle.standings(gcloud, zones, project):
        r = s.record
        up_for, cost = ran(r, now)
        auto = None
        if r.autodown is not None:
            auto = (
                autodown_status(r, access, say) if s.state == "ACTIVE" else f"{r.autodown:g}s idle"
            )
        rows.append(
            {
                "name": r.name,
                "zone": r.zone,
                "tpu_type": r.tpu_type,
                "num_slices": r.num_slices,
                "capacity": r.capacity,
                "state": s.state,
                "reason": s.reason,
                "age_s": round(now - r.created_at),
                "up_for": up_for,
                "price_per_hour": prices.hourly(r.tpu_type, r.zone, r.capacity, r.num_slices),
                "cost_so_far": None if cost is None else round(cost, 2),
                "autodown": auto,
                "recorded": s.recorded,
            }
        )
    return rows


def collect(
    say: Say, *, dry_run: bool, zones: tuple[str, ...] = (), project: str | None = None
) -> list[tuple[lifecycle.Standing, str]]:
    """``multihost gc``: the requests that can never run again deleted (or, ``dry_run``, only
    named); each said."""
    zones = tuple(dict.fromkeys(checks.check_zone(z) for z in zones))
    found = lifecycle.gc(
        lifecycle.gcloud_client(say), say, dry_run=dry_run, zones=zones, project=project
    )
    verb = "would delete" if dry_run else "deleted"
    for s, why in found:
        say(f"{verb} {s.record.name} in {s.record.zone}: {why}")
    if not found:
        say("nothing to collect")
    return found


# -- around a run --------------------------------------------------------------------------
def around(
    name: str | None,
    flags: PodFlags,
    inner: Callable[[], int],
    access: Mapping[str, Any],
    say: Say,
    *,
    make_it: bool,
    delete_after: bool,
) -> int:
    """``run``/``sweep --prefix NAME`` with a pod's flags: the pod made first when missing
    (``make_it``: ``--up``), its flags checked against it when it exists (one that disagrees
    is refused, never ignored; ``--autodown`` arms it), ``inner`` run, and the pod deleted
    when it ends however it ends (``delete_after``: ``--down``), said with the run's exit."""
    if not name:
        given = "--up and --down need" if make_it or delete_after else f"{_first(flags)} needs"
        raise UsageError(f"{given} --prefix NAME (the pod)")
    checks.check_name(name)
    record = records.find(name)
    if make_it and record is None:
        gcloud = lifecycle.gcloud_client(say)
        spec = flags.spec(name, lifecycle.zones_for(flags.zone, flags.zones, gcloud))
        make(spec, flags.autodown_seconds, access, say, gcloud=gcloud, contact=False)
    elif record is None:
        making = flags.for_making()
        if making:
            raise UsageError(
                f"{making[0]} says what pod to make, and there is no pod {name!r} made from "
                "here: add --up to make it"
            )
        if flags.autodown is not None:
            raise UsageError(
                f"--autodown sets a pod multihost made, and there is no pod {name!r} made from "
                "here (see multihost pods): add --up to make it"
            )
    else:
        why = flags.disagreement(record)
        if why is not None:
            raise UsageError(why)
        if make_it:
            say(f"pod {name} exists ({record.state} in {record.zone}): using it")
        if flags.autodown is not None:
            arm(record, flags.autodown_seconds, access, say)
    code = 130
    try:
        code = inner()
    finally:
        if delete_after and not _delete_after(name, flags, code, say):
            code = code or 1  # the run went well but the pod may still be up: say it in the exit
    return code


def _first(flags: PodFlags) -> str:
    making = flags.for_making()
    return making[0] if making else "--autodown"


def _delete_after(name: str, flags: PodFlags, code: int, say: Say) -> bool:
    """``--down`` once the run has ended: the pod deleted and said so; a failure to delete is
    said too (never hiding the run's own error) and returns False."""
    try:
        done = delete(name, say, wait=True, zone=flags.zone, project=flags.project)
    except MultihostError as exc:
        say(f"run ended (exit {code}) but --down could not delete pod {name}: {exc}")
        return False
    say(f"run ended (exit {code}): {done.line}")
    return True
