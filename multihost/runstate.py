"""What a run is told (its options) and what it tells (events), and its per-host bookkeeping."""

from __future__ import annotations

import os
import secrets
import signal as signals
import time
from dataclasses import dataclass, field
from pathlib import Path

from multihost.defaults import DEFAULTS
from multihost.envsync import EnvRequest
from multihost.launch import Started
from multihost.model import Host, State
from multihost.plan import Paths
from multihost.result import HostResult, read_result
from multihost.stream import Exit, Line, LogSink
from multihost.transport import Connection, Shell, SSHOptions


def default_log_dir() -> Path:
    """``$MULTIHOST_LOG_DIR``, else ``~/multihost-logs``."""
    return Path(os.environ.get("MULTIHOST_LOG_DIR") or Path.home() / "multihost-logs")


def default_run_name(prefix: str = "") -> str:
    """``[prefix-]YYYYmmdd-HHMMSS-xxxxxx``: sorts by start time (to the second) and a random
    suffix keeps runs started in the same second apart."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{prefix}{'-' if prefix else ''}{stamp}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RunOptions:
    """How to run, as opposed to what: every knob of the pipeline in one place."""

    script_dir: Path = Path(".")
    excludes: tuple[str, ...] = ()
    log_dir: Path = field(default_factory=default_log_dir)
    ssh: SSHOptions = field(default_factory=SSHOptions)
    connect_limit: int = DEFAULTS.connect_limit
    fail_fast: bool = True
    grace: float = DEFAULTS.grace
    timeout: float | None = None
    stage_timeout: float = DEFAULTS.stage_timeout
    stage_via: str = DEFAULTS.stage_via  # see multihost.stagevia
    launch_timeout: float = DEFAULTS.launch_timeout
    reconnect_timeout: float = DEFAULTS.reconnect_timeout
    detach: bool = False
    record_env: bool = False  # keep --env values in run.json (default: their names only)
    secrets: tuple[tuple[str, str], ...] = ()  # (KEY, Secret Manager NAME): read at the launch
    hang_timeout: float | None = None  # no output from any host this long: take stacks, then
    on_hang: str = "stop"  # "stop" the run (exit 1) or only "report" and go on
    trace: float | None = None  # seconds of jax.profiler trace once every host steps
    trace_after: float = DEFAULTS.trace_after  # ... this long after the last one started
    stale: str = "off"  # "warn": report accelerator holders before launching; "kill": stop them
    device_glob: str | None = None
    environment: EnvRequest | None = None  # issue 27: the locked env on every host
    setup: str | None = None  # issue 27: --setup CMD on every host before the gate


@dataclass(frozen=True)
class HostEvent:
    """A host changed state."""

    host: Host
    state: State
    detail: str = ""


@dataclass(frozen=True)
class Note:
    """A message about the run as a whole."""

    text: str
    level: str = "info"


@dataclass(frozen=True)
class Transfer:
    """Bytes moving between this machine and a host (staging code, pulling files): ``done`` of
    ``total`` so far; ``finished`` once that host's transfer is over (``total`` 0: it needed
    nothing)."""

    host: Host
    what: str  # "stage" or "pull"
    done: int
    total: int
    finished: bool = False


Event = HostEvent | Line | Note | Transfer


_SIGNALS = frozenset(s.name.removeprefix("SIG") for s in signals.Signals)


@dataclass
class Slot:
    """The runner's mutable bookkeeping for one host (results are frozen from it at the end)."""

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
