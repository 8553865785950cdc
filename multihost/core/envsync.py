"""The environment phase of a run's preparation, after the code is on every host.

1. Every host reports its key and what it has (``env_probe.py``, one command per host).
2. A host whose Python does not satisfy ``requires-python``: exit 2 naming it, nothing started.
3. Per key some host lacks: the source is a host that has it complete (it packs it once), or
   else the first host that lacks it builds it with uv. A builder without uv gets the runner's
   binary when it runs there (machine, C library: ``envsync.uvbin``), else fetches
   ``uv==<the runner's version>`` itself with its own pip (``--host-uv fetch``: always). Only
   the builder talks to the package index; the others only unpack (tar, sha256sum), no uv.
4. The packed environment goes from the source to every other host that lacks it, checked by
   sha256 before it is unpacked (atomically; a damaged one is replaced). It is zstd when every
   host of the transfer has zstd and no bucket may carry it (:func:`pack_format`), else gzip.
5. Each host's command then sees ``MULTIHOST_ENV`` (the job script puts its ``bin`` first on
   PATH and sets VIRTUAL_ENV).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multihost import stagevia
from multihost.core.supervisor import Supervisor
from multihost.defaults import DEFAULTS
from multihost.envsync import EnvRequest, lock_problem, satisfies, uv_binary, uv_version
from multihost.envsync.uvbin import Binary, inspect
from multihost.errors import CloudError, EnvFailed, HostError, RemoteError, StaleLock, UsageError
from multihost.fanout import Outcome, map_hosts
from multihost.model import Host
from multihost.remote import script
from multihost.remote.envsync import BUILD, INSTALL, LOCK_CHECK, PACK, PROBE, SERVE, UPLOAD
from multihost.remote.staging import SEED_STOP, python_source
from multihost.transport import Completed

_PACK_NAME = re.compile(r"/[0-9a-f]{64}\.tar\.gz$")  # a pack in the bucket, by content
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


def probe_script(sup: Supervisor, host: Host, req: EnvRequest, uv: RunnerUv) -> str:
    """What ``host`` runs to say its key and what it has (remote.envsync.PROBE)."""
    where = sup.paths(host)
    return script(
        PROBE,
        paths={"b": where.base, "r": where.run},
        lock=req.lock_hash,
        ruv=uv.version,
        probe=python_source("env_probe"),
    )


def probe_said(host: Host, done: Completed) -> Probe:
    """What ``host``'s probe (:func:`probe_script`) said, or the RemoteError of its failure."""
    if done.exit_status != 0:
        raise RemoteError(host, f"environment check failed: {_said(done.stderr)}")
    return Probe.parse(host, done.stdout.decode(errors="replace").strip())


