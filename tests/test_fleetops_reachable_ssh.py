"""Waiting for hosts to accept a login (``--wait``, a key just added), on the real sshd fleet:
only hosts that accepted are counted; the others come back with their error."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from multihost.fleetops.reachable import wait_reachable
from multihost.model import Fleet, Host
from multihost.sources import FleetSpec, resolve
from multihost.transport import SSHOptions, login_name
from tests import fleet as loopback


def _fleet(fleet: loopback.Fleet, n: int) -> Fleet:
    return resolve(FleetSpec(hosts=",".join(h.alias for h in fleet.hosts[:n]))).fleet


async def test_a_refused_login_is_not_counted_as_accepted(ssh_fleet: loopback.Fleet) -> None:
    """One host logged into as a user it does not allow: 1/2 accepted, and the other named
    with its error, at once (a refused login ends its wait unless a key was just added)."""
    fleet = _fleet(ssh_fleet, 2)
    wrong = replace(fleet.hosts[1], user=ssh_fleet.hosts[0].user)
    fleet = Fleet((fleet.hosts[0], wrong))
    options = SSHOptions(config=(ssh_fleet.ssh_config,))
    said: list[str] = []
    reached = await wait_reachable(fleet, options, 60, said.append, limit=4, poll=0.1)
    assert reached.accepted == 1
    assert [h.name for h, _ in reached.refused] == ["s0/w1"]
    assert "authentication failed" in reached.refused[0][1].message
    assert re.fullmatch(r"accepted by 1/2 workers in \d+ s \(not by s0/w1\)", said[-1]), said


async def test_internal_only_hosts_are_said_after_their_first_try(
    ssh_fleet: loopback.Fleet,
) -> None:
    """Hosts with a reach hint that do not answer are named, with the hint, as soon as each
    has tried once: long before the wait ends."""
    hint = "the worker has only an internal address: reach it with --tunnel-through-iap"
    port = ssh_fleet.hosts[0].port
    fleet = Fleet.from_slices(
        [
            [
                Host("127.1.0.9", port=port, reach_hint=hint),
                Host("127.1.0.10", port=port, reach_hint=hint),
            ]
        ]
    )
    said: list[str] = []
    reached = await wait_reachable(fleet, SSHOptions(), 0.5, said.append, limit=4, poll=0.1)
    assert reached.accepted == 0
    assert not reached.refused
    assert said[0] == (
        f"s0/w0-1 (127.1.0.9, 127.1.0.10) do not answer; {hint} (still waiting, up to 0 s)"
    )
    assert said[-1].startswith("accepted by 0/2 workers"), said


def test_login_name_is_the_hosts_then_the_ssh_configs(
    ssh_fleet: loopback.Fleet, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host 10.0.0.2\n  User ann\nHost 10.0.0.*\n  User bob\nMatch host 10.0.1.5\n  User cy\n"
    )
    options = SSHOptions(config=(config,))
    assert login_name(Host("10.0.0.2"), options) == "ann"
    assert login_name(Host("10.0.0.3"), options) == "bob"
    assert login_name(Host("10.0.0.3", user="dee"), options) == "dee"
    assert login_name(Host("10.0.1.5"), options) == "cy"  # asyncssh reads what we cannot
    assert login_name(Host("10.0.2.1"), options) is None
