"""Files back from every host of a run: list on the host, fetch what changed, in parallel.

Each host's files land in ``DIR/s<slice>/w<worker>/<path>``, the host's name as everywhere
else (``s0/w2``; a relative remote path as it is under the run's work dir, an absolute one
without its leading ``/``). Nothing is ever written
outside DIR: a name with ``..`` left after normalising is refused, and every directory below DIR
is opened without following symbolic links. A file already there with the same size and mtime
(to the second, as rsync) is skipped; a copied file gets the host's mtime, mode 0600 (0700 for
directories), and appears under its name only once complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost import remote
from multihost.defaults import DEFAULTS
from multihost.errors import HostError, HostLost, RemoteError, UsageError
from multihost.events import Event, Transfer
from multihost.model import Host
from multihost.results.records import PullResult
from multihost.runs.past import record_paths
from multihost.runs.record import RunRecord
from multihost.transport import Connection, SSHOptions, connect
from multihost.transport.fanout import map_hosts


@dataclass(frozen=True)
class RemoteFile:
    """One file the host listed: its path there, size and mtime (epoch seconds)."""

    path: str
    size: int
    mtime: float

    @property
    def local_name(self) -> str | None:
        """Where it goes below the host's folder; None when that would leave it (``..``)."""
        name = posixpath.normpath(self.path).lstrip("/")
        if name in ("", ".") or name.split("/")[0] == "..":
            return None
        return name


@dataclass(frozen=True)
class Listing:
    """A host's answer to the listing script: files to fetch and problems found."""

    files: tuple[RemoteFile, ...] = ()
    problems: tuple[str, ...] = ()
    work_dir: str = ""  # absolute, as the host resolved it ("" when it is gone)

    def remote_path(self, file: RemoteFile) -> str:
        """Where to read ``file`` on the host (a relative path is in the work dir)."""
        return posixpath.join(self.work_dir, file.path) if self.work_dir else file.path


def check_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """Remote paths or globs as given; a usage error for none, an empty one, a newline, or a
    relative one that leaves the run's work dir (``../x``: its files could not land below the
    host's folder, and a glob there would list the host's other runs and code)."""
    if not patterns:
        raise UsageError("name at least one remote path or glob to pull")
    for p in patterns:
        if not p.strip() or "\n" in p or "\0" in p:
            raise UsageError(f"not a remote path: {p!r}")
        relative = p != "~" and not p.startswith(("/", "~/"))  # ~/ is the host's home
        if relative and posixpath.normpath(p).split("/")[0] == "..":
            raise UsageError(
                f"{p!r} leaves the run's work dir: name a path inside it, or an absolute one"
            )
    return tuple(patterns)


def list_command(work_dir: str, patterns: Sequence[str]) -> str:
    """The listing script for a host (see ``remote.PULL_LIST``), its values quoted."""
    return remote.script(remote.PULL_LIST, paths={"w": work_dir}, pats="\n".join(patterns))


