"""One host's mutable bookkeeping in a run: its state, connection, paths, log and exit; the
host's frozen ``HostResult`` is read from it (``LiveHost.result``, the one conversion)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multihost.model import Host, State
from multihost.remote.commands import Paths
from multihost.results.records import HostResult, read_result
from multihost.runs.launch import Ready, Started
from multihost.runs.stream import Exit, LogSink, code_and_signal

if TYPE_CHECKING:  # read only when a host failed (core.watch)
    from multihost.diagnose.jaxfaults import Fault
from multihost.transport import Connection, Shell


@dataclass
class LiveHost:
    """One host's live state during a run, changed in place as the run goes on: its connection,
    log sink, launch and exit, besides the outcome's own fields. Not an outcome: the outcome is
    the frozen ``HostResult`` read from it by ``result()`` (for the run's record while it runs,
    and for the run's result at its end); nothing converts back."""

    host: Host
    state: State = State.PENDING
    conn: Connection | None = None
    paths: Paths | None = None  # known once the code hash is (launch, or the run's record)
    env: dict[str, str] | None = None
    sink: LogSink | None = None
    bytes_sent: int = 0
    error: str | None = None
    exit: Exit | None = None
    fault: Fault | None = None  # what its log says JAX's coordination service did to it
    cause: str | None = None  # that, with every host's, in words (core.watch.explain_jax)
    started: Started | None = None  # a launch that goes on watching, until its watcher reads it
    shell: Shell | None = None  # opened while preparing, for the launch (then handed over)
    # a launch sent while preparing, right behind the code (core.prepare), until start takes it
    early: asyncio.Task[Ready] | None = None

    def result(self, *, final: bool = False, env: Mapping[str, str] | None = None) -> HostResult:
        """The host's result so far; ``final``: with the result line read from its log;
        ``env``: the environment the run's record keeps for it."""
        code, signal = code_and_signal(self.exit, self.state) if self.exit else (None, None)
        return HostResult(
            host=self.host,
            state=self.state,
            exit_code=code,
            signal=signal,
            error=self.error,
            cause=None if self.state is State.DONE else self.cause,
            started_at=self.exit.started_at if self.exit else None,
            ended_at=self.exit.ended_at if self.exit else None,
            bytes_sent=self.bytes_sent,
            last_line=self.sink.last_line if self.sink else "",
            log=self.sink.path if self.sink else None,
            env=env,
            startup=dict(self.exit.startup) if self.exit else {},
            reported=read_result(self.sink.path)
            if final and self.sink and self.sink.may_have_result
            else None,
        )
