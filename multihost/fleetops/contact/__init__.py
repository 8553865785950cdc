"""First contact with a --prefix fleet, as gcloud makes it: the user's key accepted by every
worker for the user it is logged into, and each worker's host keys pinned.

The key goes into each node's ``ssh-keys`` metadata once per user its workers are logged into
(``--user``, else the ssh config's ``User`` for the worker's address, else the local user as
gcloud names it), or into the OS Login profile (``keys``). The workers' guest agent installs it
a little later: the workers are tried until they accept it; when they still refuse it as the
wait ends, nothing starts and the error names them. The host keys the nodes publish are read
by ``pins`` and written into multihost's own known_hosts file (``multihost.transport.hostkeys``:
the transport's, which also records the keys it trusts on first use); the gcloud command lines
all this takes are ``multihost.cloud.tpus``' (the one seam to gcloud).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from multihost.errors import KeyRefused
from multihost.fleetops.contact.keys import GOOGLE_KEY, KeyAdded, add_key, default_user
from multihost.fleetops.reachable import Reached
from multihost.model import Fleet, host_ranges
from multihost.sources import CloudFound
from multihost.sources.tpu import node_name
from multihost.transport import SSHOptions, login_name


def first_contact(
    fleet: Fleet,
    ssh: SSHOptions,
    where: CloudFound,
    *,
    user: str | None,
    say: Callable[[str], None],
    wait: Callable[[Fleet, float], Reached],
    seconds: float,
) -> tuple[Fleet, tuple[str, ...]]:
    """The key accepted by every worker of ``fleet`` (``wait``: tries them for ``seconds``
    while it may still be on its way); the fleet with each worker's login name, and notes on
    what was done. ``user``: ``--user`` (also under OS Login)."""
    # Each host and each hop by its own login name (a hop is a worker, reached as itself):
    # the name the line is written for, also where nothing names one.
    named = {h: login_name(h, ssh) or default_user() for h in fleet.reached()}
    names = [node_name(n) for n in where.nodes]
    logins: dict[str, list[str]] = {}
    for h in named:
        logins.setdefault(names[h.slice_id], []).append(named[h])
    slices = {h.slice_id for h in fleet}  # the chosen hosts' slices: no other node is touched
    nodes = [n for i, n in enumerate(where.nodes) if i in slices]
    added = add_key(
        nodes, project=where.project, zone=where.zone, user=user, logins=logins, gcloud=where.gcloud
    )
    oslogin = added.user
    if oslogin is not None:  # OS Login: its POSIX name, unless --user said otherwise
        fleet = Fleet(tuple(h.with_login(lambda x: x.user or oslogin) for h in fleet))
    else:
        fleet = Fleet(tuple(h.with_login(lambda x: named[x]) for h in fleet))
    notes: tuple[str, ...] = ()
    if added.nodes or added.profile:
        n = len(added.nodes)
        say(
            f"adding your key to {n} node{'s' * (n != 1)}…"
            if n
            else "adding your key to your OS Login profile…"
        )
        reached = wait(fleet, seconds)
        if reached.refused:
            raise refused(reached, seconds, added)
        if n:
            notes = (
                f"your key ({GOOGLE_KEY}.pub) was added to the metadata of "
                f"{', '.join(added.nodes)} for {', '.join(added.users)}",
            )
    if added.oslogin:
        notes += (
            f"OS Login: your key is in your profile"
            f"{'' if added.user is None else f'; logging in as {added.user}'}",
        )
    return fleet, notes


def refused(reached: Reached, waited: float, added: KeyAdded) -> KeyRefused:
    """The key still refused when the wait ended: the hosts, what they said, and why."""
    hosts = [h for h, _ in reached.refused]
    shown = ", ".join(f"{h.name} ({h.target})" for h in hosts[:4])
    shown += f" and {len(hosts) - 4} more" if len(hosts) > 4 else ""
    where = (
        f"the metadata of {', '.join(added.nodes)} for {', '.join(added.users)}"
        if added.nodes
        else "your OS Login profile"
    )
    text = (
        f"your key is still refused after {waited:.0f} s by {shown} "
        f"({reached.refused[0][1].message}): it was added to {where}, and the workers' "
        "guest agent has not installed it for the user they are logged into; nothing "
        "started (a slow guest agent: wait longer with MULTIHOST_KEY_WAIT=SECONDS; "
        "else check the nodes' ssh-keys metadata and your ssh config's User)"
    )
    silent = [(h, e) for h, e in reached.failed if h not in hosts]
    if silent:
        text += f"; {host_ranges([h for h, _ in silent])} did not answer: {silent[0][1].message}"
    return KeyRefused(tuple(hosts), text)


def pin_host_keys(
    fleet: Fleet, ssh: SSHOptions, where: CloudFound
) -> tuple[SSHOptions, tuple[str, ...]]:
    """Each worker's host keys pinned from its node's guest attributes (and recorded for
    attach, status, kill); the nodes that publish none."""
    from multihost.fleetops.contact.pins import pin
    from multihost.transport.hostkeys import record_pins

    pins = pin(fleet, [node_name(n) for n in where.nodes], where.project, where.zone, where.gcloud)
    ports = {h.address: h.port for h in fleet.reached()}
    record_pins([(a, ports.get(a), k) for a, k in pins.keys], ssh.trust_file)
    return replace(ssh, pinned=pins.keys), pins.unpublished