async def sync_environment(
    sup: Supervisor,
    req: EnvRequest,
    uv: RunnerUv | None = None,
    checked: Mapping[int, Completed] | None = None,
) -> list[Outcome[None]]:
    """The environment ``req`` on every host of ``sup``; per host whether it is there.
    ``checked``: the probes that ran already (on the staging's channel: prepare), by process
    id, run with ``uv``; the other hosts are probed here."""
    uv = uv or await runner_uv(sup.options.host_uv)
    checked = checked or {}

    async def probe(host: Host) -> Probe:
        if (done := checked.get(host.process_id)) is None:
            conn = sup.slots[host.process_id].conn
            assert conn is not None
            done = await conn.run(probe_script(sup, host, req, uv))
        return probe_said(host, done)

    probed = await sup.phase(probe, None, PROBE_TIMEOUT, "environment check")
    if not all(o.ok for o in probed) or sup.interrupted:
        return [Outcome(o.host, error=o.error) for o in probed]
    probes = [o.value for o in probed if o.value is not None]
    if req.requires_python:
        bad = [p for p in probes if not satisfies(p.python, req.requires_python)]
        if bad:
            p = bad[0]
            more = f" (and {len(bad) - 1} more host(s))" if len(bad) > 1 else ""
            raise UsageError(
                f"{p.host.name} ({p.host.target}): Python {p.python} ({p.exe}) does not "
                f"satisfy requires-python {req.requires_python}{more}; nothing started"
            )
    if uv.path is None and not req.requirements:  # this machine could not check the lock
        await _check_lock(sup, probes, req)
    summary = EnvSummary()
    errors: dict[int, HostError] = {}
    keys: dict[str, list[Probe]] = {}
    for p in probes:
        keys.setdefault(p.key, []).append(p)
    async with asyncio.TaskGroup() as tg:
        for members in keys.values():
            tg.create_task(_one_key(sup, members, uv, req, summary, errors))
    stale = next((e for e in errors.values() if isinstance(e, StaleLock)), None)
    if stale is not None:  # the lock is the run's, not the host's: bad input (exit 2)
        raise lock_problem(
            req.lock or "uv.lock",
            stale.stderr,
            f"; checked on the builder {stale.host.name} ({stale.host.target})",
        )
    for p in probes:
        sup.extra_env[p.host.process_id] = {"MULTIHOST_ENV": f"{p.envs}/{p.key}"}
    done = [h for h in summary.built]
    said = f"{req.header}: key {probes[0].key[:12]}"
    if len(keys) > 1:
        said += f" (+{len(keys) - 1} more key(s))"
    if done:
        said += f"; built on {', '.join(done)}"
    if summary.fetched:
        said += f" (uv {uv.version} fetched there with pip)"
    if summary.installed:
        said += f"; installed on {summary.installed} host(s)"
    if summary.repaired:
        said += f" ({summary.repaired} repaired)"
    if summary.installed and summary.via:
        said += f" via {summary.via}"
    if summary.gzip:
        said += f"; packed with gzip: {summary.gzip}"
    if summary.uploaded:
        said += f"; uploaded once to {', '.join(sorted(set(summary.uploaded)))}"
    if summary.present:
        said += f"; present on {summary.present} host(s)"
    sup.env_bytes += summary.runner_bytes
    if sup.env_bytes:
        said += f"; the runner sent {sup.env_bytes / (1 << 20):.1f} MiB"
    sup.note(said)
    return [Outcome(p.host, error=errors.get(p.host.process_id)) for p in probes]


async def _check_lock(sup: Supervisor, probes: Sequence[Probe], req: EnvRequest) -> None:
    """uv.lock against pyproject.toml on a host with uv, for a runner without one: a warm run
    builds nothing (the key is the lock's), so no builder would check it. A lock out of date
    is bad input (exit 2, nothing started)."""
    checker = next((p for p in probes if p.has_uv), None)
    if checker is None:
        if any(p.state == "present" for p in probes):
            sup.note(
                "uv.lock not checked against pyproject.toml: no uv here nor on any host "
                "(a host that builds checks it)",
                "warning",
            )
        return
    host = checker.host
    conn = sup.slots[host.process_id].conn
    assert conn is not None
    command = script(
        LOCK_CHECK, paths={"b": _base(sup, checker), "code": sup.paths(host).code}, exe=checker.exe
    )
    done = await conn.run(command)
    if done.exit_status == 5:
        raise lock_problem(
            req.lock or "uv.lock",
            done.stderr.decode(errors="replace"),
            f"; checked on {host.name} ({host.target})",
        )
    if done.exit_status != 0:
        sup.note(
            f"{host.name}: cannot check uv.lock against pyproject.toml: {_said(done.stderr)}",
            "warning",
        )


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


