"""Pack the script directory once, content-address it, and stream it into ``tar`` on each host."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import RemoteError, UsageError
from multihost.plan import Paths, stage_command
from multihost.transport import Connection

ALWAYS_EXCLUDED = (".git", "__pycache__", "*.pyc")


@dataclass(frozen=True)
class Archive:
    """The packed code: its bytes, content hash and what went in."""

    data: bytes
    digest: str
    files: int

    @property
    def short(self) -> str:
        return self.digest[:16]


def list_files(root: Path, excludes: tuple[str, ...] = ()) -> list[str]:
    """Files to ship, relative to ``root``: what git tracks or would track, else everything."""
    if not root.is_dir():
        raise UsageError(f"script dir {root} does not exist or is not a directory")
    names = _git_files(root)
    if names is None:
        names = [
            os.path.relpath(os.path.join(d, f), root)
            for d, dirs, files in os.walk(root)
            for f in files
            if not dirs.sort()  # walk in a stable order
        ]
    patterns = ALWAYS_EXCLUDED + excludes
    return sorted(n for n in names if not _excluded(n, patterns) and (root / n).is_file())


def _git_files(root: Path) -> list[str] | None:
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [n for n in out.decode().split("\0") if n]


def _excluded(name: str, patterns: tuple[str, ...]) -> bool:
    parts = name.split("/")
    return any(
        fnmatch.fnmatch(name, p) or any(fnmatch.fnmatch(part, p) for part in parts)
        for p in patterns
    )


def pack(root: Path, excludes: tuple[str, ...] = ()) -> Archive:
    """A reproducible tar.gz: sorted names, fixed owners, no gzip timestamp."""
    names = list_files(root, excludes)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(root / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if info.mode & 0o111 else 0o644
            with (root / name).open("rb") as f:
                tar.addfile(info, f)
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    data = packed.getvalue()
    return Archive(data, hashlib.sha256(data).hexdigest(), len(names))


async def stage(conn: Connection, archive: Archive, paths: Paths) -> int:
    """Make sure the host has this archive unpacked; returns the bytes sent (0 if it had it)."""
    # One channel: the host answers first, and the archive follows only if it is absent.
    done, sent = await conn.offer(stage_command(paths), b"absent", archive.data)
    if done.exit_status != 0:
        raise RemoteError(conn.host, f"staging failed: {_cause(done.stderr)}")
    return len(archive.data) if sent else 0


def _cause(data: bytes) -> str:
    """The error lines that say why (tar's first complaint, e.g. "No space left on device",
    comes before its summary line), de-duplicated, at most three."""
    lines = [ln.strip() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    kept = list(dict.fromkeys(lines))
    return "; ".join(kept[:2] + kept[-1:] if len(kept) > 3 else kept) or "no error output"
