"""The connection protocol every transport implements, and how to reach hosts (data only)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from multihost.defaults import DEFAULTS
from multihost.model import Host

HostKeyPolicy = Literal["strict", "accept-new"]
Progress = Callable[[int], None]  # told the bytes moved so far
# A shell started ahead of its script (``Connection.shell``): POSIX sh reading commands from
# stdin, whatever the account's login shell is.
SHELL = "exec sh -s"
CHUNK = 1 << 20  # bytes written (or read) at a time when moving files, between progress reports


class _Stdin(Protocol):
    """A remote command's stdin: asyncio's StreamWriter or asyncssh's SSHWriter."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


async def write_chunks(stdin: _Stdin, data: bytes, progress: Progress | None) -> None:
    """``data`` in ``CHUNK``-sized writes, each drained, telling ``progress`` after each."""
    for start in range(0, len(data), CHUNK):
        stdin.write(data[start : start + CHUNK])
        await stdin.drain()
        if progress is not None:
            progress(min(start + CHUNK, len(data)))


class _Lines(Protocol):
    """A remote command's stdout, read by lines."""

    async def readline(self) -> bytes: ...


async def offered(
    stdout: _Lines,
    stdin: _Stdin,
    want: bytes,
    data: bytes,
    progress: Progress | None,
    ahead: Sequence[tuple[bytes, bytes]],
) -> tuple[bytes, int]:
    """``Connection.offer``'s exchange: the host's lines read one by one, each ``ahead`` offer
    written when its line asks for it (in order: one not asked for is passed over), then
    ``data`` when the next line is ``want``. Returns the lines read and the bytes written
    (-1 - bytes written when ``data`` did not go). The caller ends stdin."""
    line = await stdout.readline()
    said, written = line, 0
    for word, extra in ahead:
        if line.strip() != word:
            continue
        await write_chunks(stdin, extra, None)
        written += len(extra)
        line = await stdout.readline()
        said += line
    if line.strip() != want:
        return said, -1 - written
    await write_chunks(stdin, data, progress)
    return said, written + len(data)


@dataclass(frozen=True)
class Completed:
    """A finished remote command."""

    exit_status: int | None
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class SSHOptions:
    """How to reach hosts: ssh config files, host-key policy, timeouts and keepalives."""

    config: tuple[Path, ...] = ()
    host_keys: HostKeyPolicy = "strict"
    trust_file: Path = field(default_factory=lambda: default_state_dir() / "known_hosts")
    connect_timeout: float = DEFAULTS.connect_timeout
    fallback_identity: str | None = None
    keepalive_interval: float = DEFAULTS.keepalive_interval
    keepalive_count_max: int = DEFAULTS.keepalive_count_max
    # host keys pinned per address ("<type> <base64>", e.g. a TPU node's guest attributes):
    # such a host must present one of them, whatever the policy
    pinned: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # public-key auth in one round trip where asyncssh's code is the code verified
    # (transport.quickauth); False: asyncssh's own course
    quick_auth: bool = DEFAULTS.quick_auth


def default_state_dir() -> Path:
    """The runner's own files on this machine (its trust-on-first-use known_hosts)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "multihost"


class Shell(Protocol):
    """A POSIX sh started on a host ahead of time, idle until it is sent one script: what a
    launch needs from the host (a session, a shell) is paid before the launch itself. A held
    script's stdin can carry more after it (``write``): a warm process's channel."""

    def stream(
        self, script: str, stderr: bytearray | None = None, *, hold: bool = False
    ) -> AsyncIterator[bytes]:
        """Runs ``script``; yields its stdout as it comes, then appends its stderr. With
        ``hold``, the script's stdin stays open for one ``send`` (a launch's gate)."""
        ...

    def send(self, data: bytes) -> None:
        """Writes ``data`` to a held script's stdin, then ends it (a gone host: ignored, its
        output ends)."""
        ...

    async def write(self, data: bytes) -> None:
        """Writes ``data`` to a held script's stdin and waits until it can take more; stdin
        stays open (a channel that carries many messages; ``send`` ends it). A gone host:
        ignored, its output ends."""
        ...

    async def close(self) -> None:
        """Ends the shell (a no-op once its script ran); it runs nothing if never sent one."""
        ...


class Connection(Protocol):
    """One open channel to a host, reused for every step of a run."""

    host: Host
    peer_address: str
    bytes_out: int  # what this connection has written to remote stdin (uploads), in bytes

    async def run(self, command: str, stdin: bytes | None = None) -> Completed: ...

    def stream(self, command: str, stderr: bytearray | None = None) -> AsyncIterator[bytes]:
        """Yields ``command``'s stdout as it comes; then appends its stderr to ``stderr``."""
        ...

    async def offer(
        self,
        command: str,
        want: bytes,
        data: bytes,
        progress: Progress | None = None,
        *,
        ahead: Sequence[tuple[bytes, bytes]] = (),
    ) -> tuple[Completed, bool]:
        """Run ``command``; send ``data`` on stdin only if its first output line is ``want``
        (in chunks of ``CHUNK`` bytes, calling ``progress`` with the bytes sent so far), then
        end stdin. ``ahead``: (word, bytes) the host may ask for first, each by a line of its
        own, in this order (stdin stays open after them; see :func:`offered`)."""
        ...

    async def shell(self) -> Shell:
        """Start a shell that waits for its script (``Shell.stream``)."""
        ...

    def hold_writes(self, held: bool) -> None:
        """While held, what is written to this host gathers on this machine and goes out at
        the release, in as few packets as can carry it (TCP_CORK; a no-op where there is
        none). See ``transport.burst``."""
        ...

    async def fetch(self, path: str, write: Callable[[bytes], object]) -> int:
        """Copy the host's regular file ``path`` (absolute) to ``write``, chunk by chunk;
        returns its size. A file that cannot be read raises RemoteError naming it."""
        ...

    async def close(self) -> None: ...