async def _one_key(
    sup: Supervisor,
    members: Sequence[Probe],
    uv: RunnerUv,
    req: EnvRequest,
    summary: EnvSummary,
    errors: dict[int, HostError],
) -> None:
    """One key: find or build it on one host, then install it on the others that lack it."""
    have = [p for p in members if p.state == "present"]
    need = [p for p in members if p.state != "present"]
    summary.present += len(have)
    if not need:
        return
    key = members[0].key
    requested = stagevia.parse(sup.options.stage_via)
    if not have and requested.kind == "gs":
        need = await _cached(sup, need, key, requested.url, summary, errors)
        if not need:
            return
    bucket = requested.kind == "gs" or (requested.kind == "auto" and bool(sup.options.stage_bucket))
    source = have[0] if have else need[0]
    takers = need if have else need[1:]
    fmt, why = pack_format(source, takers, bucket)
    summary.gzip = summary.gzip or why
    try:
        if have:
            packed = await _run(
                sup,
                source.host,
                script(PACK, paths={"b": _base(sup, source)}, key=key, fmt=fmt),
                "environment pack",
            )
        else:
            need = takers
            packed = await _build(sup, source, key, fmt, uv, req)
            summary.built.append(f"{source.host.name} ({source.host.target})")
            if not source.has_uv and not uv.ships_to(source):
                summary.fetched.append(f"{source.host.name}")
            summary.repaired += source.state == "damaged"
    except HostError as exc:
        errors[exc.host.process_id] = exc
        for p in need:
            if p.host.process_id != exc.host.process_id:
                kind = EnvFailed if isinstance(exc, EnvFailed) else RemoteError
                errors[p.host.process_id] = kind(
                    p.host, f"no environment: {exc.host.name} could not provide it"
                )
        return
    if not need:
        return
    size, digest = _packed(sup, source.host, packed)
    conn = sup.slots[source.host.process_id].conn
    assert conn is not None
    via, why = stagevia.choose_environment(
        stagevia.parse(sup.options.stage_via),
        len(need),
        size,
        threshold=stagevia.auto_threshold(),
        source=source.host,
        address=stagevia.bind_address(source.host, conn),
        bucket=sup.options.stage_bucket,
    )
    if why:
        summary.via = f"{via} ({why})"
    if via.kind == "peer":
        need = await _from_peer(sup, source, need, key, fmt, digest, summary, errors)
    elif via.kind == "gs":
        need = await _from_bucket(sup, source, need, key, digest, via.url, summary, errors)
    if not need:
        return
    data = bytearray()
    await conn.fetch(f"{source.envs}/{key}.tar.{fmt}", data.extend)
    if len(data) != size:
        raise RemoteError(source.host, f"environment archive: got {len(data)} of {size} bytes")
    archive = bytes(data)
    got = await asyncio.to_thread(lambda: hashlib.sha256(archive).hexdigest())
    if got != digest:  # changed on its host since it was packed: not handed on
        raise RemoteError(
            source.host,
            f"environment archive: sha256 {got} is not the {digest} "
            "it was packed with; nothing sent",
        )

    async def install(host: Host) -> None:
        p = next(m for m in need if m.host is host)
        c = sup.slots[host.process_id].conn
        assert c is not None
        command = script(
            INSTALL,
            paths={"b": _base(sup, p)},
            key=key,
            fmt=fmt,
            digest=digest,
            how="stdin",
            url="",
            fetch="",
            timeout=0,
        )
        res, _sent = await c.offer(command, b"absent", archive)
        if res.exit_status != 0:
            raise EnvFailed(host, f"environment install failed: {_said(res.stderr)}")
        summary.installed += 1
        summary.repaired += p.state == "damaged"
        summary.runner_bytes += len(archive)

    outcomes = await map_hosts(
        install,
        [p.host for p in need],
        timeout=sup.options.stage_timeout,
        what="environment install",
    )
    for o in outcomes:
        if o.error is not None:
            errors[o.host.process_id] = o.error


