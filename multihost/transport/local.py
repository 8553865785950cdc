"""Workers on this machine (``--local``): the same shell commands, run by ``sh -c`` here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence

from multihost.errors import RemoteError
from multihost.model import Host
from multihost.transport.base import CHUNK, SHELL, Completed, Progress, offered


class LocalConnection:
    """A worker on this machine: the same shell commands, run by ``sh -c`` locally."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.peer_address = host.internal_address or "127.0.0.1"
        self.bytes_out = 0

    async def run(self, command: str, stdin: bytes | None = None) -> Completed:
        self.bytes_out += len(stdin or b"")
        proc = await _spawn(command, stdin=stdin is not None)
        try:
            out, err = await proc.communicate(stdin)
        finally:
            _kill_group(proc)
        return Completed(proc.returncode, out, err)

    async def stream(self, command: str, stderr: bytearray | None = None) -> AsyncIterator[bytes]:
        async for chunk in _output(await _spawn(command, stdin=False), stderr):
            yield chunk

    async def offer(
        self,
        command: str,
        want: bytes,
        data: bytes,
        progress: Progress | None = None,
        *,
        ahead: Sequence[tuple[bytes, bytes]] = (),
    ) -> tuple[Completed, bool]:
        proc = await _spawn(command, stdin=True)
        assert proc.stdout is not None
        assert proc.stdin is not None
        said, written = b"", -1
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it said why
                said, written = await offered(proc.stdout, proc.stdin, want, data, progress, ahead)
            proc.stdin.close()
            out, err = await proc.communicate()
        finally:
            _kill_group(proc)
        self.bytes_out += written if written >= 0 else -1 - written
        return Completed(proc.returncode, said + out, err), written >= 0

    async def fetch(self, path: str, write: Callable[[bytes], object]) -> int:
        try:
            f = await asyncio.to_thread(open, path, "rb")
        except OSError as exc:
            raise RemoteError(self.host, f"{path}: {exc.strerror or exc}") from None
        size = 0
        with f:
            while True:
                try:
                    chunk = await asyncio.to_thread(f.read, CHUNK)
                except OSError as exc:
                    raise RemoteError(self.host, f"{path}: {exc.strerror or exc}") from None
                if not chunk:
                    return size
                write(chunk)  # a local error here is the caller's
                size += len(chunk)

    def hold_writes(self, held: bool) -> None:
        """Nothing to hold: a local worker's writes are pipes on this machine."""

    async def shell(self) -> LocalShell:
        return LocalShell(await _spawn(SHELL, stdin=True))

    async def close(self) -> None:
        return None


class LocalShell:
    """``sh -s`` here, waiting for its script on stdin (see ``Shell``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    async def stream(
        self, script: str, stderr: bytearray | None = None, *, hold: bool = False
    ) -> AsyncIterator[bytes]:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(script.encode())
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await stdin.drain()
            if not hold:
                stdin.close()
        except BaseException:
            await self.close()
            raise
        async for chunk in _output(self._proc, stderr):
            yield chunk

    def send(self, data: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(data)
            stdin.close()  # after what is buffered has gone out

    async def write(self, data: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(data)
            await stdin.drain()

    async def close(self) -> None:
        _kill_group(self._proc)
        await self._proc.wait()


async def _output(
    proc: asyncio.subprocess.Process, stderr: bytearray | None
) -> AsyncIterator[bytes]:
    """A started process's stdout as it comes, then its stderr into ``stderr``; its process
    group is killed and reaped however this ends."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        while chunk := await proc.stdout.read(65536):
            yield chunk
        err = await proc.stderr.read()
        await proc.wait()
        if stderr is not None:
            stderr += err
    finally:
        _kill_group(proc)
        await proc.wait()


async def _spawn(command: str, *, stdin: bool) -> asyncio.subprocess.Process:
    """``sh -c command`` in its own session (so that its whole group can be killed)."""
    return await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        command,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
