"""Pack the script directory once, content-address it, and stream it into ``tar`` on each host."""

from __future__ import annotations

import fnmatch
import glob
import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import RemoteError, RunNameTaken, UsageError
from multihost.remote.commands import Paths, kit, stage_command
from multihost.transport import Completed, Connection, Progress

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


def list_files(
    root: Path, excludes: tuple[str, ...] = (), max_bytes: int | None = None
) -> list[str]:
    """Files to ship, relative to ``root``: what git tracks or would track, else everything.

    With ``max_bytes``, sizes are added up while listing and a tree bigger than that is
    refused (naming its biggest paths) before any file is read.
    """
    check_stage_root(root)
    names = _git_files(root)
    if names is None:
        names = _walk(root, excludes)
    patterns = ALWAYS_EXCLUDED + excludes
    kept: list[str] = []
    sizes: dict[str, int] = {}
    total = 0
    for n in names:
        if excluded(n, patterns):
            continue
        try:
            st = (root / n).stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        kept.append(n)
        if max_bytes is not None:
            total += st.st_size
            top = n.split("/", 1)[0]
            sizes[top] = sizes.get(top, 0) + st.st_size
            if total > max_bytes:
                raise UsageError(_too_big(root, total, max_bytes, sizes))
    return sorted(kept)


def _walk(root: Path, excludes: tuple[str, ...]) -> list[str]:
    """Every file under ``root`` in a stable order, not descending into excluded directories."""
    patterns = ALWAYS_EXCLUDED + excludes
    out = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if not excluded(_join(rel, x) + "/", patterns))
        out += [_join(rel, f) for f in sorted(files)]
    return out


def _join(rel: str, name: str) -> str:
    return name if rel == "." else f"{rel}/{name}"


def _too_big(root: Path, total: int, limit: int, sizes: dict[str, int]) -> str:
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{name} ({_human(n)})" for name, n in biggest)
    return (
        f"script dir {root} is over {_human(limit)} (at least {_human(total)}; biggest: {named}): "
        "use --exclude PATTERN, a smaller --script-dir, or raise --max-stage-bytes"
    )


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def check_stage_root(root: Path) -> None:
    """Refuse to stage what is not a directory, the filesystem root, or the home directory."""
    if not root.is_dir():
        raise UsageError(f"script dir {root} does not exist or is not a directory")
    resolved = root.resolve()
    if resolved == Path("/") or resolved == Path.home().resolve():
        where = "/" if resolved == Path("/") else f"your home directory ({resolved})"
        raise UsageError(
            f"refusing to stage {where} as the code dir: run from your project or pass "
            "--script-dir DIR"
        )


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


def excluded(name: str, patterns: tuple[str, ...]) -> bool:
    """gitignore-like: a pattern matches the whole path or any one component; a pattern with a
    trailing slash (``tests/``) matches a directory and everything under it; a leading slash
    (``/tests/``) anchors it at the code dir's top."""
    parts = name.split("/")
    for p in patterns:
        anchored, is_dir = p.startswith("/"), p.endswith("/")
        pattern = p.strip("/")
        dirs = parts[:-1] if is_dir else parts
        prefixes = ("/".join(parts[: i + 1]) for i in range(len(dirs)))
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
        if not anchored and any(fnmatch.fnmatch(part, pattern) for part in dirs):
            return True
    return False


def outputs_excluded(root: Path, outputs: Sequence[Path], run: str = "") -> tuple[str, ...]:
    """Exclude patterns for the run's own output dirs inside the code dir ``root`` (the log
    dir, a pull destination). Staged, each run would ship every earlier run's logs to every
    host and get a new code hash. A log dir that is ``root`` itself: each run's folder in it
    (one holding a run record or sweep results) and this ``run``'s."""
    base = root.expanduser().resolve()
    patterns: list[str] = []
    for out in outputs:
        path = out.expanduser().resolve()
        if path == base:
            made = [
                d.name
                for d in base.iterdir()
                if d.is_dir() and not d.is_symlink() and any((d / n).exists() for n in _RUN_FILES)
            ]
            patterns += [f"/{glob.escape(n)}/" for n in sorted({*made, run} - {""})]
        elif base in path.parents:
            patterns.append(f"/{glob.escape(path.relative_to(base).as_posix())}/")
    return tuple(dict.fromkeys(patterns))


