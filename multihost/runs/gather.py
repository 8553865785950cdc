"""Output from many hosts gathered by content: what is identical is kept once, with its hosts.

Like ClusterShell's MsgTree (``clush -b``): the hosts' outputs form a tree keyed by lines.
Hosts whose whole output is identical are one group; where outputs differ, the lines they share
from the start are one segment, then each way they go on is its own segment with its (smaller)
set of hosts, and so on. Host sets print compactly (``s0/w0-3,s1/w0-3``). No I/O here.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.model import Host, host_ranges


@dataclass(frozen=True)
class Output:
    """The last lines of one host's output, and how many it had in all."""

    host: Host
    lines: tuple[str, ...]
    total: int

    @property
    def truncated(self) -> bool:
        return self.total > len(self.lines)


@dataclass(frozen=True)
class Segment:
    """Lines that every host in ``hosts`` printed at this point; ``depth`` 0 is the start,
    a segment at depth d+1 goes on from the one at depth d above it."""

    hosts: tuple[Host, ...]
    lines: tuple[str, ...]
    depth: int

    @property
    def label(self) -> str:
        return f"[{host_ranges(self.hosts)}] ×{len(self.hosts)}"


def read_tail(
    host: Host, path: Path, limit: int, max_line: int, keep: Callable[[str], bool] | None = None
) -> Output:
    """The last ``limit`` lines of a host's log that ``keep`` accepts (each cut at
    ``max_line`` characters) and how many there were; memory stays bounded by ``limit`` lines
    whatever the file's size."""
    kept: deque[str] = deque(maxlen=limit)
    total = 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return Output(host, (), 0)
    with open(fd, encoding="utf-8", errors="replace", newline="\n") as f:
        for raw in f:
            line = raw.rstrip("\n")[:max_line]
            if keep is None or keep(line):
                total += 1
                kept.append(line)
    return Output(host, tuple(kept), total)


def gather(outputs: Sequence[Output]) -> list[Segment]:
    """The outputs as segments, depth first: shared lines once, then each branch."""
    segments: list[Segment] = []
    # (hosts' outputs that agree up to ``start``, start, depth); children are pushed in
    # reverse so that they come out in host order.
    stack: list[tuple[list[Output], int, int]] = [(list(outputs), 0, 0)]
    while stack:
        group, start, depth = stack.pop()
        if not group:
            continue
        first = group[0].lines
        end = start
        while all(len(o.lines) > end and o.lines[end] == first[end] for o in group):
            end += 1
        if end > start:  # lines they all share (a branch always starts with one)
            segments.append(Segment(tuple(o.host for o in group), first[start:end], depth))
            depth += 1
        elif silent := tuple(o.host for o in group if not o.lines):  # at the start only
            segments.append(Segment(silent, (), depth))
        branches: dict[str, list[Output]] = {}
        for o in group:
            if len(o.lines) > end:
                branches.setdefault(o.lines[end], []).append(o)
        stack.extend((b, end, depth) for b in reversed(branches.values()))
    return segments


def render(segments: Sequence[Segment]) -> list[str]:
    """Plain lines: each segment's host set as a header, its lines indented below it."""
    out: list[str] = []
    for seg in segments:
        pad = "  " * seg.depth
        out.append(pad + seg.label + ("" if seg.lines else "  (no output)"))
        out.extend(pad + "  " + line for line in seg.lines)
    return out


class LiveGather:
    """Identical lines from many hosts gathered *while* they print (``run --gather``).

    A line waits for the same line from every other host still running, for at most
    ``window`` seconds from its first arrival; then it comes out once as a one-line
    :class:`Segment` with the hosts that printed it (those that printed something else come
    out apart, in their own groups). A host's k-th copy of a text joins the others' k-th
    copy, so repeated lines stay apart. Groups come out in the order their first line arrived;
    one that is complete waits behind an older one still waiting (never longer than that
    one's window). At most ``pending`` lines are held: beyond that the oldest group comes out
    as it is. No I/O here.
    """

    def __init__(self, hosts: Sequence[Host], window: float, pending: int) -> None:
        self.live = len(hosts)
        self.window, self.limit = window, pending
        self._groups: deque[_Pending] = deque()  # in order of first arrival
        self._by_text: dict[str, list[_Pending]] = {}  # text -> its groups still held
        self._held = 0

    def add(self, host: Host, text: str, now: float) -> list[Segment]:
        """``host`` printed ``text`` at ``now`` (monotonic seconds); the groups now due."""
        groups = self._by_text.setdefault(text, [])
        pid = host.process_id
        group = next((g for g in groups if pid not in g.pids), None)
        if group is None:
            group = _Pending(text, now, self.live, [], set())
            groups.append(group)
            self._groups.append(group)
        group.hosts.append(host)
        group.pids.add(pid)
        self._held += 1
        return self.due(now)

    def due(self, now: float) -> list[Segment]:
        """The groups whose time has come: complete or past their window, oldest first."""
        out: list[Segment] = []
        while self._groups:
            first = self._groups[0]
            ready = len(first.hosts) >= first.need or now - first.since >= self.window
            if not ready and self._held <= self.limit:
                break
            out.append(self._pop())
        return out

    def flush(self) -> list[Segment]:
        """Every group held, as it is (the run ended)."""
        return [self._pop() for _ in range(len(self._groups))]

    def ended(self, host: Host) -> None:
        """``host`` will print no more: the groups it is not in stop waiting for it."""
        self.live = max(1, self.live - 1)
        for group in self._groups:
            if host.process_id not in group.pids:
                group.need = max(1, group.need - 1)

    def _pop(self) -> Segment:
        group = self._groups.popleft()
        groups = self._by_text[group.text]
        groups.remove(group)
        if not groups:
            del self._by_text[group.text]
        self._held -= len(group.hosts)
        hosts = sorted(group.hosts, key=lambda h: h.process_id)
        return Segment(tuple(hosts), (group.text,), 0)


@dataclass
class _Pending:
    text: str
    since: float
    need: int  # hosts it waits for: those running when it began, less those ended since
    hosts: list[Host]
    pids: set[int]
