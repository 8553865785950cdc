"""The one seam to the network: a small Connection protocol and its SSH and local transports.

asyncssh is imported only by ``transport.ssh``, and only when an SSH host is reached.
"""

from __future__ import annotations

from multihost.model import Host
from multihost.transport.base import (
    Completed,
    Connection,
    HostKeyPolicy,
    Progress,
    Shell,
    SSHOptions,
    default_state_dir,
)
from multihost.transport.hostkeys import forget
from multihost.transport.local import LocalConnection

__all__ = [
    "Completed",
    "Connection",
    "HostKeyPolicy",
    "LocalConnection",
    "Progress",
    "SSHOptions",
    "Shell",
    "connect",
    "default_state_dir",
    "forget",
]


async def connect(host: Host, options: SSHOptions) -> Connection:
    """A connection to ``host``: local workers need no network."""
    if host.local:
        return LocalConnection(host)
    from multihost.transport.ssh import connect_ssh  # asyncssh only when SSH is used

    return await connect_ssh(host, options)
