"""The one writer of the records multihost keeps on this machine: a run's ``run.json``
(``multihost.runs.record``), a pod's ``pod.json`` (``multihost.pods.records``) and a job's
``job.json`` (``multihost.job.record``), and a sweep's ``sweep.json``.

Each record is a frozen class with its version (``schema``) and ``to_json``/``from_json``;
:func:`save` writes one the one way: a temporary file in the record's own directory (private:
0700, made where missing, never through a symbolic link), created 0600, written and synced,
then renamed over the record, so a reader sees the old record or the new one, never half of
either, and a crash leaves no torn file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol

from multihost.errors import UsageError


class TypedRecord(Protocol):
    """A record multihost keeps: versioned, and its own JSON text."""

    @property
    def schema(self) -> int: ...

    def to_json(self) -> str: ...


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) readable by this user only (0700); refuse a
    symlink where the run's own directory should be, so logs never land elsewhere."""
    missing = [p for p in (path, *path.parents) if not p.exists() and not p.is_symlink()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(f"cannot create {p}: {exc.strerror or exc}") from None
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link: refusing to write run files through it")
    if not path.is_dir():
        raise UsageError(f"{path} exists and is not a directory")
    return path


def write_atomic(path: Path, text: str) -> Path:
    """``text`` as the whole of ``path`` (0600, in a private directory), replaced atomically."""
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename below must not land before the bytes do
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save(path: Path, record: TypedRecord) -> Path:
    """The record written as ``path`` (:func:`write_atomic`)."""
    return write_atomic(path, record.to_json())
