"""Frozen data that the pipeline passes around: hosts, fleets, jobs and the one State enum.
No I/O here; how a run ended is in :mod:`multihost.results.records`."""

from __future__ import annotations

import enum
import functools
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

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
    # how to reach it when not directly (IAP): a ProxyCommand (``%h``/``%p`` expanded by
    # the transport), and what to suggest when its address cannot be reached
    proxy_command: tuple[str, ...] | None = None
    reach_hint: str | None = None
    # another worker whose SSH connection this one is reached through (a ``direct-tcpip``
    # hop to ``address``, as ProxyJump does): one IAP tunnel per slice, not one per worker
    jump: Host | None = None

    def __post_init__(self) -> None:
        if self.proxy_command is not None and not isinstance(self.proxy_command, tuple):
            object.__setattr__(self, "proxy_command", tuple(self.proxy_command))  # from JSON
        if isinstance(self.jump, dict):  # from JSON
            object.__setattr__(self, "jump", Host(**self.jump))

    def with_user(self, user: str | None) -> Host:
        """This host, and the worker it hops through, logged in to as ``user`` (``--user``:
        every host of the fleet, its hops among them)."""
        return self.with_login(lambda _: user)

    def with_login(self, login: Callable[[Host], str | None]) -> Host:
        """This host logged in to as ``login(self)``, and the worker it hops through as
        ``login(that worker)``: a hop is reached with its own settings, as OpenSSH reaches a
        jump host, never as the host behind it; so it stays the very Host of that worker, and
        the worker's own steps and the hosts behind it share one connection."""
        jump = None if self.jump is None else self.jump.with_login(login)
        return replace(self, user=login(self), jump=jump)

    @property
    def hops(self) -> tuple[Host, ...]:
        """The hosts this one is reached through, the nearest first."""
        return () if self.jump is None else (self.jump, *self.jump.hops)

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

    @functools.cached_property
    def num_slices(self) -> int:  # cached: asked once per host while planning
        return len({h.slice_id for h in self.hosts})

    @functools.cached_property
    def workers_per_slice(self) -> int:
        return max((h.worker_id + 1 for h in self.hosts), default=0)

    @property
    def local(self) -> bool:
        return any(h.local for h in self.hosts)

    def reached(self) -> tuple[Host, ...]:
        """Every host a connection is opened to: the fleet's, then the hops outside it (a
        slice's first worker left out by ``--workers``), each once."""
        found = dict.fromkeys(self.hosts)
        for h in self.hosts:
            found.update(dict.fromkeys(h.hops))
        return tuple(found)

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
    workers: str = ""  # some hosts of the fleet (--workers, folded): no JAX job; "": all
    compile_cache: int = DEFAULTS.compile_cache_max  # its cap on each host, bytes; 0: none


def spans(numbers: Iterable[int]) -> list[str]:
    """``["0-3", "5"]`` for 0, 1, 2, 3, 5: runs of consecutive numbers, in order."""
    found: list[str] = []
    ordered = sorted(set(numbers))
    if not ordered:
        return found
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        found.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return found


def fold(pairs: Iterable[tuple[int, int]]) -> str:
    """``s0/w0-2,s1/w0-3``: (slice, worker) pairs written compactly, slice by slice, in order;
    ``multihost.sources.workers`` reads the same notation back."""
    by_slice: dict[int, list[int]] = {}
    for slice_id, worker_id in sorted(set(pairs)):
        by_slice.setdefault(slice_id, []).append(worker_id)
    return ",".join(f"s{s}/w{r}" for s, workers in by_slice.items() for r in spans(workers))


def host_ranges(hosts: Sequence[Host]) -> str:
    """``s0/w0-2,s1/w0-3``: hosts written compactly, slice by slice, in order."""
    return fold((h.slice_id, h.worker_id) for h in hosts)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for a number with no name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
