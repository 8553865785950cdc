"""What each host holds of the locked environments (``multihost envs``), and pruning the ones
no run uses (``multihost clean``).

A run uses an environment from the moment its hosts report their key: each host writes the key
into the run's claimed directory (``envkey``), and the run's ``job.sh`` names it
(``MULTIHOST_ENV``). So "uses" is known on the host itself, from the run directories it still
has, whichever runner started them; a run still preparing or running has no ``exit`` file yet.
Every use stamps ``<base>/envs/<key>.used``: that is an environment's last use. Pruning removes
an environment that no remaining run directory names and that was last used more than the
given age ago, under an exclusive lock that a run's key report takes shared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from multihost.defaults import DEFAULTS
from multihost.errors import RemoteError
from multihost.model import Fleet, Host
from multihost.remote import script
from multihost.remote.envsync import STORE
from multihost.remote.staging import python_source
from multihost.transport import Connection, SSHOptions
from multihost.transport.fanout import Outcome, on_every_host

MODES = ("list", "prune", "dry")


@dataclass(frozen=True)
class EnvUser:
    """A run directory on the host that names the environment."""

    run: str
    running: bool  # no exit file yet: preparing or running


@dataclass(frozen=True)
class HeldEnv:
    """One environment under ``<base>/envs`` of one host."""

    key: str
    state: str  # complete, damaged, missing (only its archive is left), partial (a build dir)
    size: int  # bytes of the environment's files
    packed: int  # bytes of its kept archive
    last_used: float | None  # host clock
    age: float | None  # seconds since its last use, by the host's own clock
    runs: tuple[EnvUser, ...]

    @property
    def short(self) -> str:
        return self.key[:12]

    @property
    def bytes(self) -> int:
        """What removing it frees."""
        return self.size + self.packed


@dataclass(frozen=True)
class EnvStore:
    """What one host holds, and what a prune removed (or, dry, would remove)."""

    envs: tuple[HeldEnv, ...]
    removed: tuple[str, ...] = ()

    @property
    def freed(self) -> int:
        gone = set(self.removed)
        return sum(e.bytes for e in self.envs if e.key in gone)


def store_command(base: str, mode: str = "list", age: float = 0.0, gone: Iterable[str] = ()) -> str:
    """List ``base/envs``; ``prune``: also remove the unused ones last used over ``age`` s ago;
    ``dry``: say which ``prune`` would remove. ``gone``: run names to count as removed."""
    if mode not in MODES:
        raise ValueError(f"not a mode: {mode!r}")
    return script(
        STORE,
        paths={"b": base},
        mode=mode,
        age=f"{max(age, 0.0):g}",
        gone="\n".join(gone),
        store=python_source("env_store"),
        probe=python_source("env_probe"),
    )


def parse_store(host: Host, text: str) -> EnvStore:
    """The store script's JSON object as typed records."""
    try:
        data = json.loads(text)
        now = float(data["now"])
        envs = tuple(
            HeldEnv(
                key=str(e["key"]),
                state=str(e["state"]),
                size=int(e["bytes"]),
                packed=int(e["packed"]),
                last_used=None if e["used"] is None else float(e["used"]),
                age=None if e["used"] is None else max(0.0, now - float(e["used"])),
                runs=tuple(EnvUser(str(r), bool(running)) for r, running in e["runs"]),
            )
            for e in data["envs"]
        )
        return EnvStore(envs, tuple(str(k) for k in data["removed"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteError(
            host, f"environment listing said {text.strip()[-200:]!r} ({exc})"
        ) from None


async def store_on(
    conn: Connection, base: str, mode: str = "list", age: float = 0.0, gone: Iterable[str] = ()
) -> EnvStore:
    """Run the store script on one host."""
    res = await conn.run(store_command(base, mode, age, gone))
    if res.exit_status != 0:
        err = res.stderr.decode(errors="replace").strip()
        raise RemoteError(conn.host, f"environment listing failed: {err or res.exit_status}")
    return parse_store(conn.host, res.stdout.decode(errors="replace"))


async def held_envs(
    fleet: Fleet, ssh: SSHOptions, base: str, *, limit: int = DEFAULTS.connect_limit
) -> list[Outcome[EnvStore]]:
    """``multihost envs``: per host, what it holds (``base``: where a host without its own
    ``remote_dir`` keeps them)."""
    return await on_every_host(
        fleet, ssh, lambda conn: store_on(conn, conn.host.remote_dir or base), limit=limit
    )