def parse_listing(out: bytes, err: bytes) -> Listing:
    """The NUL-terminated records of ``remote.PULL_LIST`` (and find's complaints on stderr)."""
    files: list[RemoteFile] = []
    problems: list[str] = []
    work_dir = ""
    for record in out.split(b"\0"):
        text = record.decode(errors="replace")
        kind, _, rest = text.partition(" ")
        if kind == "P":
            work_dir = rest
        elif kind == "F":
            size, mtime, path = [*rest.split(" ", 2), "", ""][:3]
            try:
                files.append(RemoteFile(path, int(size), float(mtime)))
            except ValueError:
                problems.append(f"unreadable listing entry {text!r}")
        elif kind == "D":
            problems.append(f"{rest}: permission denied")
        elif kind == "M":
            problems.append(f"no match for {rest!r}")
        elif kind == "W":
            problems.append(f"{rest!r}: the run's work dir is gone from the host")
    problems += [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    return Listing(tuple(files), tuple(problems), work_dir)


def _open_dirs(root: Path, parts: Sequence[str]) -> int:
    """A descriptor of ``root/parts...``, created 0700 as needed, never following a symbolic
    link below ``root``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                raise OSError(f"{part} is a symbolic link or not a directory") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same(fd: int, name: str, file: RemoteFile) -> bool:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return st.st_size == file.size and int(st.st_mtime) == int(file.mtime)


async def _fetch_one(
    conn: Connection, fd: int, name: str, path: str, mtime: float, moved: Callable[[int], None]
) -> int:
    """Copy one file into directory ``fd`` as ``name``: a hidden partial file first, its mtime
    set, then renamed into place."""
    partial = f".{name}.multihost-partial"
    out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=fd)
    try:
        with os.fdopen(out, "wb") as f:

            def write(chunk: bytes) -> None:
                f.write(chunk)
                moved(len(chunk))

            size = await conn.fetch(path, write)
            f.flush()
            os.utime(f.fileno(), (mtime, mtime))
        os.rename(partial, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=fd)
        raise
    return size


@dataclass
class _Tally:
    """One host's copying in progress (mutable bookkeeping, frozen into a PullResult)."""

    host: Host
    total: int  # bytes still expected in all (less what turned out to be there already)
    emit: Callable[[Event], None]
    done: int = 0
    files: int = 0
    skipped: int = 0
    copied: int = 0
    lost: str | None = None  # the connection went: no more files from this host

    def moved(self, n: int) -> None:
        self.done += n
        self.emit(Transfer(self.host, "pull", self.done, self.total))


async def _copy(
    conn: Connection,
    root: Path,
    below: Sequence[str],
    listing: Listing,
    file: RemoteFile,
    name: str,
    tally: _Tally,
) -> str | None:
    """Copy one listed file into ``root/below...`` unless it is there already; the problem,
    if any."""
    folder, _, leaf = name.rpartition("/")
    try:
        fd = _open_dirs(root, [*below, *filter(None, folder.split("/"))])
    except OSError as exc:
        tally.total -= file.size
        return f"{file.path}: cannot write {name}: {exc.strerror or exc}"
    got = 0

    def moved(n: int) -> None:
        nonlocal got
        got += n
        tally.moved(n)

    try:
        if _same(fd, leaf, file):
            tally.skipped += 1
            return None
        tally.copied += await _fetch_one(
            conn, fd, leaf, listing.remote_path(file), file.mtime, moved
        )
        tally.files += 1
        return None
    except RemoteError as exc:  # this file only
        return exc.message
    except HostLost as exc:  # the rest cannot come either; said once
        tally.lost = tally.lost or exc.message
        return None
    except OSError as exc:
        return f"{file.path}: cannot write {name}: {exc.strerror or exc}"
    finally:
        tally.total += got - file.size  # of this file, only what really came counts
        os.close(fd)


async def pull_host(
    conn: Connection,
    work_dir: str,
    patterns: Sequence[str],
    dest: Path,
    emit: Callable[[Event], None],
    root: Path | None = None,
) -> PullResult:
    """List ``patterns`` on one host and copy what is new into ``dest`` (its own folder), a
    few files at a time (``DEFAULTS.pull_files``) over the host's one connection. ``root``:
    the folder above ``dest`` that exists (default: ``dest``'s parent); no directory below it
    is followed if it is a symbolic link."""
    host = conn.host
    root = root if root is not None else dest.parent
    below = dest.relative_to(root).parts
    res = await conn.run(list_command(work_dir, patterns))
    if res.exit_status != 0:
        raise RemoteError(host, f"listing failed: {res.stderr.decode(errors='replace').strip()}")
    listing = parse_listing(res.stdout, res.stderr)
    problems = list(listing.problems)
    todo: list[tuple[RemoteFile, str]] = []
    for file in listing.files:
        name = file.local_name
        if name is None:
            problems.append(f"{file.path}: refused, its name leaves {dest} ('..')")
        else:
            todo.append((file, name))
    tally = _Tally(host, sum(f.size for f, _ in todo), emit)
    emit(Transfer(host, "pull", 0, tally.total))
    queue = iter(todo)  # shared by the workers: each file is taken once

    async def worker() -> None:
        for file, name in queue:
            if tally.lost is not None:
                return
            problem = await _copy(conn, root, below, listing, file, name, tally)
            if problem is not None:
                problems.append(problem)

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(DEFAULTS.pull_files, len(todo))):
            tg.create_task(worker())
    if tally.lost is not None:
        problems.append(tally.lost)
    emit(Transfer(host, "pull", tally.done, max(tally.total, tally.done), finished=True))
    return PullResult(host, dest, tally.files, tally.skipped, tally.copied, tuple(problems))


def check_dest(dest: Path) -> Path:
    """Make the pull's destination (a private directory, parents too) before anything is
    fetched or started; a path that cannot be one is a usage error naming it and why."""
    try:
        dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise UsageError(f"pull destination {dest}: exists and is not a directory") from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise UsageError(f"pull destination {dest}: cannot be created ({why})") from None
    if not os.access(dest, os.W_OK | os.X_OK):
        raise UsageError(f"pull destination {dest}: not writable")
    return dest


def host_dir(dest: Path, host: Host) -> Path:
    """Where ``host``'s files land below ``dest``: its name as a path, ``DEST/s0/w2``."""
    return dest / f"s{host.slice_id}" / f"w{host.worker_id}"


def default_dest(run_name: str) -> Path:
    """``./multihost-pull/RUN``."""
    return Path("multihost-pull") / run_name


async def pull_run(
    record: RunRecord,
    patterns: Sequence[str],
    dest: Path,
    ssh: SSHOptions,
    *,
    limit: int = DEFAULTS.pull_limit,
    on_event: Callable[[Event], None] | None = None,
) -> list[PullResult]:
    """Pull ``patterns`` from every host of a run into ``dest``, ``limit`` hosts at a time;
    every host yields a result (an unreachable one with its error), in host order."""
    patterns = check_patterns(patterns)
    work_dirs = {pid: paths.code for pid, paths in record_paths(record).items()}
    emit = on_event or (lambda _e: None)
    check_dest(dest)

    async def one(host: Host) -> PullResult:
        conn = await connect(host, ssh)
        try:
            return await pull_host(
                conn, work_dirs[host.process_id], patterns, host_dir(dest, host), emit, dest
            )
        finally:
            await conn.close()

    outcomes = await map_hosts(one, list(record.fleet), limit=limit, what="pull")
    results = []
    for o in outcomes:
        if o.value is not None:
            results.append(o.value)
        else:
            error: HostError | None = o.error
            emit(Transfer(o.host, "pull", 0, 0, finished=True))
            results.append(
                PullResult(
                    o.host, host_dir(dest, o.host), errors=(error.message if error else "failed",)
                )
            )
    return results
