"""Watching a fleet live: one connection per host, one ``top.sh`` stream on it, the latest
looks kept, a :class:`FleetSnapshot` on demand.

The host's script looks every ``interval`` seconds and streams what it saw (see
``multihost/remote/top.sh``); nothing is asked per look, so a look costs the host a few
builtins, a sleep and a tail, and the runner one read per host. A host whose connection drops
is asked again with backoff while the watch goes on; one that cannot be reached is a row that
says why. The watch never touches the run: it reads files and /proc.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

from multihost import remote
from multihost.defaults import DEFAULTS
from multihost.errors import HostError
from multihost.live.figures import HostSample, Reader
from multihost.live.snapshot import FleetSnapshot, HostRow, host_row, unreachable, verdicts
from multihost.model import Host
from multihost.remote import script
from multihost.transport import Connection, SSHOptions, connect

TOP = remote.load("top")  # r interval count tpu


@cache
def tpu_source() -> str:
    """The TPU figures' stdlib script (``multihost/remote/tpu_watch.py``), sent as an argument."""
    return (Path(remote.__file__).parent / "tpu_watch.py").read_text()


def top_command(run_dir: str, interval: float, count: int) -> str:
    """The host's script with its arguments: the run's dir, every how many seconds, how many
    looks (0: until the runner goes away)."""
    text = script(
        TOP, paths={"r": run_dir}, interval=f"{interval:g}", count=count, tpu=tpu_source()
    )
    return f"sh -c {shlex.quote(text)}"


class FleetWatch:
    """Every host of a run watched at once (``count`` looks each; 0: until cancelled)."""

    def __init__(
        self,
        run: str,
        hosts: Sequence[Host],
        run_dirs: Mapping[int, str],
        ssh: SSHOptions,
        *,
        interval: float = DEFAULTS.top_interval,
        count: int = 0,
        connect_limit: int = DEFAULTS.connect_limit,
    ) -> None:
        self.run_name, self.hosts, self.run_dirs, self.ssh = run, tuple(hosts), run_dirs, ssh
        self.interval, self.count = interval, count
        self.gate = asyncio.Semaphore(connect_limit)
        self.latest: dict[int, HostSample] = {}
        self.previous: dict[int, HostSample] = {}
        self.errors: dict[int, str] = {}
        self.looks: dict[int, int] = {}
        self.changed = asyncio.Event()  # set at each new look

    async def run(self) -> None:
        """Watch every host; returns once each gave ``count`` looks (or could not), never with
        ``count`` 0 (cancel it)."""
        async with asyncio.TaskGroup() as tg:
            for host in self.hosts:
                tg.create_task(self._watch(host))

    async def _watch(self, host: Host) -> None:
        pid = host.process_id
        delay = DEFAULTS.reconnect_first_delay
        command = top_command(self.run_dirs[pid], self.interval, self.count)
        while True:
            try:
                async with self.gate:
                    conn = await connect(host, self.ssh)
            except HostError as exc:
                self._failed(pid, exc.message)
                if self.count:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, DEFAULTS.reconnect_max_delay)
                continue
            try:
                if await self._stream(conn, host, command):
                    return
            except HostError as exc:
                self._failed(pid, exc.message)
            finally:
                await conn.close()
            if self.count:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, DEFAULTS.reconnect_max_delay)

    async def _stream(self, conn: Connection, host: Host, command: str) -> bool:
        """Read the host's looks until its script ends; True when it gave all it was asked."""
        reader, rest = Reader(host), bytearray()
        stderr = bytearray()
        async for chunk in conn.stream(command, stderr):
            for sample in reader.feed(chunk, rest):
                self._got(sample)
        if self.count and self.looks.get(host.process_id, 0) >= self.count:
            return True
        why = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["its answer ended"]
        self._failed(host.process_id, f"the watch script stopped: {why[0][:200]}")
        return bool(self.count)

    def _got(self, sample: HostSample) -> None:
        pid = sample.host.process_id
        if pid in self.latest:
            self.previous[pid] = self.latest[pid]
        self.latest[pid] = sample
        self.errors.pop(pid, None)
        self.looks[pid] = self.looks.get(pid, 0) + 1
        self.changed.set()

    def _failed(self, pid: int, why: str) -> None:
        self.errors[pid] = why
        self.changed.set()

    def snapshot(self) -> FleetSnapshot:
        """Every host's row from its latest looks, and the fleet's verdicts."""
        rows = []
        for host in self.hosts:
            pid = host.process_id
            sample = self.latest.get(pid)
            if sample is None:
                if pid in self.errors:
                    rows.append(unreachable(host, self.errors[pid]))
                else:
                    rows.append(HostRow(host, "connecting", detail="no answer yet"))
                continue
            row = host_row(sample, self.previous.get(pid))
            if pid in self.errors:  # the last look still shows, the connection is retried
                row = _note(row, f"reconnecting: {self.errors[pid]}")
            rows.append(row)
        return verdicts(self.run_name, rows, time.time())


def _note(row: HostRow, text: str) -> HostRow:
    return replace(row, detail=f"{row.detail}; {text}" if row.detail else text)


async def look_once(
    run: str,
    hosts: Sequence[Host],
    run_dirs: Mapping[int, str],
    ssh: SSHOptions,
    *,
    interval: float = 1.0,
    connect_limit: int = DEFAULTS.connect_limit,
) -> FleetSnapshot:
    """One snapshot: every host looked at twice, ``interval`` s apart (its CPU % is the
    difference), each within the connect timeout and a command's."""
    watch = FleetWatch(
        run, hosts, run_dirs, ssh, interval=interval, count=2, connect_limit=connect_limit
    )
    limit = ssh.connect_timeout + DEFAULTS.connect_slack + DEFAULTS.command_timeout
    try:
        async with asyncio.timeout(limit):
            await watch.run()
    except TimeoutError:
        for host in hosts:
            if watch.looks.get(host.process_id, 0) < 2:
                watch.errors.setdefault(host.process_id, f"no answer within {limit:g} s")
    return watch.snapshot()