async def _from_peer(
    sup: Supervisor,
    source: Probe,
    need: list[Probe],
    key: str,
    fmt: str,
    digest: str,
    summary: EnvSummary,
    errors: dict[int, HostError],
) -> list[Probe]:
    """``--stage-via peer``: the source serves the pack to the others (token on stdin); returns
    the hosts whose fetch failed (the runner then sends them the pack itself). A host lost
    meanwhile (or whose fetch timed out) goes into ``errors``."""
    conn = sup.slots[source.host.process_id].conn
    assert conn is not None
    addr = stagevia.bind_address(source.host, conn)
    if not stagevia.private_address(addr):  # never a seed on a public address
        sup.note(
            f"{source.host.name}: its internal address {addr or '?'} is not private, so it "
            "serves no environment there: the runner sends it",
            "warning",
        )
        return need
    token = secrets.token_urlsafe(32)
    lifetime = sup.options.stage_timeout + stagevia.FETCH_TIMEOUT
    command = script(
        SERVE,
        paths={"b": _base(sup, source)},
        key=key,
        fmt=fmt,
        serve=python_source("seed_serve"),
        addr=addr,
        lifetime=f"{lifetime:g}",
        fetches=len(need),
        name=f"/{digest}.tar.{fmt}",
    )
    res = await conn.run(command, stdin=(token + "\n").encode())
    word, _, rest = res.stdout.decode(errors="replace").strip().partition(" ")
    if res.exit_status != 0 or word != "serving":
        sup.note(
            f"{source.host.name}: cannot serve the environment ({rest or _said(res.stderr)});"
            " the runner sends it",
            "warning",
        )
        return need
    port, pid, folder = rest.split(" ", 2)
    host_part = f"[{addr}]" if ":" in addr else addr
    url = f"http://{host_part}:{port}/{digest}.tar.{fmt}"
    failed: list[Probe] = []
    why: dict[int, str] = {}

    async def fetch(host: Host) -> None:
        p = next(m for m in need if m.host is host)
        c = sup.slots[host.process_id].conn
        assert c is not None
        text = script(
            INSTALL,
            paths={"b": _base(sup, p)},
            key=key,
            fmt=fmt,
            digest=digest,
            how="peer",
            url=url,
            fetch=python_source("seed_fetch"),
            timeout=f"{stagevia.FETCH_TIMEOUT:g}",
        )
        done = await c.run(text, stdin=(token + "\n").encode())
        if done.exit_status != 0:
            failed.append(p)
            why.setdefault(host.process_id, f"{host.name}: {_said(done.stderr, 1)}")
            return
        summary.installed += 1
        summary.repaired += p.state == "damaged"

    try:
        fetched = await map_hosts(
            fetch,
            [p.host for p in need],
            timeout=sup.options.stage_timeout,
            what="environment fetch",
        )
        errors.update({o.host.process_id: o.error for o in fetched if o.error is not None})
    finally:
        with contextlib.suppress(HostError, TimeoutError):
            async with asyncio.timeout(PROBE_TIMEOUT):
                await conn.run(script(SEED_STOP, p=pid, s=folder))
    done = {p.host.process_id for p in failed}
    if failed:
        first = why.get(failed[0].host.process_id, "")
        sup.note(
            f"{len(failed)} host(s) get the environment from the runner after a failed "
            f"fetch; first: {first}",
            "warning",
        )
    return [p for p in need if p.host.process_id in done]


async def _from_bucket(
    sup: Supervisor,
    source: Probe,
    need: list[Probe],
    key: str,
    digest: str,
    bucket: str,
    summary: EnvSummary,
    errors: dict[int, HostError],
) -> list[Probe]:
    """``--stage-via gs://…``: the source puts the pack in the bucket under its content name
    (unless it is there), the others take it from there; returns the hosts whose fetch failed
    (the runner then sends them the pack itself); a host lost meanwhile goes into ``errors``."""
    from multihost.cloud.bucket import env_url  # a bucket named: the cloud modules

    url = env_url(bucket, key, digest)
    try:
        there = await asyncio.to_thread(stagevia.in_bucket, url)
    except CloudError as exc:
        sup.note(f"--stage-via {bucket}: {exc}; the runner sends the environment", "warning")
        return need
    if there:
        sup.note(f"environment {key[:12]} is already in {bucket}: nothing to upload", "info")
    else:
        conn = sup.slots[source.host.process_id].conn
        assert conn is not None
        res = await conn.run(script(UPLOAD, paths={"b": _base(sup, source)}, key=key, url=url))
        if res.exit_status != 0:
            sup.note(
                f"{source.host.name}: cannot put the environment in {bucket} "
                f"({_said(res.stderr)}); the runner sends it",
                "warning",
            )
            return need
        summary.uploaded.append(bucket)
    return await _fetch_bucket(sup, need, key, digest, url, bucket, summary, errors)


async def _cached(
    sup: Supervisor,
    need: list[Probe],
    key: str,
    bucket: str,
    summary: EnvSummary,
    errors: dict[int, HostError],
) -> list[Probe]:
    """``--stage-via gs://…`` and no host has ``key``: a pack of it already in the bucket (a
    job's, an earlier run's) is taken from there and nothing is built; returns the hosts still
    without it."""
    from multihost.cloud.bucket import env_prefix

    try:
        found = await asyncio.to_thread(stagevia.listed, env_prefix(bucket, key))
    except CloudError:
        return need  # the build's upload says what is wrong with the bucket
    packs = sorted(u for u in found if _PACK_NAME.search(u))
    if not packs:
        return need
    digest = packs[0].rsplit("/", 1)[1].removesuffix(".tar.gz")
    sup.note(f"environment {key[:12]} found in {bucket}: taken from there, nothing built", "info")
    return await _fetch_bucket(sup, need, key, digest, packs[0], bucket, summary, errors)


