"""The one seam to the network: a small Connection protocol and its SSH and local transports.

asyncssh is imported only by ``transport.ssh``, and only when an SSH host is reached. What runs
on every host at once goes through ``multihost.transport.fanout``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator

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
    "burst",
    "connect",
    "default_state_dir",
    "forget",
    "login_name",
    "verbose",
]


async def connect(host: Host, options: SSHOptions) -> Connection:
    """A connection to ``host``: local workers need no network."""
    if host.local:
        return LocalConnection(host)
    from multihost.transport.ssh import connect_ssh  # asyncssh only when SSH is used

    return await connect_ssh(host, options)


def login_name(host: Host, options: SSHOptions) -> str | None:
    """The user a connection to ``host`` logs in as, if anything names one (``--user``, an
    inventory, the ssh config's ``User``); None: the local user."""
    if host.local:
        return None
    from multihost.transport import ssh  # asyncssh only when SSH is used

    return ssh.login_name(host, options)


@contextlib.contextmanager
def burst(conns: Iterable[Connection]) -> Iterator[None]:
    """What is written to ``conns`` inside goes out to all of them at the end, back to back.
    For a word that every host must get at once (a launch's "go"): written one host at a
    time, each host that gets it wakes and runs its part while the word still has to be
    written to the rest; on cores the hosts share (a loopback fleet), the last ones got it
    seconds late."""
    held = list(conns)
    for conn in held:
        conn.hold_writes(True)
    try:
        yield
    finally:
        for conn in held:
            conn.hold_writes(False)


class _Stderr(logging.Handler):
    """``multihost: TEXT`` lines on whatever ``sys.stderr`` is when one is said (a live
    display may have put its own there)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"multihost: {record.getMessage()}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr gone: nothing to say it on
            pass


def verbose() -> None:
    """``--verbose``: what the transport says about how hosts are reached (the
    ``multihost.transport`` logger at INFO: which SSH authentication path ran, once) goes to
    stderr from now on in this process."""
    log = logging.getLogger("multihost.transport")
    log.setLevel(logging.INFO)
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        log.addHandler(_Stderr())