_RUN_FILES = ("run.json", "sweep.json", "results.jsonl")  # what makes a folder a run's output


def pack(root: Path, excludes: tuple[str, ...] = (), max_bytes: int | None = None) -> Archive:
    """A reproducible tar.gz: sorted names, fixed owners, no gzip timestamp."""
    names = list_files(root, excludes, max_bytes)
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


TAKEN = 3  # the claim's exit status when the run's directory exists (remote.CLAIM)


async def stage(
    conn: Connection,
    archive: Archive,
    paths: Paths,
    progress: Progress | None = None,
    *,
    claim: bool = False,
) -> int:
    """Make sure the host has this archive unpacked; returns the bytes sent (0 if it had it).
    ``progress`` is told the bytes sent so far, chunk by chunk. With ``claim``, the run's
    directory is claimed first on the same channel (RunNameTaken if it exists)."""
    return (await stage_then(conn, archive, paths, "", progress, claim=claim))[0]


async def stage_then(
    conn: Connection,
    archive: Archive,
    paths: Paths,
    then: str,
    progress: Progress | None = None,
    *,
    claim: bool = False,
) -> tuple[int, Completed, int]:
    """:func:`stage`, then (once the code is there) the script ``then`` on the same channel:
    no round trip of its own. Returns the code's bytes sent, what ``then`` did (its exit
    status, its output, the channel's errors) and the kit's bytes sent (``claim``: the host
    lacked it); a failed staging raises as :func:`stage` does."""
    # One channel: the host answers first, and the archive follows only if it is absent; with
    # ``claim``, the kit (the hook and the run's scripts) ahead of it, only if the host lacks it.
    command = stage_command(paths, claim=claim)
    ahead = (kit().offer,) if claim else ()
    done, sent = await conn.offer(
        and_then(command, then), b"absent", archive.data, progress, ahead=ahead
    )
    code = len(archive.data) if sent else 0
    if then and (after := what_then_did(done)) is not None:
        return code, after, kit_sent(done)
    if claim and done.exit_status == TAKEN:
        raise RunNameTaken(conn.host, _cause(done.stderr))
    if done.exit_status != 0 or then:  # ``then`` never ran: the staging failed
        raise RemoteError(conn.host, f"staging failed: {_cause(done.stderr)}")
    return code, done, kit_sent(done)


def kit_sent(done: Completed) -> int:
    """The kit's bytes sent on a channel whose script carried it (``commands.Kit``): the
    host's first word was ``kit``, or nothing was."""
    word, data = kit().offer
    return len(data) if done.stdout.startswith(word + b"\n") else 0


_THEN = b"multihost-then"  # the line between a command's output and what follows it


def and_then(command: str, then: str) -> str:
    """``command``, then (once it succeeded) ``then``, on the same channel: no round trip of
    its own (``then`` empty: ``command``). :func:`what_then_did` reads the result."""
    return f"(\n{command}\n) || exit $?\necho {_THEN.decode()}\n{then}" if then else command


def what_then_did(done: Completed) -> Completed | None:
    """What ``then`` of :func:`and_then` did (its exit status, its output, the channel's
    errors), or None when ``command`` failed (``done`` is then its own)."""
    _, marked, after = (b"\n" + done.stdout).partition(b"\n" + _THEN + b"\n")
    return Completed(done.exit_status, after, done.stderr) if marked else None


def _cause(data: bytes) -> str:
    """The error lines that say why (tar's first complaint, e.g. "No space left on device",
    comes before its summary line), de-duplicated, at most three."""
    lines = [ln.strip() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    kept = list(dict.fromkeys(lines))
    return "; ".join(kept[:2] + kept[-1:] if len(kept) > 3 else kept) or "no error output"
