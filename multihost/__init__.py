"""multihost: run one command on every host of a multi-host accelerator job, all at once."""

from multihost.api import make_fleet, run, run_async
from multihost.errors import (
    ConnectError,
    ConnectTimeout,
    DiscoveryError,
    HostError,
    HostKeyError,
    HostLost,
    InventoryError,
    MultihostError,
    RemoteError,
    UsageError,
)
from multihost.model import Fleet, Host, HostResult, Job, RunResult, State
from multihost.runstate import RunOptions
from multihost.transport import SSHOptions

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "DiscoveryError",
    "Fleet",
    "Host",
    "HostError",
    "HostKeyError",
    "HostLost",
    "HostResult",
    "InventoryError",
    "Job",
    "MultihostError",
    "RemoteError",
    "RunOptions",
    "RunResult",
    "SSHOptions",
    "State",
    "UsageError",
    "make_fleet",
    "run",
    "run_async",
]
