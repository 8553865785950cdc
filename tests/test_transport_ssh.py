"""The SSH transport's choices, seen on a real connection: cipher preference, config honoured."""

from __future__ import annotations

import asyncio
from pathlib import Path

from multihost.sources.inventory import parse_host_list
from multihost.transport import SSHOptions
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
