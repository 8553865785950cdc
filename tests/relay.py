"""A counting TCP relay on 127.0.0.1 in front of each host of the loopback fleet: the bytes a
runner writes to a host (and reads back) at the socket, SSH handshake included. Used by
benchmarks/wire.py and by the tests that bound what a run sends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests import fleet as loopback


@dataclass
class Counter:
    """Bytes through one host's relay since the last reset."""

    up: int = 0
    down: int = 0


@dataclass
class Relay:
    """A counting TCP relay per host on 127.0.0.1, served by an event loop in a thread."""

    targets: Sequence[tuple[str, int]]
    ports: list[int] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)
    open: int = 0  # connections being relayed now
    servers: list[asyncio.Server] = field(default_factory=list)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self._listen())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise RuntimeError("the relay did not start")

    def stop(self) -> None:
        """Close the listeners and every relayed connection, then the loop."""
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()
        for writer in list(self.writers):
            writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _listen(self) -> None:
        for i, (address, port) in enumerate(self.targets):
            self.counters.append(Counter())
            server = await asyncio.start_server(
                lambda r, w, i=i, a=address, p=port: self._pipe(i, r, w, a, p), "127.0.0.1", 0
            )
            self.servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])

    async def _pipe(
        self,
        i: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        address: str,
        port: int,
    ) -> None:
        self.open += 1
        self.writers.add(writer)
        try:
            up_r, up_w = await asyncio.open_connection(address, port)
        except OSError:
            self.open -= 1
            self.writers.discard(writer)
            writer.close()
            return
        self.writers.add(up_w)
        counter = self.counters[i]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                while data := await src.read(65536):
                    if up:
                        counter.up += len(data)
                    else:
                        counter.down += len(data)
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(copy(reader, up_w, True), copy(up_r, writer, False))
        finally:
            self.open -= 1
            self.writers -= {writer, up_w}

    def reset(self) -> None:
        for c in self.counters:
            c.up = c.down = 0

    def totals(self) -> tuple[int, int]:
        """Bytes up and down through every host's relay; call once every connection ended
        (``open == 0``), so that nothing is still on its way."""
        return sum(c.up for c in self.counters), sum(c.down for c in self.counters)


def relayed_client(fleet: loopback.Fleet, relay: Relay, out: Path) -> Path:
    """An ssh config (and known_hosts) whose aliases reach each host through its relay."""
    out.mkdir(parents=True, exist_ok=True)
    known, blocks = [], []
    for h, port in zip(fleet.hosts, relay.ports, strict=True):
        key = (loopback._host_dir(fleet.dir, h.index) / "host_key.pub").read_text().split()[:2]
        known.append(f"[127.0.0.1]:{port} {' '.join(key)}\n")
        blocks.append(
            f"Host {h.alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {h.user}\n"
            f"  UserKnownHostsFile {out / 'known_hosts'}\n"
        )
    (out / "known_hosts").write_text("".join(known))
    blocks.append(
        f"Host *\n  IdentityFile {fleet.key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
        "  GlobalKnownHostsFile /dev/null\n  BatchMode yes\n  ConnectTimeout 10\n"
        "  LogLevel ERROR\n"
    )
    config = out / "ssh_config"
    config.write_text("\n".join(blocks))
    return config
