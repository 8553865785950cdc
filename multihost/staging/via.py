"""``--stage-via``: the code leaves the runner once, through one seed per slice or a bucket.

- ``auto`` (the default): :func:`choose` picks ``direct`` or ``peer`` for the run, or the
  bucket of ``--stage-bucket`` when one is given, and says why.
- ``direct``: the runner sends the archive to every host (``stage.stage``).
- ``peer``: per slice, the runner sends the archive to one seed (the slice's first host). The
  seed unpacks it and serves it, for a bounded time, on its internal address (the one the
  JAX coordinator uses) to holders of a random token; the slice's other hosts fetch it there.
  A seed whose address is not private (:func:`private_address`) serves nothing: its slice is
  staged directly, and the run says so.
  One seed per slice, not ⌈√N⌉: slices are where the fast internal network is, and the
  runner's link carries the archive once per slice. When the seed had the code already, its
  slice is staged directly (what a host already has costs nothing).
- ``gs://BUCKET[/PREFIX]``: the runner uploads the archive once to
  ``…/multihost/code/<sha256>.tar.gz`` (the layout of ``multihost.cloud.bucket``; skipped
  when that object is there), and every host pulls it with ``gcloud storage cp``.

Every fetching host checks the archive's sha256 against the content hash before unpacking; a
host whose fetch fails for any reason (no server, refused, a wrong hash, no bucket access) gets
the archive from the runner instead, and the run's
:class:`~multihost.results.records.Staging` says so.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from multihost.errors import CloudError, HostError, RemoteError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.commands import COMPLETE, Paths, stage_command
from multihost.remote.staging import FETCH, SEED, SEED_STOP, python_source
from multihost.results.records import Staging
from multihost.staging.archive import Archive, _cause, stage
from multihost.staging.choice import AUTO_THRESHOLD as AUTO_THRESHOLD
from multihost.staging.choice import THRESHOLD_ENV as THRESHOLD_ENV
from multihost.staging.choice import StageVia as StageVia
from multihost.staging.choice import auto_threshold as auto_threshold
from multihost.staging.choice import choose as choose
from multihost.staging.choice import choose_environment as choose_environment
from multihost.staging.choice import parse as parse
from multihost.staging.choice import private_address as private_address
from multihost.transport import Connection
from multihost.transport.fanout import Outcome, map_hosts

FETCH_TIMEOUT = 30.0  # s a fetching host waits on a silent seed before it falls back
Note = Callable[[str, str], None]


def listed(prefix: str) -> list[str]:
    """The objects directly under ``prefix`` (``gs://…/``); raises ``CloudError``."""
    from multihost.cloud.gcloud import Gcloud

    return list(Gcloud.from_env().objects(prefix.rstrip("/")))


def in_bucket(url: str) -> bool:
    """Whether the object ``url`` is there (content-named: then it need not go up again);
    raises ``CloudError`` when the bucket cannot be read."""
    from multihost.cloud.gcloud import Gcloud

    return url in Gcloud.from_env().existing(url)


def bind_address(host: Host, conn: Connection) -> str:
    """The address a seed serves on: the one its peers use (inventory ``internal_address``, a
    TPU worker's internal IP), else the one SSH reached; never a wildcard."""
    return host.internal_address or conn.peer_address


@dataclass(frozen=True)
class Staged:
    """How one host got the code, and the archive bytes the runner sent it."""

    how: Literal["sent", "fetched", "present", "fallback"]
    sent: int = 0
    why: str = ""  # fallback: why its fetch failed


def summarize(
    via: StageVia,
    archive: Archive,
    staged: Sequence[Staged],
    runner_bytes: int,
    uploads: int = 0,
    why: str = "",
) -> Staging:
    """The run's staging summary; ``uploads``: archive uploads outside the hosts (a bucket);
    ``why``: why ``auto`` chose ``via``."""
    return Staging(
        via=str(via),
        why=why,
        archive_bytes=len(archive.data),
        runner_bytes=runner_bytes,
        uploads=uploads + sum(1 for s in staged if s.sent),
        fetched=sum(1 for s in staged if s.how == "fetched"),
        present=sum(1 for s in staged if s.how == "present"),
        fallbacks=tuple(s.why for s in staged if s.how == "fallback"),
    )


async def stage_fleet(
    via: StageVia,
    hosts: Sequence[Host],
    conns: Mapping[int, Connection],
    archive: Archive,
    paths: Mapping[int, Paths],
    *,
    timeout: float,
    note: Note,
) -> tuple[list[Outcome[Staged]], int]:
    """Stage ``archive`` on every host via a seed per slice or a bucket; per host (in order)
    how it went, and the bytes uploaded outside the transport (to a bucket)."""
    work = _Work(conns, archive, paths, timeout)
    if via.kind == "gs":
        outcomes, uploaded = await work.via_bucket(via.url, hosts, note)
    else:
        slices: dict[int, list[Host]] = {}
        for h in hosts:
            slices.setdefault(h.slice_id, []).append(h)
        found: dict[int, Outcome[Staged]] = {}
        async with asyncio.TaskGroup() as tg:
            for members in slices.values():
                tg.create_task(work.via_seed(members, found, note))
        outcomes, uploaded = [found[h.process_id] for h in hosts], 0
    fell = [o.value.why for o in outcomes if o.value is not None and o.value.how == "fallback"]
    if fell:
        note(
            f"{len(fell)} host(s) got the code from the runner after a failed fetch; first: "
            f"{fell[0]}",
            "warning",
        )
    return outcomes, uploaded


@dataclass(frozen=True)
class _Source:
    """Where a slice's hosts fetch from: a seed's server, or (``why``) nowhere."""

    url: str = ""
    token: str = ""
    why: str = ""
    how: str = "peer"


@dataclass(frozen=True)
class _Work:
    conns: Mapping[int, Connection]
    archive: Archive
    paths: Mapping[int, Paths]
    timeout: float

    async def via_seed(
        self, members: list[Host], found: dict[int, Outcome[Staged]], note: Note
    ) -> None:
        seed, rest = members[0], members[1:]
        if not rest:
            found[seed.process_id] = (await self._direct([seed]))[0]
            return
        addr = bind_address(seed, self.conns[seed.process_id])
        if not private_address(addr):  # a seed never serves on a public address
            note(
                f"slice {seed.slice_id}: its seed {seed.name}'s internal address {addr or '?'} "
                "is not private, so no seed serves there: the runner sends the slice its code",
                "warning",
            )
            for o in await self._direct(members):
                found[o.host.process_id] = o
            return
        token = secrets.token_urlsafe(32)
        served = await map_hosts(
            lambda h: self._seed(h, token, len(rest)), [seed], timeout=self.timeout, what="staging"
        )
        outcome = served[0]
        server: tuple[str, str] | None = None
        if outcome.error is not None:
            found[seed.process_id] = Outcome(seed, error=outcome.error)
            source = _Source(why=f"seed {seed.name} failed: {outcome.error.message}")
        else:
            assert outcome.value is not None
            staged, source, server = outcome.value
            found[seed.process_id] = Outcome(seed, staged)
        try:
            if outcome.value is not None and outcome.value[0].how == "present":
                results = await self._direct(rest)  # nothing to serve: what is there stays
            else:
                results = await self._fetch_all(rest, source)
            for o in results:
                found[o.host.process_id] = o
        finally:
            if server is not None:
                await self._stop_seed(seed, *server, note)

    async def via_bucket(
        self, url: str, hosts: Sequence[Host], note: Note
    ) -> tuple[list[Outcome[Staged]], int]:
        from multihost.cloud.bucket import code_url
        from multihost.cloud.gcloud import Gcloud

        target = code_url(url, self.archive.digest)
        gcloud = Gcloud.from_env()

        def upload_once() -> int:
            if in_bucket(target):
                return 0
            gcloud.put_bytes(self.archive.data, target)
            return len(self.archive.data)

        try:
            uploaded = await asyncio.to_thread(upload_once)
        except CloudError as exc:
            note(f"--stage-via {url}: {exc}", "warning")
            source = _Source(why=f"no upload to {url}")
            return await self._fetch_all(list(hosts), source), 0
        if not uploaded:
            note(f"code {self.archive.short} is already in {url}: nothing to upload", "info")
        return await self._fetch_all(list(hosts), _Source(url=target, how="gs")), uploaded

    async def _seed(
        self, host: Host, token: str, fetches: int
    ) -> tuple[Staged, _Source, tuple[str, str] | None]:
        conn, paths = self.conns[host.process_id], self.paths[host.process_id]
        addr = bind_address(host, conn)
        lifetime = self.timeout + FETCH_TIMEOUT
        command = script(
            SEED,
            paths={"b": paths.base, "c": paths.code},
            done=COMPLETE,
            stage=stage_command(paths),
            serve=python_source("seed_serve"),
            addr=addr,
            lifetime=f"{lifetime:g}",
            fetches=fetches,
            stale=int(lifetime // 60) + 2,
            name=f"/{self.archive.digest}.tar.gz",
        )
        data = token.encode() + b"\n" + self.archive.data
        done, sent = await conn.offer(command, b"absent", data)
        if done.exit_status != 0:
            raise RemoteError(host, f"staging failed: {_cause(done.stderr)}")
        if not sent:
            return Staged("present"), _Source(), None
        said = done.stdout.decode(errors="replace").splitlines()[-1:] or [""]
        word, _, rest = said[0].partition(" ")
        staged = Staged("sent", len(self.archive.data))
        if word != "serving":
            return staged, _Source(why=f"seed {host.name} could not serve ({rest})"), None
        port, pid, folder = rest.split(" ", 2)
        host_part = f"[{addr}]" if ":" in addr else addr
        url = f"http://{host_part}:{port}/{self.archive.digest}.tar.gz"
        return staged, _Source(url=url, token=token), (pid, folder)

    async def _stop_seed(self, seed: Host, pid: str, folder: str, note: Note) -> None:
        conn = self.conns[seed.process_id]
        try:
            async with asyncio.timeout(self.timeout):
                await conn.run(script(SEED_STOP, p=pid, s=folder))
        except (TimeoutError, HostError) as exc:
            note(
                f"{seed.name}: the seed's server was not stopped ({exc}); it ends by itself",
                "warning",
            )

    async def _fetch_all(self, hosts: list[Host], source: _Source) -> list[Outcome[Staged]]:
        if source.why:
            return await self._direct(hosts, source.why)
        return await map_hosts(
            lambda h: self._fetch(h, source), hosts, timeout=self.timeout, what="staging"
        )

    async def _fetch(self, host: Host, source: _Source) -> Staged:
        conn, paths = self.conns[host.process_id], self.paths[host.process_id]
        command = script(
            FETCH,
            paths={"b": paths.base, "c": paths.code},
            done=COMPLETE,
            stage=stage_command(paths),
            how=source.how,
            url=source.url,
            digest=self.archive.digest,
            fetch=python_source("seed_fetch"),
            timeout=f"{FETCH_TIMEOUT:g}",
        )
        stdin = (source.token + "\n").encode() if source.how == "peer" else None
        done = await conn.run(command, stdin=stdin)
        said = done.stdout.decode(errors="replace").strip()
        if done.exit_status == 0 and said in ("present", "fetched"):
            return Staged("present" if said == "present" else "fetched")
        where = "the seed" if source.how == "peer" else source.url
        why = f"fetch from {where} failed: {_cause(done.stderr)}"
        sent = await stage(conn, self.archive, paths)
        return Staged("fallback", sent, f"{host.name}: {why}")

    async def _direct(self, hosts: list[Host], why: str = "") -> list[Outcome[Staged]]:
        async def one(host: Host) -> Staged:
            pid = host.process_id
            sent = await stage(self.conns[pid], self.archive, self.paths[pid])
            if why and sent:
                return Staged("fallback", sent, f"{host.name}: {why}")
            return Staged("sent" if sent else "present", sent)

        return await map_hosts(one, hosts, timeout=self.timeout, what="staging")
