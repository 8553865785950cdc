"""Frozen data that the pipeline passes around: hosts, fleets, jobs and results. No I/O here."""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from multihost.defaults import DEFAULTS


class State(enum.StrEnum):
    """Where one host is in the pipeline (or, asked afterwards, how its job stands); the last
    seven are final."""

    PENDING = "pending"
    CONNECTING = "connecting"
    STAGING = "staging"
    STARTING = "starting"
    RUNNING = "running"
    RECONNECTING = "reconnecting"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"
    KILLED = "killed"
    ERROR = "error"
    LOST = "lost"
    VANISHED = "vanished"  # the job's process group is gone without an exit code
    MISSING = "missing"  # the run's directory is gone from the host

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset(
    {State.DONE, State.FAILED, State.KILLED, State.ERROR, State.LOST, State.VANISHED, State.MISSING}
)


@dataclass(frozen=True)
class Host:
    """One worker: where to reach it and who it is in the job.

    ``address`` is what the transport connects to (an ssh alias, a name or an IP; for
    local workers a label). ``internal_address`` is what the other workers use to reach
    it; when unset the address the connection actually reached is used.
    """

    address: str
    slice_id: int = 0
    worker_id: int = 0
    process_id: int = 0
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    internal_address: str | None = None
    remote_dir: str | None = None
    local: bool = False
    accelerator_type: str | None = None
    cloud_state: str | None = None
    # how to reach it when not directly (issue 26): a ProxyCommand (``%h``/``%p`` expanded by
    # the transport), and what to suggest when its address cannot be reached
    proxy_command: tuple[str, ...] | None = None
    reach_hint: str | None = None

    def __post_init__(self) -> None:
        if self.proxy_command is not None and not isinstance(self.proxy_command, tuple):
            object.__setattr__(self, "proxy_command", tuple(self.proxy_command))  # from JSON

    @property
    def name(self) -> str:
        """Short label used in every message and log prefix: ``s0/w3``."""
        return f"s{self.slice_id}/w{self.worker_id}"

    @property
    def file_stem(self) -> str:
        """File name stem for this host's local log."""
        return f"slice_{self.slice_id:04d}_worker_{self.worker_id:04d}"

    @property
    def target(self) -> str:
        """``[user@]address[:port]`` as a person would type it."""
        address = f"[{self.address}]" if ":" in self.address else self.address  # IPv6
        text = f"{self.user}@{address}" if self.user else address
        return f"{text}:{self.port}" if self.port else text


@dataclass(frozen=True)
class Fleet:
    """Every host of a job, slice-major: slice 0's workers first."""

    hosts: tuple[Host, ...]

    @classmethod
    def from_slices(cls, slices: Sequence[Sequence[Host]]) -> Fleet:
        """Number hosts by slice, worker and global process index."""
        hosts: list[Host] = []
        for slice_id, workers in enumerate(slices):
            for worker_id, host in enumerate(workers):
                hosts.append(
                    replace(host, slice_id=slice_id, worker_id=worker_id, process_id=len(hosts))
                )
        return cls(tuple(hosts))

    @property
    def num_slices(self) -> int:
        return len({h.slice_id for h in self.hosts})

    @property
    def workers_per_slice(self) -> int:
        return max((h.worker_id + 1 for h in self.hosts), default=0)

    @property
    def local(self) -> bool:
        return any(h.local for h in self.hosts)

    def slices(self) -> list[tuple[Host, ...]]:
        """The hosts grouped by slice, in order."""
        return [tuple(h for h in self.hosts if h.slice_id == s) for s in range(self.num_slices)]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)


@dataclass(frozen=True)
class Job:
    """What to run on every host, and the names and ports it runs with."""

    command: str
    run_name: str
    env: Mapping[str, str] = field(default_factory=dict)
    remote_dir: str = DEFAULTS.remote_dir
    coordinator_port: int = DEFAULTS.coordinator_port
    megascale_port: int = DEFAULTS.megascale_port


@dataclass(frozen=True)
class HostResult:
    """How one host's part of a run ended. Every host yields one; none raises."""

    host: Host
    state: State
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    bytes_sent: int = 0
    last_line: str = ""
    log: Path | None = field(default=None, compare=False)  # the local copy of its output

    @property
    def ok(self) -> bool:
        return self.state is State.DONE

    def result(self) -> dict[str, Any] | None:
        """The last ``MULTIHOST_RESULT {json}`` object in this host's local log (reads it)."""
        from multihost.sweep.results import read_result

        return None if self.log is None else read_result(self.log)

    def __repr__(self) -> str:
        outcome = f" {self.reason}" if self.reason else ""
        return f"<HostResult {self.host.name} {self.state}{outcome}>"

    def _repr_html_(self) -> str:
        from multihost.display_html import host_html

        return host_html(self)

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    @property
    def reason(self) -> str:
        """One line saying why this host did not succeed (empty when it did)."""
        if self.error:
            return self.error
        if self.signal is not None:
            killed = f"killed by signal {self.signal} ({signal_name(self.signal)})"
            if self.exit_code == 128 + self.signal:  # what a shell reports for such a child
                return f"exited with code {self.exit_code}: {killed}"
            return killed
        if self.exit_code:
            return f"exited with code {self.exit_code}"
        return ""


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for a number with no name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Staging:
    """How the code reached the hosts (``--stage-via``) and what it cost the runner's link."""

    via: str  # "direct", "peer" or the gs:// URL
    archive_bytes: int
    runner_bytes: int  # what left the runner: stdin through the transport, plus a bucket upload
    uploads: int  # whole-archive uploads by the runner: to hosts (seeds, fallbacks) or a bucket
    fetched: int = 0  # hosts that got it from a seed or the bucket
    present: int = 0  # hosts that had it already
    fallbacks: tuple[str, ...] = ()  # "host: why its fetch failed" (then sent directly)


@dataclass(frozen=True)
class RunResult:
    """Every host's result plus what the run as a whole saw."""

    run_name: str
    hosts: tuple[HostResult, ...]
    log_dir: Path | None = None
    first_failure: str | None = None
    interrupted: bool = False
    timed_out: bool = False
    staging: Staging | None = None  # None when this run staged nothing (a sweep's later runs)

    @property
    def failed(self) -> tuple[HostResult, ...]:
        return tuple(r for r in self.hosts if not r.ok)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted and not self.timed_out

    @property
    def exit_code(self) -> int:
        """0 all succeeded, 1 any failed, 130 interrupted."""
        if self.interrupted:
            return 130
        return 0 if self.ok else 1

    def result(self) -> dict[str, Any] | None:
        """Process 0's last ``MULTIHOST_RESULT {json}`` object (read from its local log), or
        None when it printed none."""
        first = min(self.hosts, key=lambda r: r.host.process_id, default=None)
        return None if first is None else first.result()

    def __repr__(self) -> str:
        hosts = ", ".join(f"{r.host.name} {r.state}" for r in self.hosts)
        return f"<RunResult {self.run_name}: exit {self.exit_code}; {hosts}>"

    def __str__(self) -> str:
        from multihost.display_html import run_text

        return run_text(self)

    def _repr_html_(self) -> str:
        from multihost.display_html import run_html

        return run_html(self)
