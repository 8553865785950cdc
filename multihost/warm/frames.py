"""The frames a warm process and the runner exchange: ``KIND LENGTH\\n`` then LENGTH bytes.
Pure: no I/O (the host's side is in ``multihost/remote/warm_server.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_HEAD = 64  # bytes of a frame's first line
MAX_FRAME = 1 << 31  # a call's value is one frame: bounded only by what fits a Python bytes


class FrameError(ValueError):
    """What came from a host is not a frame."""


def frame(kind: str, data: bytes = b"") -> bytes:
    """One frame: its kind, its length, its bytes."""
    return b"%s %d\n" % (kind.encode(), len(data)) + data


def work_frame(header: dict[str, Any], blob: bytes = b"") -> bytes:
    """A ``work`` frame: the piece's JSON line, then its bytes (a call's function)."""
    return frame("work", json.dumps(header).encode() + b"\n" + blob)


@dataclass(frozen=True)
class Frame:
    kind: str
    data: bytes

    def json(self) -> Any:
        """A ``ready`` frame's object, or a ``done`` frame's first line's."""
        return json.loads(self.data.partition(b"\n")[0] or b"null")

    @property
    def tail(self) -> bytes:
        """A ``done`` frame's bytes after its JSON line (a call's value)."""
        return self.data.partition(b"\n")[2]


class FrameReader:
    """Bytes as they come from a channel, cut into frames (a frame's bytes held until whole)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while True:
            end = self._buffer.find(b"\n", 0, MAX_HEAD + 1)
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise FrameError(f"not a frame: {bytes(self._buffer[:MAX_HEAD])!r}")
                return frames
            kind, _, size = bytes(self._buffer[:end]).decode(errors="replace").partition(" ")
            if not kind.isalpha() or not size.isdigit() or int(size) > MAX_FRAME:
                raise FrameError(f"not a frame: {bytes(self._buffer[:end])!r}")
            stop = end + 1 + int(size)
            if len(self._buffer) < stop:
                return frames
            frames.append(Frame(kind, bytes(self._buffer[end + 1 : stop])))
            del self._buffer[:stop]
