"""The environment phase of a run's preparation, after the code is on every host.

1. Every host reports its key and what it has (``env_probe.py``, one command per host).
2. A host whose Python does not satisfy ``requires-python``: exit 2 naming it, nothing started.
3. Per key some host lacks: the source is a host that has it complete (it packs it once), or
   else the first host that lacks it builds it with uv. A builder without uv gets the runner's
   binary when it runs there (machine, C library: :mod:`.uvbin`), else fetches
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
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from multihost.envsync.probe import (
    PROBE_TIMEOUT,
    EnvSummary,
    Probe,
    RunnerUv,
    base_of,
    last_lines,
    pack_format,
    probe_said,
    probe_script,
    runner_uv,
)
from multihost.envsync.request import EnvRequest, lock_problem, satisfies
from multihost.envsync.run import EnvRun
from multihost.envsync.transfer import cached, from_bucket, from_peer
from multihost.errors import EnvFailed, HostError, RemoteError, StaleLock, UsageError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.envsync import BUILD, INSTALL, LOCK_CHECK, PACK
from multihost.remote.staging import python_source
from multihost.staging import via as stagevia
from multihost.transport import Completed
from multihost.transport.fanout import Outcome, map_hosts


async def sync_environment(
    sup: EnvRun,
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


async def _check_lock(sup: EnvRun, probes: Sequence[Probe], req: EnvRequest) -> None:
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
        LOCK_CHECK,
        paths={"b": base_of(sup, checker), "code": sup.paths(host).code},
        exe=checker.exe,
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
            f"{host.name}: cannot check uv.lock against pyproject.toml: {last_lines(done.stderr)}",
            "warning",
        )


async def _one_key(
    sup: EnvRun,
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
        need = await cached(sup, need, key, requested.url, summary, errors)
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
                script(PACK, paths={"b": base_of(sup, source)}, key=key, fmt=fmt),
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
        need = await from_peer(sup, source, need, key, fmt, digest, summary, errors)
    elif via.kind == "gs":
        need = await from_bucket(sup, source, need, key, digest, via.url, summary, errors)
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
            paths={"b": base_of(sup, p)},
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
            raise EnvFailed(host, f"environment install failed: {last_lines(res.stderr)}")
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


async def _build(sup: EnvRun, p: Probe, key: str, fmt: str, uv: RunnerUv, req: EnvRequest) -> str:
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
        paths={"b": base_of(sup, p), "code": code},
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
            f"uv.lock does not match pyproject.toml: {last_lines(res.stderr, 6)}",
            res.stderr.decode(errors="replace"),
        )
    if res.exit_status != 0:
        raise EnvFailed(p.host, f"environment build failed: {last_lines(res.stderr, 6)}")
    return res.stdout.decode(errors="replace")


async def _run(sup: EnvRun, host: Host, command: str, what: str) -> str:
    conn = sup.slots[host.process_id].conn
    assert conn is not None
    res = await conn.run(command)
    if res.exit_status != 0:
        raise EnvFailed(host, f"{what} failed: {last_lines(res.stderr)}")
    return res.stdout.decode(errors="replace")


def _packed(sup: EnvRun, host: Host, said: str) -> tuple[int, str]:
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
