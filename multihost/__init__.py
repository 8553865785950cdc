"""multihost: run one command on every host of a multi-host accelerator job, all at once.

The public API is what this package exports (``__all__``), and only that:

- run: ``run``, ``run_async``, ``call``, ``session``, ``run_sweep``, ``make_fleet``;
- runs after the fact: ``status``, ``attach``, ``kill``, ``pull_logs``, ``pull``, ``stacks``,
  ``top``, ``plot``;
- a pod's life: ``up``, ``down``, ``pods``, ``gc``, ``autodown``, ``with pod(...)``, a
  :class:`Pod` each; a run's ``up=``/``down=``;
- the production path: ``submit_job`` (a :class:`JobHandle`: ``watch``, ``status``, ``logs``,
  ``stop``), ``jobs``;
- results: ``RunResult``, ``HostResult``, ``PullResult``, ``StackReport``, ``FleetSnapshot``,
  ``CallResult``, ``SweepResult``; a dry run's plan: ``DryRun``, ``HostPreview``; a
  session's handle, ``Session``;
- the fleet and the run: ``Fleet``, ``Host``, ``Job``, ``State``, ``RunOptions``, ``SSHOptions``;
- errors: ``MultihostError`` and the tree under it.

The modules inside the package are private: import from ``multihost``, not from them (they
move). The names are imported on first use, so ``import multihost`` stays cheap (no asyncssh,
no rich) until the API is actually called.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__all__ = [
    "CallResult",
    "ConnectError",
    "ConnectTimeout",
    "DiscoveryError",
    "DryRun",
    "EnvFailed",
    "Fleet",
    "FleetSnapshot",
    "Host",
    "HostError",
    "HostKeyError",
    "HostLost",
    "HostPreview",
    "HostResult",
    "InventoryError",
    "Job",
    "JobHandle",
    "MultihostError",
    "Pod",
    "PullResult",
    "RemoteCallError",
    "RemoteError",
    "RunOptions",
    "RunResult",
    "SSHOptions",
    "Session",
    "StackReport",
    "State",
    "SweepResult",
    "UsageError",
    "WarmError",
    "attach",
    "autodown",
    "call",
    "down",
    "gc",
    "jobs",
    "kill",
    "make_fleet",
    "plot",
    "pod",
    "pods",
    "pull",
    "pull_logs",
    "run",
    "run_async",
    "run_sweep",
    "session",
    "stacks",
    "status",
    "submit_job",
    "top",
    "up",
]

_WHERE = {
    **dict.fromkeys(
        (
            "attach",
            "kill",
            "make_fleet",
            "pull",
            "pull_logs",
            "run",
            "run_async",
            "status",
        ),
        "multihost.api.runs",
    ),
    **dict.fromkeys(("plot", "stacks", "top"), "multihost.api.watching"),
    "call": "multihost.api.call",
    **dict.fromkeys(("autodown", "down", "gc", "pod", "pods", "up"), "multihost.api.pods"),
    **dict.fromkeys(("JobHandle", "jobs", "submit_job"), "multihost.api.jobs"),
    "Pod": "multihost.pods.records",
    **dict.fromkeys(("SweepResult", "run_sweep"), "multihost.api.sweep"),
    **dict.fromkeys(("Session", "session"), "multihost.api.session"),
    **dict.fromkeys(
        (
            "ConnectError",
            "ConnectTimeout",
            "DiscoveryError",
            "EnvFailed",
            "HostError",
            "HostKeyError",
            "HostLost",
            "InventoryError",
            "MultihostError",
            "RemoteCallError",
            "RemoteError",
            "UsageError",
            "WarmError",
        ),
        "multihost.errors",
    ),
    **dict.fromkeys(("Fleet", "Host", "Job", "State"), "multihost.model"),
    **dict.fromkeys(
        ("CallResult", "HostResult", "PullResult", "RunResult"), "multihost.results.records"
    ),
    **dict.fromkeys(("DryRun", "HostPreview"), "multihost.planner"),
    "StackReport": "multihost.diagnose.stacks",
    "FleetSnapshot": "multihost.live.snapshot",
    "RunOptions": "multihost.options",
    "SSHOptions": "multihost.transport",
}

if TYPE_CHECKING:
    from multihost.api.call import call
    from multihost.api.jobs import JobHandle, jobs, submit_job
    from multihost.api.pods import autodown, down, gc, pod, pods, up
    from multihost.api.runs import (
        attach,
        kill,
        make_fleet,
        pull,
        pull_logs,
        run,
        run_async,
        status,
    )
    from multihost.api.session import Session, session
    from multihost.api.sweep import SweepResult, run_sweep
    from multihost.api.watching import plot, stacks, top
    from multihost.diagnose.stacks import StackReport
    from multihost.errors import (
        ConnectError,
        ConnectTimeout,
        DiscoveryError,
        EnvFailed,
        HostError,
        HostKeyError,
        HostLost,
        InventoryError,
        MultihostError,
        RemoteCallError,
        RemoteError,
        UsageError,
        WarmError,
    )
    from multihost.live.snapshot import FleetSnapshot
    from multihost.model import Fleet, Host, Job, State
    from multihost.options import RunOptions
    from multihost.planner import DryRun, HostPreview
    from multihost.pods.records import Pod
    from multihost.results.records import CallResult, HostResult, PullResult, RunResult
    from multihost.transport import SSHOptions


class _Package(types.ModuleType):
    """``multihost`` itself: the function ``pods`` keeps its name when the subpackage of that
    name is imported (the import system sets a subpackage as its parent's attribute; this
    one is reached as ``multihost.pods.…`` through sys.modules all the same)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'multihost' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
