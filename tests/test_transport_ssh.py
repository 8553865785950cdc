"""The SSH transport's choices, seen on a real connection: cipher preference, config honoured,
writes held back for a burst."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from multihost.sources.inventory import parse_host_list
from multihost.transport import SSHOptions, burst
from multihost.transport.ssh import connect_ssh
from tests import fleet as loopback


def _cipher(config: Path, alias: str) -> str:
    async def go() -> str:
        host = parse_host_list(alias).hosts[0]
        conn = await connect_ssh(host, SSHOptions(config=(config,)))
        try:
            return str(conn._conn.get_extra_info("send_cipher"))
        finally:
            await conn.close()

    return asyncio.run(go())


def test_cipher_preference_yields_to_config(ssh_fleet: loopback.Fleet, tmp_path: Path) -> None:
    assert _cipher(ssh_fleet.ssh_config, ssh_fleet.aliases[0]) == "aes128-gcm@openssh.com"
    h0 = ssh_fleet.hosts[0]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host ctr\n  HostName {h0.address}\n  Port {h0.port}\n  User {h0.user}\n"
        f"  Ciphers aes256-ctr\n  UserKnownHostsFile {ssh_fleet.known_hosts}\n\n"
        + ssh_fleet.ssh_config.read_text()
    )
    assert _cipher(config, "ctr") == "aes256-ctr"


def test_burst_holds_writes_back_and_lets_them_all_go(ssh_fleet: loopback.Fleet) -> None:
    """``burst``: while it lasts the connections' sockets are corked (what is written waits on
    this machine), after it none is, and what was written inside arrives whole."""

    async def go() -> tuple[list[int], list[int], list[bytes]]:
        hosts = parse_host_list(",".join(ssh_fleet.aliases[:2])).hosts
        conns = [await connect_ssh(h, SSHOptions(config=(ssh_fleet.ssh_config,))) for h in hosts]
        socks = [c._conn.get_extra_info("socket") for c in conns]
        try:
            shells = [await c.shell() for c in conns]
            outputs = [
                aiter(s.stream("echo ready; read -r w; echo got $w\n", hold=True)) for s in shells
            ]
            for out in outputs:  # the script is in, and waits for its word
                assert await anext(out) == b"ready\n"
            with burst(conns):
                held = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) for s in socks]
                for s in shells:
                    s.send(b"word\n")
            after = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) for s in socks]
            got = [b"".join([chunk async for chunk in out]) for out in outputs]
            return held, after, got
        finally:
            for c in conns:
                await c.close()

    held, after, got = asyncio.run(go())
    assert held == [1, 1]
    assert after == [0, 0]
    assert got == [b"got word\n", b"got word\n"]
