"""What a run is told: its options (``RunOptions``), its default log dir and run name. What it
tells as it goes is in ``multihost.events``; how it ended in ``multihost.results.records``."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from multihost.defaults import DEFAULTS
from multihost.envsync.request import EnvRequest
from multihost.transport import SSHOptions


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
    stage_via: str = DEFAULTS.stage_via  # see multihost.staging.via
    stage_bucket: str = DEFAULTS.stage_bucket  # the bucket auto may choose ("": none)
    launch_timeout: float = DEFAULTS.launch_timeout
    reconnect_timeout: float = DEFAULTS.reconnect_timeout
    detach: bool = False
    record_env: bool = False  # keep --env values in run.json (default: their names only)
    secrets: tuple[tuple[str, str], ...] = ()  # (KEY, Secret Manager NAME): read at the launch
    hang_timeout: float | None = None  # no output from any host this long: take stacks, then
    on_hang: str = "stop"  # "stop" the run (exit 1) or only "report" and go on
    trace: float | None = None  # seconds of jax.profiler trace once every host steps
    trace_after: float | None = DEFAULTS.trace_after  # None: once every first step ended
    pull: tuple[str, ...] = ()  # after the run, whatever its outcome: these paths back
    pull_to: Path | None = None  # ... into this folder (default ./multihost-pull/RUN)
    stale: str = "off"  # "warn": report accelerator holders before launching; "kill": stop them
    device_glob: str | None = None
    environment: EnvRequest | None = None  # the locked env on every host (uv.lock)
    host_uv: str = DEFAULTS.host_uv  # a builder without uv: "auto" or "fetch" (envsync.uvbin)
    setup: str | None = None  # --setup CMD on every host before the gate
