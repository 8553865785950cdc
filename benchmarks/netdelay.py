"""A user-space TCP relay that puts a network delay between the runner and every host, and
counts the round trips each connection takes (this kernel has no netem).

``python benchmarks/netdelay.py --delay-ms D --out FILE LISTEN=TARGET ...`` (each
``ADDR:PORT=ADDR:PORT``): one listener per host; every chunk either way is delivered D ms
after it arrived (order kept), so the round trip is 2·D. TCP's own handshake is modelled
too: the relay opens its connection to the host D ms after accepting the client's and holds
the client's first bytes until 2·D after the accept, as a real connect() returns only after
SYN and SYN-ACK. Prints ``ready`` once every listener is bound; on SIGTERM it writes FILE
(JSON: per connection its listen address, accept time and the chunks, each ``[t, dir,
bytes]`` with ``dir`` 0 = client→host, 1 = host→client, ``t`` the wall time the relay
received it) and exits.

:func:`round_trips` counts a connection's round trips the way the benchmark reports them: a
client→host chunk answered by a host→client chunk is one, plus TCP's handshake.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Link:
    """One relayed connection and what crossed it."""

    listen: str
    accepted: float
    chunks: list[tuple[float, int, int]] = field(default_factory=list)


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it receives goes to ``peer`` ``delay`` later."""

    def __init__(self, relay: _Relay, direction: int) -> None:
        self.relay, self.direction = relay, direction
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.relay.forward(self.direction, data)

    def eof_received(self) -> bool:
        self.relay.forward(self.direction, b"")
        return True  # keep the other half open until the peer's EOF is delivered

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.lost(self.direction)


class _Relay:
    """Both ends of one client's connection to one host."""

    def __init__(self, link: Link, target: tuple[str, int], delay: float) -> None:
        self.link, self.target, self.delay = link, target, delay
        self.loop = asyncio.get_running_loop()
        self.client = _Side(self, 0)
        self.host = _Side(self, 1)
        self.host_ready = self.loop.create_future()
        # a real connect() returns after SYN, SYN-ACK: the client's first bytes leave 2·D late
        self.hold_until = self.loop.time() + 2 * delay
        self.last = [0.0, 0.0]  # when the latest chunk each way is delivered (order kept)
        self.closed = [False, False]
        self.waiting: list[bytes] | None = []  # for the host, until its connection is up
        self.opening: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await asyncio.sleep(self.delay)  # the SYN's way there
        try:
            await self.loop.create_connection(lambda: self.host, *self.target)
        except OSError:
            if self.client.transport is not None:
                self.client.transport.close()
            return
        self.host_ready.set_result(None)
        waiting, self.waiting = self.waiting or [], None
        for data in waiting:  # in order, before anything delivered later
            self._write(0, data)

    def forward(self, direction: int, data: bytes) -> None:
        now = self.loop.time()
        if data:  # a held chunk counts as sent when the modelled connect() returned
            held = max(0.0, self.hold_until - now) if direction == 0 else 0.0
            self.link.chunks.append((time.time() + held, direction, len(data)))
        at = now + self.delay
        if direction == 0:
            at = max(at, self.hold_until + self.delay)
        at = max(at, self.last[direction])  # never overtake an earlier chunk
        self.last[direction] = at
        self.loop.call_at(at, self._deliver, direction, data)

    def _deliver(self, direction: int, data: bytes) -> None:
        if direction == 0 and self.waiting is not None:
            self.waiting.append(data)
            return
        self._write(direction, data)

    def _write(self, direction: int, data: bytes) -> None:
        out = (self.host if direction == 0 else self.client).transport
        if out is None or out.is_closing() or self.closed[1 - direction]:
            return
        if data:
            out.write(data)
        elif out.can_write_eof():
            self.closed[1 - direction] = True  # this way is done: nothing more to write
            out.write_eof()
        else:
            out.close()

    def lost(self, direction: int) -> None:
        """One side closed: close the other once what was in flight got there."""
        other = self.host if direction == 0 else self.client
        at = max(self.loop.time() + self.delay, self.last[direction])
        self.loop.call_at(at, lambda: other.transport and other.transport.close())


async def serve(
    pairs: Sequence[tuple[tuple[str, int], tuple[str, int]]], delay: float, links: list[Link]
) -> list[asyncio.Server]:
    """A listener per pair (listen, target)."""
    loop = asyncio.get_running_loop()
    servers = []
    for listen, target in pairs:

        def factory(listen: tuple[str, int] = listen, target: tuple[str, int] = target) -> _Side:
            link = Link(f"{listen[0]}:{listen[1]}", time.time())
            links.append(link)
            relay = _Relay(link, target, delay)
            relay.opening = loop.create_task(relay.open())
            return relay.client

        servers.append(await loop.create_server(factory, *listen, backlog=1024))
    return servers


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(args: argparse.Namespace) -> None:
    pairs = []
    for spec in args.pairs:
        listen, _, target = spec.partition("=")
        pairs.append((_address(listen), _address(target)))
    links: list[Link] = []
    servers = await serve(pairs, args.delay_ms / 1000, links)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    print("ready", flush=True)
    await done.wait()
    for s in servers:
        s.close()
    data = [{"listen": k.listen, "accepted": k.accepted, "chunks": k.chunks} for k in links]
    Path(args.out).write_text(json.dumps(data))


# ---------------------------------------------------------------- counting


def bursts(chunks: Sequence[Sequence[float]]) -> list[tuple[int, float, float, int]]:
    """Consecutive chunks in one direction as one burst: (dir, first t, last t, bytes)."""
    out: list[tuple[int, float, float, int]] = []
    for t, d, n in chunks:
        if out and out[-1][0] == d:
            out[-1] = (int(d), out[-1][1], t, out[-1][3] + int(n))
        else:
            out.append((int(d), t, t, int(n)))
    return out


def round_trips(
    chunks: Sequence[Sequence[float]],
    delay: float,
    start: float = float("-inf"),
    end: float = float("inf"),
    *,
    tcp: bool = True,
) -> int:
    """The times the client waited for the host: a client→host chunk, then a host→client
    chunk at least ``delay``/2 later (an answer comes no sooner through the relay; what comes
    sooner was on its way already, and the client's further chunks meanwhile are pipelined,
    not waited for); plus TCP's handshake (``tcp``: the relay models it, the chunks cannot
    show it). Counted when the client's chunk was sent in [start, end). ``delay``: the relay's
    one-way delay (s); at 0 every turn counts."""
    n, asked = int(tcp), None
    for t, d, _bytes in chunks:
        if d == 0:
            asked = t if asked is None else asked
        elif asked is not None and t - asked >= delay / 2:
            n += int(start <= asked < end)
            asked = None
    return n


def main(argv: Sequence[str] | None = None) -> int:
    """Run the relay until SIGTERM."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay (RTT / 2)")
    p.add_argument("--out", required=True, help="where to write the connections' chunks")
    p.add_argument("pairs", nargs="+", help="LISTEN_ADDR:PORT=TARGET_ADDR:PORT")
    asyncio.run(_main(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
