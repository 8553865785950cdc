"""The planner's checks of single values, each refused in words before anything starts: ports,
the job's env and text (UTF-8), the log dir and the code dir; and where the
log dir and the held-device glob come from. ``multihost.planner`` applies them to a run's
settings; the CLI reads the log dir through them too (the ssh config is checked where it is
read: ``multihost.transport.sshconfig``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from multihost.defaults import DEFAULTS as D
from multihost.errors import SettingError, UsageError
from multihost.model import Fleet
from multihost.options import default_log_dir
from multihost.remote.commands import parse_env


def check_port(name: str, value: object) -> None:
    """A port is a whole number 1-65535 (the flags' type checks the CLI's; this, the API's)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
    if value is not None and not ok:
        raise SettingError(f"{name}={value!r}: not a port (1-65535)")


def remote_base(value: str) -> str:
    """The hosts' base dir, a relative one under the remote user's home (the flag's type
    checks the CLI's and the config files'; this, the API's)."""
    from argparse import ArgumentTypeError

    from multihost.settings.types import remote_dir

    try:
        return remote_dir(utf8("remote_dir", value))
    except ArgumentTypeError as exc:
        raise SettingError(f"remote_dir: {exc}") from None


def device_glob() -> str | None:
    """``$MULTIHOST_DEVICE_GLOB``: which device files count as held accelerators."""
    from multihost.fleetops.stale import DEVICE_GLOB_ENV

    return os.environ.get(DEVICE_GLOB_ENV)


def env_of(env: Mapping[str, object] | Sequence[str]) -> dict[str, str]:
    """``K=V`` strings or a mapping → the job's env, each name and value checked."""
    if isinstance(env, Mapping):
        env = [f"{k}={v}" for k, v in env.items()]
    return parse_env([utf8("env", e) for e in env])


def utf8(name: str, text: str) -> str:
    """Text that goes to a host must be UTF-8 (a lone surrogate, a byte that was not, fails
    only when the launch script is written: after staging, naming nothing)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise SettingError(f"{name}={text!r}: not UTF-8 text") from None
    return text


def coordinator_port(fleet: Fleet, port: int | None) -> int:
    """The given port; else with local workers a free one (two local runs at once must not
    meet at one coordinator), else jax's default. A busy local port is refused up front."""
    from multihost.fleetops.preflight import free_port, port_in_use

    if not fleet.local:
        return port or D.coordinator_port
    if port is None:
        return free_port()
    busy = port_in_use(port)
    if busy:
        raise UsageError(
            f"coordinator port {port} is busy on this machine (host 0 of --local): {busy}; "
            "leave out --coordinator-port for a free one"
        )
    return port


def log_dir(given: str | Path | None) -> Path:
    """The local log dir: the given one, $MULTIHOST_LOG_DIR or ~/multihost-logs."""
    return Path(given or default_log_dir()).expanduser()


def check_log_dir(logs: Path) -> None:
    """The log dir must be (or become) a writable directory; nothing is created here."""
    existing = logs
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise UsageError(f"log dir {logs}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"log dir {logs}: {existing} is not writable")


def check_code_dir(root: Path, excludes: tuple[str, ...], max_bytes: int | None) -> None:
    """A code dir to stage: a directory (not / or home), within ``max_bytes`` if given."""
    from multihost.staging.archive import check_stage_root, list_files

    if not root.is_dir():
        raise SettingError(f"script dir {root} does not exist or is not a directory")
    if max_bytes is None:
        check_stage_root(root)
    else:
        list_files(root, excludes, max_bytes)  # refuse early, naming the biggest paths
