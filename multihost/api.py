"""The Python API: what the CLI does, callable from a notebook or a script."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from multihost.defaults import DEFAULTS
from multihost.fleetops.preflight import free_port
from multihost.model import Fleet, Job, RunResult
from multihost.plan import check_run_name
from multihost.runner import Run
from multihost.runstate import Event, RunOptions, default_run_name
from multihost.sources import FleetSpec, resolve
from multihost.transport import SSHOptions


def make_fleet(
    hosts: str | Fleet | None = None,
    local: int | None = None,
    *,
    prefix: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    ip: str = "auto",
    user: str | None = None,
) -> Fleet:
    """A Fleet from ``hosts`` (a list spec, an inventory path, or a Fleet), ``local`` N, or
    the Cloud TPU slices named ``prefix``."""
    if isinstance(hosts, Fleet):
        return hosts
    if sum(x is not None for x in (hosts, local, prefix)) != 1:
        raise ValueError("give exactly one of hosts=, local= or prefix=")
    spec = FleetSpec(hosts=hosts, local=local, prefix=prefix, project=project, zone=zone, ip=ip,
                     user=user)  # fmt: skip
    return resolve(spec).fleet


async def run_async(
    command: str,
    *,
    hosts: str | Fleet | None = None,
    local: int | None = None,
    env: Mapping[str, str] | None = None,
    run_name: str | None = None,
    script_dir: str | Path = ".",
    ssh_config: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    **options: object,
) -> RunResult:
    """Run ``command`` on every host at once; returns every host's result (never raises for one)."""
    fleet = make_fleet(hosts, local)
    job = Job(
        command=command,
        run_name=check_run_name(run_name or default_run_name()),
        env=dict(env or {}),
        # Local workers share this machine's ports: a free one, so two local runs never meet.
        coordinator_port=free_port() if fleet.local else DEFAULTS.coordinator_port,
    )
    ssh = SSHOptions(config=(Path(ssh_config),) if ssh_config else ())
    opts = RunOptions(script_dir=Path(script_dir), ssh=ssh, **options)  # type: ignore[arg-type]
    return await Run(fleet, job, opts, on_event).execute()


def run(command: str, **kwargs: object) -> RunResult:
    """Blocking form of :func:`run_async` (not for use inside a running event loop)."""
    return asyncio.run(run_async(command, **kwargs))  # type: ignore[arg-type]
