"""Reaching a fleet: its source resolved (a --prefix asks gcloud once), the hosts chosen
(``--workers``), the SSH options for them and, for a run on a --prefix fleet, first contact
(the user's key accepted, host keys pinned); with ``--wait``, slices READY and hosts answering.

Made from the settings by their names (:class:`ReachSettings`), for the planner
(``multihost.planner``) and for the commands that look at hosts without running on them. It
lives here, not in ``multihost.sources``, because first contact and ``--wait`` log in to every
host (``fleetops.contact``, ``fleetops.reachable``), which the sources stay below.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.defaults import DEFAULTS as D
from multihost.defaults import GOOGLE_KEY, given_fields
from multihost.errors import SettingError
from multihost.model import Fleet
from multihost.sources import CloudFound, FleetSpec, Found, resolve, workers
from multihost.transport import HostKeyPolicy, SSHOptions, verbose
from multihost.transport.sshconfig import given_config

if TYPE_CHECKING:
    from multihost.fleetops.reachable import Reached


@dataclass(frozen=True)
class ReachSettings:
    """What reaching a fleet is made from: its source (``FleetSpec``'s fields, or the API's own
    ``Fleet`` given as ``hosts``), the hosts chosen, and how to reach them."""

    spec: FleetSpec = field(default_factory=FleetSpec)
    fleet: Fleet | None = None  # hosts= a Fleet (the API's): nothing to resolve
    workers: str | None = None  # some of the hosts (multihost.sources.workers); None: all
    exclude_workers: str | None = None
    ssh: SSHOptions | None = None  # the API's own starting point (default: by the fleet)
    ssh_config: str | Path | None = None
    host_keys: HostKeyPolicy | None = None
    connect_timeout: float | None = None
    connect_limit: int = D.connect_limit
    quick_auth: bool | None = None  # public-key auth in one round trip (None: the ssh options')
    verbose: bool = False  # say on stderr how hosts are reached (the transport's notes)
    wait: float | None = None  # s to wait for slices READY and hosts answering (inf: no limit)
    progress: Callable[[str], None] | None = None  # told how a --wait goes, in words
    no_add_key: bool = False  # --prefix: never touch metadata or the OS Login profile
    dry_run: bool = False  # a plan only, to print: no first contact, no host asked anything

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> ReachSettings:
        """The settings in ``given`` (by their names) that say where and how; others are not
        ours."""
        hosts = given.get("hosts")
        fleet = hosts if isinstance(hosts, Fleet) else None
        if fleet is not None:
            given = {**given, "hosts": None}
        own = {k: v for k, v in given_fields(cls, given).items() if k not in _WHOLE}
        return cls(spec=FleetSpec(**given_fields(FleetSpec, given)), fleet=fleet, **own)

    @classmethod
    def names(cls) -> frozenset[str]:
        """The settings it is made from, by name."""
        own = {f.name for f in fields(cls)} - set(_WHOLE)
        return frozenset(own | {f.name for f in fields(FleetSpec)})


_WHOLE = ("spec", "fleet")  # made from other settings, never given by these names


@dataclass(frozen=True)
class Reach:
    """The hosts and how to reach them."""

    fleet: Fleet
    ssh: SSHOptions
    cloud: bool = False
    warnings: tuple[str, ...] = ()  # what the fleet's source had to say
    notes: tuple[str, ...] = ()  # what first contact did (a key added, and where)
    subset: str = ""  # --workers chose some of the hosts: these, folded ("": every host)


def reach(settings: ReachSettings | Mapping[str, Any], *, add_key: bool = False) -> Reach:
    """The fleet (resolved once: a --prefix asks gcloud) and the SSH options for it; with
    ``add_key`` (a run, a sweep, ``hosts --check``) on a --prefix fleet, first contact too:
    the user's key accepted, host keys pinned."""
    s = settings if isinstance(settings, ReachSettings) else ReachSettings.of(settings)
    warnings: tuple[str, ...] = ()
    found_cloud: CloudFound | None = None
    started = time.monotonic()
    if s.workers is not None:
        workers.parse(s.workers)  # a bad spec is refused before the fleet is looked for
    if s.exclude_workers is not None:
        workers.parse(s.exclude_workers, "--exclude-workers")
    if s.fleet is not None:
        if s.spec.local is not None or s.spec.prefix is not None:
            raise ValueError("give exactly one of hosts=, local= or prefix=")
        fleet, cloud = s.fleet, False
    else:
        found = resolve(s.spec) if s.wait is None else _waited(s.spec, s)
        fleet, cloud, warnings = found.fleet, s.spec.cloud, found.warnings
        found_cloud = found.cloud
    fleet, subset = workers.select(fleet, s.workers, s.exclude_workers)  # before any contact
    ssh = s.ssh or SSHOptions(
        host_keys="accept-new" if cloud else "strict",
        fallback_identity=GOOGLE_KEY if cloud else None,
    )
    if s.host_keys is not None:
        ssh = replace(ssh, host_keys=s.host_keys)
    if s.connect_timeout is not None:
        ssh = replace(ssh, connect_timeout=s.connect_timeout)
    if s.quick_auth is not None:
        ssh = replace(ssh, quick_auth=s.quick_auth)
    if s.verbose:
        verbose()
    if s.ssh_config is not None:
        ssh = replace(ssh, config=given_config(s.ssh_config))
    if not fleet.local:
        from multihost.transport.sshconfig import include_loop

        loop = include_loop(ssh.config)
        if loop is not None:
            raise SettingError(f"ssh config: an Include loop: {loop}")
    notes: tuple[str, ...] = ()
    if found_cloud is not None and add_key:  # first contact (not for a dry run)
        if not s.no_add_key:
            fleet, notes = _first_contact(fleet, ssh, found_cloud, s)
        if ssh.host_keys == "accept-new":
            from multihost.fleetops.contact import pin_host_keys

            ssh, unpublished = pin_host_keys(fleet, ssh, found_cloud)
            if unpublished:
                verb = "publishes" if len(unpublished) == 1 else "publish"
                warnings += (
                    f"{', '.join(unpublished)} {verb} no host keys (guest attributes "
                    "hostkeys/*): trusting their workers' keys on first use",
                )
    if s.wait is not None and not fleet.local and not s.dry_run:
        _wait_reachable(fleet, ssh, s, max(s.wait - (time.monotonic() - started), 0.0))
    return Reach(fleet, ssh, cloud, warnings, notes, subset)


