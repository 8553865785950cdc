"""One host's mutable bookkeeping in a run: its state, connection, paths, log and exit; the
host's frozen ``HostResult`` is read from it."""

from __future__ import annotations

import asyncio
import signal as signals
from dataclasses import dataclass

from multihost.commands import Paths
from multihost.launch import Ready, Started
from multihost.model import Host, State
from multihost.runresult import HostResult, read_result
from multihost.stream import Exit, LogSink
from multihost.transport import Connection, Shell

_SIGNALS = frozenset(s.name.removeprefix("SIG") for s in signals.Signals)


@dataclass
class LiveHost:
    """A run's mutable bookkeeping for one host (results are frozen from it at the end)."""

    host: Host
    state: State = State.PENDING
    conn: Connection | None = None
    paths: Paths | None = None  # known once the code hash is (launch, or the run's record)
    env: dict[str, str] | None = None
    sink: LogSink | None = None
    bytes_sent: int = 0
    error: str | None = None
    exit: Exit | None = None
    started: Started | None = None  # a launch that goes on watching, until its watcher reads it
    shell: Shell | None = None  # opened while preparing, for the launch (then handed over)
    # a launch sent while preparing, right behind the code (core.prepare), until start takes it
    early: asyncio.Task[Ready] | None = None

    def result(self, *, final: bool = False) -> HostResult:
        """The host's result so far; ``final``: with the result line read from its log."""
        code = self.exit.code if self.exit and not self.exit.problem else None
        signal = None
        if self.exit and self.state is State.KILLED:
            stopped = self.exit.stopped_by
            signal = signals.Signals[f"SIG{stopped}"].value if stopped in _SIGNALS else None
            if signal is None and code is not None and code > 128:
                signal = code - 128
        return HostResult(
            host=self.host,
            state=self.state,
            exit_code=code,
            signal=signal,
            error=self.error,
            started_at=self.exit.started_at if self.exit else None,
            ended_at=self.exit.ended_at if self.exit else None,
            bytes_sent=self.bytes_sent,
            last_line=self.sink.last_line if self.sink else "",
            log=self.sink.path if self.sink else None,
            reported=read_result(self.sink.path)
            if final and self.sink and self.sink.may_have_result
            else None,
        )
