"""What a run tells as it goes: a host changed state (``HostEvent``), a host's output line
(``Line``), a message about the whole run (``Note``), bytes moving
(``Transfer``). Every callback of the API and the CLI's views take these."""

from __future__ import annotations

from dataclasses import dataclass

from multihost.model import Host, State


@dataclass(frozen=True)
class HostEvent:
    """A host changed state."""

    host: Host
    state: State
    detail: str = ""


@dataclass(frozen=True)
class Line:
    """Lines of one host's output, in order: what one chunk from the host completed (one
    event per chunk, not per line, so that a chatty host costs the runner little per line)."""

    host: Host
    stream: str
    texts: tuple[str, ...]


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
