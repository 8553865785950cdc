"""Following an existing run from its record: ``Attach`` (``observe`` for ``logs --follow``,
which never stops anything) and ``Stop``, which stops it on every host and waits for each."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from multihost.core.supervisor import Supervisor
from multihost.core.watch import watch_all
from multihost.defaults import DEFAULTS
from multihost.errors import HostError
from multihost.events import Event
from multihost.model import Host, State
from multihost.options import RunOptions
from multihost.results.records import RunResult
from multihost.runs.record import RunRecord, watch_lock
from multihost.runs.stream import LogSink
from multihost.transport import Connection, connect
from multihost.transport.fanout import map_hosts


class Attach:
    """Follow an existing run from its record, from where the local logs end.

    ``observe=True`` (``logs --follow``) only watches: an interrupt leaves every job alone.
    ``only``: the process ids to follow (``--workers``); the record keeps the others as they are.
    """

    def __init__(
        self,
        record: RunRecord,
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
        *,
        observe: bool = False,
        stop_signal: str = "TERM",
        only: Collection[int] | None = None,
    ) -> None:
        part = record
        if only is not None:
            part = replace(
                record, hosts=tuple(h for h in record.hosts if h.host.process_id in only)
            )
        self.sup = sup = Supervisor(
            part.fleet,
            record.job,
            options,
            on_event,
            code_hash=record.code_hash,
            observe_only=observe,
            stop_signal=stop_signal,
        )
        sup.first_failure = record.first_failure
        sup.env_names = record.env_names
        sup.recorded = record  # the whole run: the hosts not followed are kept as recorded
        logs = part.logs(sup.log_dir)
        for data, slot in zip(part.hosts, sup.slots.values(), strict=True):
            slot.paths = sup.paths(slot.host)
            slot.env = dict(data.env) if data.env is not None else None
            slot.bytes_sent = data.bytes_sent
            if data.state is State.ERROR:  # never launched: nothing to attach to
                slot.state, slot.error = data.state, data.error
            else:
                slot.sink = LogSink(slot.host, logs[slot.host.process_id], sup.emit)

    @property
    def log_dir(self) -> Path:
        return self.sup.log_dir

    @property
    def connections(self) -> dict[int, Connection]:
        """The open connections by process id."""
        return self.sup.connections

    def interrupt(self) -> None:
        """Stop the run everywhere (detach only, when observing); it then ends with exit 130."""
        self.sup.interrupt()

    def request_stacks(self) -> None:
        """Take every host's stacks now and report them."""
        self.sup.request_stacks()

    async def execute(self) -> RunResult:
        """Reconnect to every launched host and watch (or stop) until each reports."""
        sup = self.sup
        started = time.monotonic()
        with watch_lock(sup.log_dir):
            try:
                await map_hosts(
                    self._reattach_one,
                    list(sup.fleet),
                    limit=sup.options.connect_limit,
                    timeout=sup.options.ssh.connect_timeout + DEFAULTS.connect_slack,
                    what="connect",
                )
                await watch_all(sup, started)
            finally:
                await sup.close_all()
            return sup.finish()

    async def _reattach_one(self, host: Host) -> None:
        slot = self.sup.slots[host.process_id]
        if slot.sink is not None:
            try:
                slot.conn = await connect(host, self.sup.options.ssh)
            except HostError as exc:  # the watcher keeps trying until the reconnect timeout
                self.sup.set_state(slot, State.RECONNECTING, exc.message)


class Stop(Attach):
    """Stop an existing run: ``signal`` to every host's process group, KILL after the grace
    period, and wait for each host to report its exit."""

    def __init__(
        self,
        record: RunRecord,
        options: RunOptions,
        on_event: Callable[[Event], None] | None = None,
        *,
        signal: str = "TERM",
        only: Collection[int] | None = None,
    ) -> None:
        super().__init__(record, options, on_event, stop_signal=signal, only=only)
        self.interrupt()
