"""What the environment phase uses of the run it prepares: each host's connection and paths,
the run's options, its notes, the per-host variables the phase adds to each command, and Ctrl-C.

The run core's :class:`~multihost.core.supervisor.Supervisor` is one (mypy checks it where the
core calls the phase); naming only these lets the environment sit below the run core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Protocol, TypeVar

from multihost.model import Host
from multihost.remote.commands import Paths
from multihost.transport import Connection
from multihost.transport.fanout import Outcome

T = TypeVar("T")


class EnvOptions(Protocol):
    """The run's options the environment reads."""

    @property
    def host_uv(self) -> str: ...  # a builder without uv: "auto" or "fetch"
    @property
    def stage_via(self) -> str: ...
    @property
    def stage_bucket(self) -> str: ...
    @property
    def stage_timeout(self) -> float: ...


class HostSlot(Protocol):
    """One host of the run: its open connection (None before it is connected)."""

    @property
    def conn(self) -> Connection | None: ...


class EnvRun(Protocol):
    """A run being prepared, as the environment phase sees it."""

    env_bytes: int  # what the runner sent for the environment (uv, packs)

    @property
    def options(self) -> EnvOptions: ...
    @property
    def slots(self) -> Mapping[int, HostSlot]: ...
    @property
    def interrupted(self) -> bool: ...
    @property
    def extra_env(self) -> MutableMapping[int, dict[str, str]]:
        """Per host, the variables its command gets (``MULTIHOST_ENV``)."""
        ...

    def paths(self, host: Host) -> Paths: ...
    def note(self, text: str, level: str = "info") -> None: ...
    async def phase(
        self,
        fn: Callable[[Host], Awaitable[T]],
        limit: int | None,
        timeout: float | None,
        what: str,
    ) -> list[Outcome[T]]:
        """``fn`` on every host, cut short by Ctrl-C."""
        ...
