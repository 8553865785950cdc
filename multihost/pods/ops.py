"""A pod's life as the commands (and a Python caller) ask for it: make one (``up``), delete
it (``down``), list them (``pods``), collect dead requests (``gc``), set autodown, and one
ephemeral pod around a run or a sweep (``--prefix NAME --up --down``). Each tells what it does
through ``say`` (one line at a time, no ``multihost:`` prefix) and prints nothing itself.

The one rule for where a pod is: ``--zone`` (``--zones``) when given; else, for a pod
multihost made, its record's zone (``records.located``); else gcloud's default zone.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from multihost.cloud import checks
from multihost.defaults import DEFAULTS as D
from multihost.errors import MultihostError, UsageError
from multihost.pods import autodown, lifecycle, plan, prices, records, workers
from multihost.pods.plan import PodFlags, PodSpec
from multihost.pods.records import Pod, PodRecord

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
        up_for, cost = records.ran(r, time.time())
        if not up_for:
            return f"{what} ({r.num_slices} x {r.tpu_type}, never ACTIVE)"
        paid = (
            f"cost about {prices.money(cost)}"
            if cost is not None
            else f"cost unknown: {prices.why_unknown(r.tpu_type, r.zone, r.capacity)}"
        )
        return f"{what} ({r.num_slices} x {r.tpu_type}, up {up_for}, {paid})"

    @property
    def cost(self) -> float | None:
        """What the pod cost while ACTIVE (0 when it never was; None: its price is unknown, or
        it had no record here)."""
        if self.record is None:
            return None
        if self.record.active_at is None:
            return 0.0
        _, cost = records.ran(self.record, time.time())
        return cost


# -- up ------------------------------------------------------------------------------------
def up(
    name: str, flags: PodFlags, access: Mapping[str, Any], say: Say, *, contact: bool = True
) -> PodRecord:
    """``multihost up NAME``: the pod requested zone by zone until one is ACTIVE, with
    ``contact`` every worker accepting SSH, autodown armed when asked. Until it returns, an
    interrupt (Ctrl-C; SIGTERM and SIGHUP are made one: ``multihost.bridge.terminating``)
    deletes what it made, and says so."""
    checks.check_name(name)
    gcloud = lifecycle.gcloud_client(say)
    spec = flags.spec(name, lifecycle.zones_for(flags.zone, flags.zones, gcloud))
    return make(spec, flags.autodown_seconds, access, say, gcloud=gcloud, contact=contact)


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
) -> list[Pod]:
    """``multihost pods``: each pod recorded here (and each labelled one in ``zones``) as it
    stands: where, its state (asked of the API now), age, $/h, cost so far, and what autodown
    says (its daemon asked, on a pod that is ACTIVE)."""
    zones = tuple(dict.fromkeys(checks.check_zone(z) for z in zones))
    gcloud = lifecycle.gcloud_client(say)
    now = time.time()
    found = []
    for s in lifecycle.standings(gcloud, zones, project):
        r = s.record
        auto = None
        if r.autodown is not None and s.state == "ACTIVE":
            auto = autodown_status(r, access, say)
        found.append(
            Pod.of(r, s.state, now, reason=s.reason, recorded=s.recorded, autodown_status=auto)
        )
    return found


def collect(
    say: Say, *, dry_run: bool, zones: tuple[str, ...] = (), project: str | None = None
) -> list[Pod]:
    """``multihost gc``: the requests that can never run again deleted (or, ``dry_run``, only
    named), each said; each as it stood, its ``reason`` why it can never run again."""
    zones = tuple(dict.fromkeys(checks.check_zone(z) for z in zones))
    found = lifecycle.gc(
        lifecycle.gcloud_client(say), say, dry_run=dry_run, zones=zones, project=project
    )
    verb = "would delete" if dry_run else "deleted"
    for s, why in found:
        say(f"{verb} {s.record.name} in {s.record.zone}: {why}")
    if not found:
        say("nothing to collect")
    now = time.time()
    return [Pod.of(s.record, s.state, now, reason=why, recorded=s.recorded) for s, why in found]


# -- around a run --------------------------------------------------------------------------
@dataclass
class Around:
    """A pod around some work (``around``): its record once made or found, how the work
    ended (said with the pod's deletion: ``exit 0``; set by the work), and whether the pod was
    deleted after it (None: not asked to)."""

    name: str
    record: PodRecord | None = None
    ending: str | None = None
    deleted: bool | None = None


@contextlib.contextmanager
def around(
    name: str | None,
    flags: PodFlags,
    access: Mapping[str, Any],
    say: Say,
    *,
    make_it: bool,
    delete_after: bool,
    configured: PodFlags | None = None,
    contact: bool = False,
    what: str = "run",
    dry_run: bool = False,
    strict: bool = False,
) -> Iterator[Around]:
    """A pod around a run, a sweep or a block (``run``/``sweep --prefix NAME`` with a pod's
    flags; ``multihost.pod``): the pod made first when missing (``make_it``: ``--up``, of
    ``flags`` over what a profile says, ``configured``; with ``contact``, every worker
    accepting SSH), the flags given checked against it when it exists (one that disagrees is
    refused, never ignored; ``--autodown`` arms it), and the pod deleted when the block ends
    however it ends (``delete_after``: ``--down``), said with how it ended. A failed delete is
    said, and with ``strict`` raised (after a block that ended well)."""
    if not name:
        given = "--up and --down need" if make_it or delete_after else f"{_first(flags)} needs"
        raise UsageError(f"{given} --prefix NAME (the pod)")
    checks.check_name(name)
    if dry_run and (make_it or delete_after or flags.autodown is not None):
        raise UsageError(
            "--dry-run makes, arms and deletes nothing: leave out --up, --down and --autodown"
        )
    box = Around(name, records.find(name))
    if make_it and box.record is None:
        making = flags.over(configured or PodFlags())
        gcloud = lifecycle.gcloud_client(say)
        spec = making.spec(name, lifecycle.zones_for(making.zone, making.zones, gcloud))
        box.record = make(
            spec, making.autodown_seconds, access, say, gcloud=gcloud, contact=contact
        )
    elif box.record is None:
        named = flags.for_making()
        if named:
            raise UsageError(
                f"{named[0]} says what pod to make, and there is no pod {name!r} made from "
                "here: add --up to make it"
            )
        if flags.autodown is not None:
            raise UsageError(
                f"--autodown sets a pod multihost made, and there is no pod {name!r} made from "
                "here (see multihost pods): add --up to make it"
            )
    else:
        why = flags.disagreement(box.record)
        if why is not None:
            raise UsageError(why)
        if make_it:
            say(f"pod {name} exists ({box.record.state} in {box.record.zone}): using it")
        if flags.autodown is not None:
            box.record = arm(box.record, flags.autodown_seconds, access, say)
    try:
        yield box
    except BaseException as exc:
        if box.ending is None:
            box.ending = "interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
        raise
    finally:
        if delete_after:
            box.deleted = _delete_after(box, flags, what, say)
    if delete_after and not box.deleted and strict:
        raise lifecycle.PodError(f"pod {name} may still be up (multihost down {name})")


def _first(flags: PodFlags) -> str:
    making = flags.for_making()
    return making[0] if making else "--autodown"


def _delete_after(box: Around, flags: PodFlags, what: str, say: Say) -> bool:
    """``--down`` once the work has ended: the pod deleted and said so; a failure to delete
    is said too (never hiding the work's own error) and returns False."""
    ended = f"{what} ended ({box.ending or 'done'})"
    try:
        done = delete(box.name, say, wait=True, zone=flags.zone, project=flags.project)
    except MultihostError as exc:
        say(f"{ended} but --down could not delete pod {box.name}: {exc}")
        return False
    say(f"{ended}: {done.line}")
    return True
