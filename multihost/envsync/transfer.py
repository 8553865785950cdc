"""How a packed environment reaches the hosts that lack it other than from the runner
(:mod:`.phase`): ``--stage-via peer`` (the source serves it on its private address, the others
fetch it) and ``--stage-via gs://…`` (the source puts it in the bucket once, or a pack already
there is taken, and each host fetches it with its own gcloud). Each returns the hosts whose
fetch failed; the runner then sends them the pack itself."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets

from multihost.envsync.probe import PROBE_TIMEOUT, EnvSummary, Probe, base_of, last_lines
from multihost.envsync.run import EnvRun
from multihost.errors import CloudError, HostError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.envsync import INSTALL, SERVE, UPLOAD
from multihost.remote.staging import SEED_STOP, python_source
from multihost.staging import via as stagevia
from multihost.transport.fanout import map_hosts

_PACK_NAME = re.compile(r"/[0-9a-f]{64}\.tar\.gz$")  # a pack in the bucket, by content


async def from_peer(
    sup: EnvRun,
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
        paths={"b": base_of(sup, source)},
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
            f"{source.host.name}: cannot serve the environment ({rest or last_lines(res.stderr)});"
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
            paths={"b": base_of(sup, p)},
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
            why.setdefault(host.process_id, f"{host.name}: {last_lines(done.stderr, 1)}")
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


async def from_bucket(
    sup: EnvRun,
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
        res = await conn.run(script(UPLOAD, paths={"b": base_of(sup, source)}, key=key, url=url))
        if res.exit_status != 0:
            sup.note(
                f"{source.host.name}: cannot put the environment in {bucket} "
                f"({last_lines(res.stderr)}); the runner sends it",
                "warning",
            )
            return need
        summary.uploaded.append(bucket)
    return await _fetch_bucket(sup, need, key, digest, url, bucket, summary, errors)


async def cached(
    sup: EnvRun,
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
    sup: EnvRun,
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
            paths={"b": base_of(sup, p)},
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
                f"({last_lines(done.stderr)}); the runner sends it",
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