async def _fetch_bucket(
    sup: Supervisor,
    need: list[Probe],
    key: str,
    digest: str,
    url: str,
    bucket: str,
    summary: EnvSummary,
    errors: dict[int, HostError],
) -> list[Probe]:
    """Each host of ``need`` takes the pack ``url`` (sha256 ``digest``) with its own gcloud;
    returns those whose fetch failed; a host lost meanwhile goes into ``errors``."""
    failed: list[Probe] = []

    async def fetch(host: Host) -> None:
        p = next(m for m in need if m.host is host)
        c = sup.slots[host.process_id].conn
        assert c is not None
        text = script(
            INSTALL,
            paths={"b": _base(sup, p)},
            key=key,
            fmt="gz",
            digest=digest,
            how="gs",
            url=url,
            fetch="",
            timeout=0,
        )
        done = await c.run(text)
        if done.exit_status != 0:
            sup.note(
                f"{host.name}: environment fetch from {bucket} failed "
                f"({_said(done.stderr)}); the runner sends it",
                "warning",
            )
            failed.append(p)
            return
        summary.installed += 1
        summary.repaired += p.state == "damaged"

    fetched = await map_hosts(
        fetch, [p.host for p in need], timeout=sup.options.stage_timeout, what="environment fetch"
    )
    errors.update({o.host.process_id: o.error for o in fetched if o.error is not None})
    done = {p.host.process_id for p in failed}
    return [p for p in need if p.host.process_id in done]


async def _build(
    sup: Supervisor, p: Probe, key: str, fmt: str, uv: RunnerUv, req: EnvRequest
) -> str:
    """Build ``key`` on ``p``'s host with uv: its own, else the runner's when that runs there
    (shipped), else fetched there with its own pip (``uv==`` the runner's version); packed in
    ``fmt``."""
    stdin = req.requirements
    ship = 0 if p.has_uv else 1 if uv.ships_to(p) else 2
    if ship == 1:
        assert uv.path is not None
        binary = await asyncio.to_thread(Path(uv.path).read_bytes)
        sup.env_bytes += len(binary)
        stdin += binary
    code = sup.paths(p.host).code
    command = script(
        BUILD,
        paths={"b": _base(sup, p), "code": code},
        key=key,
        fmt=fmt,
        exe=p.exe,
        sel=" ".join(req.selection.flags()),
        req=len(req.requirements),
        ship=ship,
        uvv=uv.version,
        unwheel=python_source("uv_wheel"),
    )
    conn = sup.slots[p.host.process_id].conn
    assert conn is not None
    res = await conn.run(command, stdin=stdin or None)
    if res.exit_status == 5:
        raise StaleLock(
            p.host,
            f"uv.lock does not match pyproject.toml: {_said(res.stderr, 6)}",
            res.stderr.decode(errors="replace"),
        )
    if res.exit_status != 0:
        raise EnvFailed(p.host, f"environment build failed: {_said(res.stderr, 6)}")
    return res.stdout.decode(errors="replace")


async def _run(sup: Supervisor, host: Host, command: str, what: str) -> str:
    conn = sup.slots[host.process_id].conn
    assert conn is not None
    res = await conn.run(command)
    if res.exit_status != 0:
        raise EnvFailed(host, f"{what} failed: {_said(res.stderr)}")
    return res.stdout.decode(errors="replace")


def _packed(sup: Supervisor, host: Host, said: str) -> tuple[int, str]:
    """The pack's size and sha256 from PACK's words; a kept pack that was packed again because
    it no longer matched its sha256 is said as a warning."""
    for line in said.splitlines():
        if line.startswith("repacked: "):
            sup.note(
                f"{host.name}: {line.removeprefix('repacked: ')}: packed again from the "
                "environment, the altered pack was not handed on",
                "warning",
            )
        if line.startswith("packed "):
            _, size, digest = line.split()
            return int(size), digest
    raise RemoteError(host, f"environment pack said {said.strip()[-200:]!r}")


def _base(sup: Supervisor, p: Probe) -> str:
    return sup.paths(p.host).base


def _said(data: bytes, lines: int = 3) -> str:
    """A command's last non-empty error lines, joined."""
    kept = [ln.strip() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return "; ".join(kept[-lines:]) or "no error output"
