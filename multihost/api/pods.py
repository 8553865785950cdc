"""A pod's life from Python: ``up``, ``down``, ``pods``, ``gc``, ``autodown``, ``with
pod(...)``, and the pod around a run or a sweep (``run(..., up=True, down=True)``). The
commands on a pod (``multihost up``, ...) call the same functions and print what they say.

Each function tells what it does through ``say`` (one line at a time; default: stderr, as
``multihost: ...``) and returns a value: a :class:`~multihost.pods.records.Pod`, a cost. While
one makes or deletes a pod, SIGTERM and SIGHUP end it as Ctrl-C does
(``multihost.bridge.terminating``): what it made is deleted on the way out, and said.
Keywords are the commands' flags by their dests (``tpu_type=``, ``zones=``, ...), checked by
the one gate (``multihost.api.keywords``); ``profile=`` puts a config profile's values under
them (what a pod to make is: ``tpu_type``, ``zones``, ``runtime_version``, ``autodown``...).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from multihost.api.keywords import check_options, configured, on_stderr, wants_pod
from multihost.bridge import terminating
from multihost.pods import ops
from multihost.pods.ops import Around
from multihost.pods.plan import PodFlags
from multihost.pods.records import Pod

Say = Callable[[str], None]


def profile_values(profile: str | None, start: str | Path | None = None) -> dict[str, Any]:
    """What the config files say with ``profile`` chosen (found from ``start``, default: the
    current directory), by dest; none without a profile (as ``run(profile=)``)."""
    if profile is None:
        return {}
    from multihost.settings.layers import Resolved

    return configured(Resolved.load(Path(start or ".").expanduser(), profile).values)


def _given(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


# -- the functions ---------------------------------------------------------------------------
def make(
    name: str,
    given: Mapping[str, Any],
    config: Mapping[str, Any],
    say: Say,
    *,
    contact: bool = True,
) -> Pod:
    """``up``: the pod of the flags ``given`` over what the config says of one (``config``),
    made and, with ``contact``, every worker accepting SSH (``multihost.pods.ops.up``)."""
    flags = PodFlags.of(given).over(PodFlags.of(config))
    with terminating():
        record = ops.up(name, flags, {**config, **given}, say, contact=contact)
    return Pod.of(record, "ACTIVE", time.time())


def up(
    name: str,
    *,
    tpu_type: str | None = None,
    runtime_version: str | None = None,
    zones: Sequence[str] | str | None = None,
    num_slices: int | None = None,
    capacity: str | None = None,
    autodown: str | float | None = None,
    zone: str | None = None,
    project: str | None = None,
    queue_timeout: str | float | None = None,
    profile: str | None = None,
    say: Say | None = None,
    **reach: Any,
) -> Pod:
    """Make a pod (``multihost up NAME``): its queued resource requested zone by zone
    (``zones=``, else ``zone=``, else gcloud's default zone) until one is ACTIVE, every worker
    accepting SSH (``reach``: how, as ``run``'s keywords: ``ssh_config=``, ``user=``,
    ``no_add_key=``...), ``autodown=`` armed. Interrupted, it deletes what it made. Returns
    the pod, ACTIVE."""
    given = _given(
        {
            "tpu_type": tpu_type,
            "runtime_version": runtime_version,
            "zones": zones,
            "num_slices": num_slices,
            "capacity": capacity,
            "autodown": autodown,
            "zone": zone,
            "project": project,
            "queue_timeout": queue_timeout,
            "profile": profile,
            **reach,
        }
    )
    check_options("up", given)
    config = profile_values(profile)
    return make(name, given, config, say or on_stderr)


def down(
    name: str,
    *,
    wait: bool = True,
    zone: str | None = None,
    project: str | None = None,
    say: Say | None = None,
) -> float | None:
    """Delete a pod multihost made, every slice (``multihost down NAME``), found by its record
    here, else by its label in ``zone=``; with ``wait``, seen gone. Returns what it cost while
    ACTIVE (0.0: never; None: its price is unknown, or it had no record here)."""
    say = say or on_stderr
    with terminating():
        done = ops.delete(name, say, wait=wait, zone=zone, project=project)
    say(done.line)
    return done.cost


def pods(
    zones: Sequence[str] | str | None = None,
    *,
    project: str | None = None,
    profile: str | None = None,
    say: Say | None = None,
    **reach: Any,
) -> list[Pod]:
    """The pods multihost made from here (``multihost pods``), and the ones labelled as
    multihost's in ``zones`` (made from anywhere): each as the TPU API says it stands now,
    its price and cost so far, and what its autodown daemon says (asked over SSH: ``reach``)."""
    given = {**_given(reach), **_given({"zones": zones, "project": project, "profile": profile})}
    check_options("pods", given)
    return listed({**profile_values(profile), **given}, say or on_stderr)


def listed(given: Mapping[str, Any], say: Say) -> list[Pod]:
    """``pods``, of settings by dest (``vars(args)``, keywords)."""
    zones = tuple(PodFlags(zones=given.get("zones")).zones or ())
    return ops.listing(given, say, zones=zones, project=given.get("project"))


def gc(
    dry_run: bool = True,
    zones: Sequence[str] | str | None = None,
    *,
    project: str | None = None,
    say: Say | None = None,
) -> list[Pod]:
    """The requests multihost made that can never run again (``multihost gc``): deleted, or
    with ``dry_run`` (the default here) only named. Returns each, its ``reason`` why."""
    found = tuple(PodFlags(zones=zones).zones or ())
    return ops.collect(say or on_stderr, dry_run=dry_run, zones=found, project=project)


def autodown(
    name: str,
    duration: str | float | None,
    *,
    profile: str | None = None,
    say: Say | None = None,
    **reach: Any,
) -> Pod:
    """Set when an idle pod deletes itself (``multihost autodown NAME DURATION``): a
    duration (``"30m"``, ``1800``), or None (``"off"``) to stop it; the daemon on worker 0
    is reached as ``up`` reaches the workers (``reach``)."""
    given = {**_given(reach), **_given({"profile": profile})}
    check_options("autodown", given)
    return arm(name, duration, {**profile_values(profile), **given}, say or on_stderr)


def arm(name: str, duration: str | float | None, given: Mapping[str, Any], say: Say) -> Pod:
    """``autodown``, of settings by dest."""
    setting = "off" if duration is None else duration
    with terminating():
        record = ops.set_autodown(name, setting, given, say)
    return Pod.of(record, "ACTIVE", time.time())


@contextlib.contextmanager
def pod(
    name: str,
    *,
    down: bool = True,
    profile: str | None = None,
    say: Say | None = None,
    **keywords: Any,
) -> Iterator[Pod]:
    """``with multihost.pod(NAME, tpu_type=..., ...) as pod:`` a pod for the block: made
    when missing (``up``'s keywords; an existing pod is used, the keywords given checked
    against it), every worker accepting SSH, and with ``down`` deleted however the block
    ends (its end, an exception, Ctrl-C, SIGTERM or SIGHUP), its cost said."""
    given = {**_given(keywords), **_given({"profile": profile})}
    check_options("pod", {**given, "down": down})
    config = profile_values(profile)
    with (
        terminating(),
        ops.around(
            name,
            PodFlags.of(given),
            {**config, **given},
            say or on_stderr,
            make_it=True,
            delete_after=down,
            configured=PodFlags.of(config),
            contact=True,
            what="the with block",
            strict=True,
        ) as box,
    ):
        assert box.record is not None
        yield Pod.of(box.record, "ACTIVE", time.time())


# -- a pod around a run or a sweep --------------------------------------------------------------
@contextlib.contextmanager
def around(
    options: Mapping[str, Any],
    say: Say,
    *,
    config: Mapping[str, Any] | None = None,
    what: str = "run",
    strict: bool = True,
) -> Iterator[Around | None]:
    """A run's or a sweep's pod keywords (``run(..., prefix=NAME, up=True, down=True)``,
    ``run --prefix NAME --up --down``): none given, the block as it is (None); else the pod's
    life around it (``multihost.pods.ops.around``), ``config`` (a profile's values, by dest;
    default: ``options``' own ``profile=``) saying what a pod to make is. The block sets the
    box's ``ending`` (``exit 0``) to say how it ended. A warm session takes its pod the same
    way (``multihost.api.session``): the block entered before its hosts are planned, ended
    after its processes, its ``ending`` said when it closes."""
    if not wants_pod(options):
        yield None
        return
    if config is None:
        config = profile_values(options.get("profile"), options.get("script_dir"))
    with (
        terminating(),
        ops.around(
            options.get("prefix"),
            PodFlags.of(options),
            {**config, **_given(options)},
            say,
            make_it=bool(options.get("up")),
            delete_after=bool(options.get("down")),
            configured=PodFlags.of(config),
            what=what,
            dry_run=bool(options.get("dry_run")),
            strict=strict,
        ) as box,
    ):
        yield box
