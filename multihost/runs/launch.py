"""Detached start on a host, and stopping it: the run's state lives in plain files there."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from multihost.defaults import DEFAULTS
from multihost.errors import RemoteError, UsageError
from multihost.model import Host
from multihost.remote.commands import Paths, claim_command, kill_command, kit, release_command
from multihost.staging.archive import and_then, kit_sent, what_then_did
from multihost.transport import Completed, Connection, Shell
from multihost.transport.fanout import Outcome, map_hosts


async def claim(
    hosts: Sequence[Host],
    conns: Mapping[int, Connection],
    paths: Mapping[int, Paths],
    timeout: float,
    then: Callable[[Host], str] | None = None,
    said: dict[int, Completed] | None = None,
    kits: dict[int, int] | None = None,
) -> list[Outcome[None]]:
    """Create the run's directory on every host before any job starts. If the name is taken
    on any host, the others' claims are released and nothing starts anywhere (UsageError).
    ``then``: a script each host runs once its claim is made, on the claim's channel; what
    it did goes in ``said`` by process id; ``kits``: the kit's bytes each host was sent."""
    taken: list[Host] = []

    async def one(host: Host) -> None:
        command = claim_command(paths[host.process_id])
        after = then(host) if then else ""
        # the kit (the hook and the run's scripts) goes only to a host that lacks it
        res, _ = await conns[host.process_id].offer(and_then(command, after), *kit().offer)
        if kits is not None:
            kits[host.process_id] = kit_sent(res)
        if after and (did := what_then_did(res)) is not None:
            if said is not None:
                said[host.process_id] = did
            return
        if res.exit_status == 3:
            taken.append(host)
        if res.exit_status != 0:
            err = res.stderr.decode(errors="replace").strip().splitlines()
            raise RemoteError(host, err[-1] if err else f"claim failed (exit {res.exit_status})")

    outcomes = await map_hosts(one, hosts, timeout=timeout, what="claim")
    if all(o.ok for o in outcomes):
        return outcomes
    await release([o.host for o in outcomes if o.ok], conns, paths, timeout)
    if taken:
        raise name_taken(taken)
    return outcomes


async def release(
    hosts: Sequence[Host],
    conns: Mapping[int, Connection],
    paths: Mapping[int, Paths],
    timeout: float,
) -> None:
    """Undo the claims on ``hosts`` (another host refused, or could not be prepared)."""

    async def one(host: Host) -> None:
        await conns[host.process_id].run(release_command(paths[host.process_id]))

    await map_hosts(one, hosts, timeout=timeout, what="release")


def name_taken(taken: Sequence[Host]) -> UsageError:
    """The error for a run name that exists on ``taken``: nothing starts anywhere."""
    names = ", ".join(h.name for h in sorted(taken, key=lambda h: h.process_id))
    return UsageError(
        f"the run name already exists on {names}: nothing was started on any host; "
        "use a new --run-name"
    )


async def launch(conn: Connection, script: str) -> tuple[int, str]:
    """Start the job detached (own session, stdin from /dev/null) with the host's launch script
    (``HostPlan.launch``); returns its process group, and the python3 that is the run's
    ``python`` on a host without one ("": it has one)."""
    res = await conn.run(script)
    text = res.stdout.decode(errors="replace").strip()
    pgid, _, python = text.partition("\n")
    if res.exit_status != 0 or not pgid.isdigit():
        err = res.stderr.decode(errors="replace").strip().splitlines()
        raise RemoteError(conn.host, f"launch failed: {err[-1] if err else text or 'no output'}")
    return int(pgid), python.removeprefix("python=")


@dataclass(frozen=True)
class Started:
    """A job started by a launch that goes on watching (``launch_script(watch=True)``): the
    rest of the channel is its log from byte 0, then the watch's ``end`` line on stderr."""

    pgid: int
    output: AsyncIterator[bytes]
    stderr: bytearray


@dataclass(frozen=True)
class Ready:
    """A launch that has written its run's files on a host and waits at the gate (see
    ``remote.LAUNCH_WATCH``): ``go`` starts the job, ``hold`` removes the run's directory."""

    host: Host
    pgid: int  # the job's process group (its wrapper is up, waiting for the word)
    shell: Shell
    output: AsyncIterator[bytes]
    stderr: bytearray
    head: bytes  # output that came after the ready line (none, normally)
    python: str = ""  # a host without python: the python3 that is the run's python

    def go(self, secrets: Sequence[tuple[str, str]] = ()) -> None:
        """The word; ``secrets`` (KEY, VALUE) follow it on the same channel, to the wrapper's
        stdin and the job's environment only (``remote.WRAPPER``)."""
        lines = "".join(f"{k}={v}\n" for k, v in secrets)
        self.shell.send(f"go {len(secrets)}\n{lines}".encode() if secrets else b"go\n")

    def hold(self) -> None:
        """Nothing starts here: the script removes the run's directory and ends."""
        self.shell.send(b"stop\n")

    def started(self, feed: Callable[[bytes], None]) -> Started:
        """After ``go``: the job; log bytes that came with the ready line go to ``feed``.
        Nothing is awaited: the host writes nothing back between the word and the job's
        start. The caller reads ``output`` to the end (``stream.follow``)."""
        if self.head:
            feed(self.head)
        return Started(self.pgid, self.output, self.stderr)

    async def drain(self) -> None:
        """Reads a held launch's channel to its end."""
        async for _ in self.output:
            pass


async def launch_ready(conn: Connection, script: str, shell: Shell | None = None) -> Ready:
    """Send a launch-and-watch script (on ``shell`` if one was opened ahead) and wait until it
    is ready at its gate; a launch that fails first raises RemoteError with the host's word."""
    stderr = bytearray()
    shell = shell or await conn.shell()
    output = aiter(shell.stream(script, stderr, hold=True))
    line, rest = await _line(output, b"")
    word, _, said = (line or "").partition(" ")
    pgid, _, python = said.partition(" ")
    if word == "ready" and pgid.isdigit():
        return Ready(
            conn.host, int(pgid), shell, output, stderr, rest, python.removeprefix("python=")
        )
    raise await _failed(conn.host, output, stderr, line or rest.decode(errors="replace"))


async def _line(output: AsyncIterator[bytes], head: bytes) -> tuple[str | None, bytes]:
    """The next line of ``output`` (after ``head``) and what came after it; None when the
    output ends first or runs on for 4 KiB without a newline."""
    buf = bytearray(head)
    while True:
        line, newline, rest = bytes(buf).partition(b"\n")
        if newline:
            return line.decode(errors="replace").strip(), rest
        if len(buf) > 4096:
            return None, bytes(buf)
        chunk = await anext(output, None)
        if chunk is None:
            return None, bytes(buf)
        buf += chunk


async def _failed(
    host: Host, output: AsyncIterator[bytes], stderr: bytearray, said: str
) -> RemoteError:
    """A failed launch's error: its stderr's last line comes when the channel ends."""
    async for _ in output:
        pass
    err = stderr.decode(errors="replace").strip().splitlines()
    return RemoteError(host, f"launch failed: {err[-1] if err else said.strip() or 'no output'}")


async def stop(
    conn: Connection, paths: Paths, signal: str = "TERM", grace: float = DEFAULTS.grace
) -> str:
    """Signal the job's process group, KILL it after ``grace`` s; says what it found or did."""
    res = await conn.run(kill_command(paths, signal, grace))
    if res.exit_status != 0:
        raise RemoteError(conn.host, f"stop failed: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode().strip() or "unknown"