# -- first contact: the user's key accepted, as gcloud does -------------------------------------
def _first_contact(
    fleet: Fleet, ssh: SSHOptions, where: CloudFound, s: ReachSettings
) -> tuple[Fleet, tuple[str, ...]]:
    from multihost.fleetops.contact import first_contact

    def wait(fleet: Fleet, seconds: float) -> Reached:
        return _wait_reachable(fleet, ssh, s, seconds, auth=True)

    say = s.progress or (lambda _: None)
    user = s.spec.user
    return first_contact(fleet, ssh, where, user=user, say=say, wait=wait, seconds=_key_wait())


def _key_wait() -> float:
    """How long a pushed key may take to be accepted (gcloud: 10 tries, 5 s apart)."""
    return float(os.environ.get("MULTIHOST_KEY_WAIT", D.key_wait))


# -- --wait: slices READY, then hosts answering ----------------------------------------------
def _poll() -> float:
    """Seconds between gcloud polls (each call costs ~1 s of CPU); tests shorten it."""
    return float(os.environ.get("MULTIHOST_WAIT_POLL", D.wait_poll))


def _waited(spec: FleetSpec, s: ReachSettings) -> Found:
    from multihost.sources.queued import wait_until_ready

    say = s.progress or (lambda _: None)
    found: Found = wait_until_ready(lambda: resolve(spec), s.wait or 0.0, say, _poll())
    return found


def _wait_reachable(
    fleet: Fleet, ssh: SSHOptions, s: ReachSettings, seconds: float, *, auth: bool = False
) -> Reached:
    from multihost.bridge import blocking
    from multihost.fleetops.reachable import wait_reachable

    say = s.progress or (lambda _: None)
    reached: Reached = blocking(
        lambda: wait_reachable(
            fleet, ssh, seconds, say, limit=s.connect_limit, poll=min(_poll(), 2.0), auth=auth
        )
    )
    return reached
