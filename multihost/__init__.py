"""multihost: run one command on every host of a multi-host accelerator job, all at once.

The names below are imported on first use, so ``import multihost`` stays cheap (no asyncssh,
no rich) until the API is actually called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

_WHERE = {
    **dict.fromkeys(("make_fleet", "run", "run_async"), "multihost.api"),
    **dict.fromkeys(
        (
            "ConnectError",
            "ConnectTimeout",
            "DiscoveryError",
            "HostError",
            "HostKeyError",
            "HostLost",
            "InventoryError",
            "MultihostError",
            "RemoteError",
            "UsageError",
        ),
        "multihost.errors",
    ),
    **dict.fromkeys(
        ("Fleet", "Host", "HostResult", "Job", "RunResult", "State"), "multihost.model"
    ),
    "RunOptions": "multihost.runstate",
    "SSHOptions": "multihost.transport",
}

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'multihost' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
