"""Standard output for host lines: every byte written, whatever Python's own stdout would do."""

from __future__ import annotations

import io
import os
import select
import sys
from typing import TextIO, cast


class FullWriter(io.TextIOBase):
    """A text file on a descriptor whose ``write`` returns once every byte is out, at once
    (no buffer to flush).

    ``sys.stdout`` over an unbuffered descriptor (``python -u``, ``PYTHONUNBUFFERED=1``, as
    many container images set) drops the rest of a write that a signal cut short: a flood of
    host output then loses lines on the terminal. Here a short write goes on where it stopped,
    and a descriptor that another process made non-blocking is waited on instead of raising.
    """

    encoding = "utf-8"

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._tty = os.isatty(fd)  # asked once: rich asks before every write

    def write(self, text: str) -> int:
        data = memoryview(text.encode("utf-8", "replace"))
        while data:
            try:
                data = data[os.write(self._fd, data) :]
            except BlockingIOError:
                select.select([], [self._fd], [])
        return len(text)

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return self._tty

    def writable(self) -> bool:
        return True


def stdout() -> TextIO:
    """This process's standard output as a :class:`FullWriter` (what Python had buffered for
    it written first); ``sys.stdout`` itself when it has no descriptor (a test's StringIO)."""
    try:
        sys.stdout.flush()
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # None, closed, or not a file
        return sys.stdout
    return cast(TextIO, FullWriter(fd))  # rich needs write, flush, isatty, fileno, encoding
