"""Python stacks of every job process, parsed and grouped across hosts (no I/O here).

A host's dump is what ``faulthandler`` writes (``Thread 0x… (most recent call first):`` then
``  File "…", line N in func`` lines). Identical stacks on many hosts collapse into one group,
the odd ones out first — like ClusterShell's MsgTree gathers identical output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from multihost.model import Host, host_ranges

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_CODE_DIR = re.compile(r"^.*/code/[0-9a-f]{16}/")  # the staged code: the same on every host


@dataclass(frozen=True)
class Frame:
    """One frame, most recent first; ``file`` relative to the staged code where it lies there."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread's frames, most recent call first."""

    ident: str
    frames: tuple[Frame, ...]
    current: bool = False

    @property
    def main(self) -> bool:
        """The main thread's outermost frame is a module (the script being run)."""
        return bool(self.frames) and self.frames[-1].function == "<module>"


@dataclass(frozen=True)
class ProcessStack:
    """Every thread of one Python process of the job."""

    pid: int
    command: str
    threads: tuple[ThreadStack, ...]
    native: str = ""  # py-spy's native dump, when asked for and possible

    @property
    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), self.threads[-1] if self.threads else None)


@dataclass(frozen=True)
class HostStacks:
    """What one host gave: its job's Python processes, or why it could not."""

    host: Host
    processes: tuple[ProcessStack, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class StackGroup:
    """Hosts whose (chosen) stacks are identical, and those frames."""

    hosts: tuple[Host, ...]
    frames: tuple[Frame, ...]
    label: str = ""  # e.g. a thread or process description, or an error

    @property
    def size(self) -> int:
        return len(self.hosts)


@dataclass(frozen=True)
class StackReport:
    """Grouped stacks of a run: odd ones out first, the majority last."""

    groups: tuple[StackGroup, ...]
    errors: tuple[HostStacks, ...]
    all_threads: bool = False

    @property
    def stragglers(self) -> tuple[Host, ...]:
        """Hosts whose stacks differ from the largest group (nobody when all agree or tie)."""
        if len(self.groups) < 2:
            return ()
        largest = self.groups[-1]
        if self.groups[-2].size == largest.size:
            return ()
        return tuple(h for g in self.groups[:-1] for h in g.hosts)


def normalize(path: str, home: str = "") -> str:
    """Paths that differ between hosts for no reason (the code hash, the home) made equal."""
    path = _CODE_DIR.sub("", path)
    if home and path.startswith(home.rstrip("/") + "/"):
        path = "~/" + path[len(home.rstrip("/")) + 1 :]
    return path


def parse_dump(text: str, home: str = "") -> tuple[ThreadStack, ...]:
    """A faulthandler dump (all threads) → threads, in the order written."""
    threads: list[ThreadStack] = []
    ident, current, frames = None, False, list[Frame]()
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if ident is not None:
                threads.append(ThreadStack(ident, tuple(frames), current))
            ident, current, frames = head.group(2), head.group(1) == "Current thread", []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            file = normalize(frame.group("file"), home)
            frames.append(Frame(file, int(frame.group("line")), frame.group("func")))
    if ident is not None:
        threads.append(ThreadStack(ident, tuple(frames), current))
    return tuple(threads)


def group(found: Iterable[HostStacks], *, all_threads: bool = False) -> StackReport:
    """Collapse identical stacks across hosts: by default each host's main process' main
    thread; with ``all_threads`` every thread of every process counts as its own stack."""
    keyed: dict[tuple[str, tuple[Frame, ...]], list[Host]] = {}
    errors: list[HostStacks] = []
    for item in found:
        if item.error is not None or not item.processes:
            errors.append(item if item.error else HostStacks(item.host, (), "no Python process"))
            continue
        for label, frames in _stacks_of(item, all_threads):
            hosts = keyed.setdefault((label, frames), [])
            if item.host not in hosts:
                hosts.append(item.host)
    groups = [StackGroup(tuple(hosts), frames, label) for (label, frames), hosts in keyed.items()]
    groups.sort(key=lambda g: (g.size, g.hosts[0].process_id))
    return StackReport(tuple(groups), tuple(errors), all_threads)


def _stacks_of(item: HostStacks, all_threads: bool) -> list[tuple[str, tuple[Frame, ...]]]:
    if all_threads:
        return [
            (f"{p.command} · thread {'main' if t.main else i}", t.frames)
            for p in item.processes
            for i, t in enumerate(p.threads)
        ]
    # the process most likely to be the user's program: the one deepest in Python frames
    main = max(item.processes, key=lambda p: len(p.main_thread.frames) if p.main_thread else 0)
    thread = main.main_thread
    return [("", thread.frames if thread else ())]


def summary_lines(report: StackReport, max_frames: int = 8) -> list[str]:
    """The grouped stacks as plain lines (for a note in the live view or a log)."""
    lines = []
    if report.stragglers:
        lines.append(f"straggler(s): {host_ranges(report.stragglers)}")
    for g in report.groups:
        lines.append(f"[{host_ranges(g.hosts)}] ×{g.size}" + (f"  {g.label}" if g.label else ""))
        lines += [f"  {f}" for f in g.frames[:max_frames]]
        if len(g.frames) > max_frames:
            lines.append(f"  … {len(g.frames) - max_frames} more frames")
    lines += [f"{e.host.name}: {e.error}" for e in report.errors]
    return lines
