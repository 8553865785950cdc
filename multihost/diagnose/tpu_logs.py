"""A failed TPU run: the failing hosts' TPU runtime logs (libtpu writes ``/tmp/tpu_logs/``)
brought back next to their host logs, ``RUN/tpu_logs/slice_SSSS_worker_WWWW/``, bounded: the
newest ``files`` files of each host, each cut to its last ``file_bytes`` bytes."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

from multihost import remote
from multihost.errors import HostError, RemoteError
from multihost.model import Host, State
from multihost.results.records import HostResult, TpuLogs
from multihost.transport import SSHOptions, connect
from multihost.transport.fanout import map_hosts

REMOTE_DIR = "/tmp/tpu_logs"  # libtpu's default log dir on a TPU VM
DIR_ENV = "MULTIHOST_TPU_LOG_DIR"  # another dir (tests: each fleet host's ~/tpu_logs)
FILES = 8  # the newest files of each host
FILE_BYTES = 1 << 20  # the last bytes of each

FAILING = (State.FAILED, State.VANISHED, State.LOST)


def collect_command(directory: str, files: int = FILES, file_bytes: int = FILE_BYTES) -> str:
    return remote.script(remote.load("tpu_logs"), paths={"d": directory}, n=files, max=file_bytes)


def failing(results: Sequence[HostResult]) -> list[Host]:
    """The TPU hosts whose own job failed (not those stopped because another one did)."""
    return [r.host for r in results if r.state in FAILING and r.host.accelerator_type]


def unpack(data: bytes, folder: Path) -> tuple[int, int]:
    """The host's tar into ``folder`` (0700; files 0600, regular files only, no path leaves
    it); returns (files, cut)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = cut = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if not member.isfile() or "/" in name or name in ("", ".", ".."):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            body = source.read()
            if name == ".cut":
                cut = len(body.splitlines())
                name = "CUT.txt"  # "SIZE NAME" of each file cut to its tail
            else:
                files += 1
            fd = os.open(
                folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(fd, "wb") as f:
                f.write(body)
    return files, cut


async def fetch_tpu_logs(
    hosts: Sequence[Host], ssh: SSHOptions, run_dir: Path, *, limit: int = 16
) -> list[TpuLogs]:
    """Each host's newest TPU runtime logs into ``run_dir/tpu_logs/<host>/``."""
    directory = os.environ.get(DIR_ENV, REMOTE_DIR)
    command = collect_command(directory)

    async def one(host: Host) -> TpuLogs:
        folder = run_dir / "tpu_logs" / host.file_stem
        conn = await connect(host, ssh)
        try:
            res = await conn.run(command)
        finally:
            await conn.close()
        if res.exit_status == 3:
            return TpuLogs(host, folder, problem=f"no {directory} on the host")
        if res.exit_status != 0:
            why = res.stderr.decode(errors="replace").strip()[-300:]
            raise RemoteError(host, f"collecting {directory} failed: {why}")
        files, cut = unpack(res.stdout, folder)
        return TpuLogs(host, folder, files, cut)

    outcomes = await map_hosts(one, list(hosts), limit=limit, timeout=120, what="tpu logs")
    out = []
    for o in outcomes:
        if o.value is not None:
            out.append(o.value)
        else:
            err: HostError | None = o.error
            out.append(
                TpuLogs(
                    o.host,
                    run_dir / "tpu_logs" / o.host.file_stem,
                    problem=err.message if err else "failed",
                )
            )
    return out


def summary(logs: Sequence[TpuLogs], run_dir: Path) -> list[str]:
    """Lines for the end of a failed run: where each failing host's TPU logs are."""
    got = [t for t in logs if t.files]
    lines = []
    if got:
        cut = sum(t.cut for t in got)
        note = f"; {cut} cut to their last {FILE_BYTES >> 20} MiB" if cut else ""
        hosts = ", ".join(t.host.name for t in got)
        lines.append(
            f"TPU runtime logs of {hosts}: {run_dir / 'tpu_logs'}/ "
            f"({sum(t.files for t in got)} files{note})"
        )
    lines += [f"TPU runtime logs of {t.host.name}: {t.problem}" for t in logs if t.problem]
    return lines
