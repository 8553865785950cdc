"""What the environment phase (:mod:`.phase`) knows of each host and of the
runner: a host's probe (its key, what it has, its Python, uv, zstd) and the script that asks
for it, the runner's uv, the phase's summary, the pack's format, and the small helpers the
phase's modules share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from multihost.defaults import DEFAULTS
from multihost.envsync.request import EnvRequest
from multihost.envsync.run import EnvRun
from multihost.envsync.uvbin import Binary, inspect, uv_binary, uv_version
from multihost.errors import RemoteError
from multihost.model import Host
from multihost.remote import sourced
from multihost.remote.envsync import PROBE
from multihost.transport import Completed

PROBE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Probe:
    """What one host said about its environment."""

    host: Host
    key: str
    state: str  # present, absent, damaged
    python: str
    exe: str
    machine: str
    envs: str
    has_uv: bool
    os: str = "linux"  # sys.platform
    libc: str = ""  # glibc-2.35; anything else is not glibc
    zstd: bool = False  # an executable zstd on its PATH

    @classmethod
    def parse(cls, host: Host, line: str) -> Probe:
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        try:
            return cls(
                host,
                words["key"],
                words["state"],
                words["python"],
                words["exe"],
                words["machine"],
                words["envs"],
                words["uv"] == "host",
                words.get("os", "linux"),
                words.get("libc", ""),
                words.get("zstd") == "yes",
            )
        except KeyError:
            raise RemoteError(host, f"environment check said {line!r}") from None


@dataclass(frozen=True)
class RunnerUv:
    """The uv a host without one gets: the runner's binary (when it has one and it fits the
    host), or ``version`` fetched by the builder with its own pip."""

    path: str | None
    version: str  # the runner's, else DEFAULTS.uv_version: part of every uv-less host's key
    binary: Binary
    fetch: bool  # --host-uv fetch: never ship it

    def ships_to(self, p: Probe) -> bool:
        """Whether the runner's binary runs on ``p``'s host (else the builder fetches uv)."""
        return (
            not self.fetch and self.path is not None and self.binary.fits(p.os, p.machine, p.libc)
        )


async def runner_uv(host_uv: str) -> RunnerUv:
    """The runner's uv: where, which version, what it runs on."""
    path = uv_binary()
    version = (await asyncio.to_thread(uv_version, path)) if path else ""
    binary = await asyncio.to_thread(inspect, path) if path else Binary("unknown", "")
    return RunnerUv(path, version or DEFAULTS.uv_version, binary, host_uv == "fetch")


@dataclass
class EnvSummary:
    """What the phase did: built on, sent to, repaired, present."""

    built: list[str] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)  # builders that fetched uv with pip
    installed: int = 0
    repaired: int = 0
    present: int = 0
    runner_bytes: int = 0
    uploaded: list[str] = field(default_factory=list)  # the buckets a pack was put in
    via: str = ""  # how auto staged the pack, and why ("" when asked for)
    gzip: str = ""  # why a pack was gzip though some of its hosts have zstd ("": none was)


def probe_script(sup: EnvRun, host: Host, req: EnvRequest, uv: RunnerUv) -> str:
    """What ``host`` runs to say its key and what it has (remote.envsync.PROBE)."""
    where = sup.paths(host)  # the run's channel checked the kit first (commands.Kit)
    return sourced(
        PROBE,
        where.kit,
        paths={"b": where.base, "r": where.run, "k": where.kit},
        lock=req.lock_hash,
        ruv=uv.version,
    )


def probe_said(host: Host, done: Completed) -> Probe:
    """What ``host``'s probe (:func:`probe_script`) said, or the RemoteError of its failure."""
    if done.exit_status != 0:
        raise RemoteError(host, f"environment check failed: {last_lines(done.stderr)}")
    return Probe.parse(host, done.stdout.decode(errors="replace").strip())


def pack_format(source: Probe, takers: Sequence[Probe], bucket: bool) -> tuple[str, str]:
    """The pack's format for a transfer from ``source`` to ``takers`` (``zst`` or ``gz``, its
    suffix), and why gzip when some of them have zstd (else ``""``). zstd only when every one
    of them has it, and never when the pack may go through a bucket (``bucket``: whoever takes
    it from there was not probed)."""
    hosts = [source, *takers]
    lacking = [p for p in hosts if not p.zstd]
    if not lacking and not bucket:
        return "zst", ""
    if len(lacking) == len(hosts):
        return "gz", ""
    if bucket:
        return "gz", "the pack may go through a bucket"
    more = f" (and {len(lacking) - 1} more host(s))" if len(lacking) > 1 else ""
    return "gz", f"no zstd on {lacking[0].host.name}{more}"


def base_of(sup: EnvRun, p: Probe) -> str:
    """The base directory of ``p``'s host."""
    return sup.paths(p.host).base


def last_lines(data: bytes, lines: int = 3) -> str:
    """A command's last non-empty error lines, joined."""
    kept = [ln.strip() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return "; ".join(kept[-lines:]) or "no error output"
