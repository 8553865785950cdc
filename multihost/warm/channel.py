"""One host's warm process, reached through a held channel of its connection
(``warm_channel.sh``): frames to it on the channel's stdin, its frames back on stdout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from multihost.errors import HostError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.warm import CHANNEL
from multihost.transport import Connection, Shell
from multihost.warm.frames import Frame, FrameError, FrameReader, frame


class HostChannel:
    """The runner's end of one host's channel. ``ready`` resolves with the process's ``ready``
    object; ``done()`` is the next piece's ``done`` frame; ``out`` frames go to ``on_out``.
    ``ended`` (set once the channel is gone) says why in words."""

    def __init__(self, host: Host, on_out: Callable[[Host, bytes], None]) -> None:
        self.host = host
        self._on_out = on_out
        self._shell: Shell | None = None
        self._task: asyncio.Task[None] | None = None
        self._done: asyncio.Future[Frame] | None = None
        self.ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.closed = asyncio.Event()
        self.ended = ""
        self.said_bye = False

    async def open(self, conn: Connection, run_dir: str, wait: float) -> None:
        """Start the channel (it waits up to ``wait`` s for the process's FIFOs)."""
        self._shell = await conn.shell()
        text = script(CHANNEL, paths={"r": run_dir}, t=max(1, int(wait * 10)))
        self._task = asyncio.create_task(self._read(self._shell, text))

    async def _read(self, shell: Shell, text: str) -> None:
        reader = FrameReader()
        stderr = bytearray()
        try:
            async for chunk in shell.stream(text, stderr, hold=True):
                for f in reader.feed(chunk):
                    self._frame(f)
            said = stderr.decode(errors="replace").strip().splitlines()
            self.ended = said[-1] if said else "its channel ended"
        except HostError as exc:
            self.ended = exc.message
        except FrameError as exc:
            self.ended = f"its channel said what is no frame: {exc}"
        finally:
            self.closed.set()
            for waiting in (self.ready, self._done):
                if waiting is not None and not waiting.done():
                    waiting.set_exception(EOFError(self.ended or "its channel ended"))

    def _frame(self, f: Frame) -> None:
        if f.kind == "out":
            self._on_out(self.host, f.data)
        elif f.kind == "done" and self._done is not None and not self._done.done():
            self._done.set_result(f)
        elif f.kind == "ready" and not self.ready.done():
            self.ready.set_result(f.json())
        elif f.kind == "bye":
            self.said_bye = True

    def done(self) -> asyncio.Future[Frame]:
        """The next ``done`` frame (an EOFError if the channel ends first)."""
        self._done = asyncio.get_running_loop().create_future()
        if self.closed.is_set():
            self._done.set_exception(EOFError(self.ended or "its channel ended"))
        return self._done

    async def send(self, kind: str, data: bytes = b"") -> None:
        await self.write(frame(kind, data))

    async def write(self, data: bytes) -> None:
        if self._shell is not None and not self.closed.is_set():
            await self._shell.write(data)

    async def close(self, timeout: float) -> None:
        """End the channel's stdin (the process, if it still runs, takes its runner as gone)
        and wait for the channel to end, at most ``timeout`` s."""
        if self._shell is None:
            return
        self._shell.send(b"")
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self._task)
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        await self._shell.close()
        for waiting in (self.ready, self._done):  # nobody waits any more: no warnings
            if waiting is not None and waiting.done() and not waiting.cancelled():
                waiting.exception()
