"""Each host's log, brought back by byte offset: ``(host, stream, line)`` events and local files.

A lost connection is retried with backoff and the log resumes at the right byte offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as signals
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from multihost.defaults import DEFAULTS
from multihost.errors import HostError, HostLost, RemoteError, RunDirGone
from multihost.events import Line
from multihost.model import Host, State
from multihost.remote.commands import Paths, finish_command, watch_command
from multihost.results.phases import parse as parse_startup
from multihost.results.records import RESULT_MARKER
from multihost.runs.launch import Started
from multihost.transport import Connection, SSHOptions, connect

MAX_LINE = 16 * 1024  # bytes of one line passed on as an event; the log file keeps them all
LAST_LINE = 512  # characters of the last line kept for the summary and run.json
_MARK = RESULT_MARKER.encode()


@dataclass(frozen=True)
class Exit:
    """How the job ended, read from the host's state files."""

    code: int  # -1 when there is none (see ``problem``)
    started_at: float | None
    ended_at: float | None
    stopped_by: str | None
    problem: str | None = None  # "vanished": no process and no exit file; "empty": exit file
    escaped: int = 0  # processes that had left the job's process group, stopped at its end
    # its JAX process's start-up phases as the host's state files say (``results.phases.parse``)
    startup: tuple[tuple[str, float], ...] = ()
    stepped: int = 0  # the job's processes that logged steps (the hook's; multihost plot)

    @property
    def reason(self) -> str | None:
        """Why there is no exit code, in words (None when there is one)."""
        return PROBLEMS.get(self.problem or "")


PROBLEMS = {
    "vanished": "vanished: its processes are gone and it left no exit code (the whole process "
    "group killed with SIGKILL, the OOM killer, or a reboot?)",
    "empty": "its exit file is empty: the host could not write it (disk full?)",
}


class LogSink:
    """Appends one host's bytes to its local log file and cuts them into lines.

    The file's size is the offset: what is on disk locally is exactly what was received. The
    file keeps every byte; what is passed on as a line event is cut at ``MAX_LINE`` bytes and
    the last line kept for the summary at ``LAST_LINE`` characters, so the runner's memory and
    CPU stay bounded whatever the host prints (one 20 MB line, binary, no trailing newline).
    The lines a chunk completes go out as one event, decoded in one go when none is long.
    """

    def __init__(self, host: Host, path: Path, emit: Callable[[Line], None]) -> None:
        self.host = host
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(fd, "ab")
        self.offset = self._file.tell()
        self._emit = emit
        self._partial = bytearray()  # the current line's first MAX_LINE bytes
        self._cut = 0  # bytes of the current line beyond those
        self.last_line = _last_line(path) if self.offset else ""
        self.last_output = time.monotonic()  # when bytes last arrived (or the sink opened)
        # whether the log may hold a result line (read when the run's results are collected)
        self.may_have_result = self.offset > 0
        self._seam = b""  # the last bytes of the previous chunk: a marker may straddle two

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self._file.write(data)
        self._file.flush()
        self.offset += len(data)
        self.last_output = time.monotonic()
        if _MARK in data or _MARK in self._seam + data[: len(_MARK)]:
            self.may_have_result = True
        self._seam = data[-len(_MARK) :]
        end = data.rfind(b"\n")
        if end < 0:
            self._keep(data)
            return
        first = data.find(b"\n")
        self._keep(data[:first])
        texts = [self._text(bytes(self._partial), self._cut)]
        self._partial.clear()
        self._cut = 0
        if first < end:
            body = data[first + 1 : end]
            if end - first <= MAX_LINE or max(map(len, body.split(b"\n"))) <= MAX_LINE:
                more = body.decode(errors="replace").split("\n")  # no line to cut: at once
                texts += [t.rstrip("\r") for t in more] if b"\r" in body else more
            else:
                texts += [
                    self._text(raw[:MAX_LINE], len(raw) - MAX_LINE) for raw in body.split(b"\n")
                ]
        self._keep(data[end + 1 :])
        self._publish(texts)

    def _keep(self, piece: bytes) -> None:
        room = max(0, MAX_LINE - len(self._partial))
        self._partial += piece[:room]
        self._cut += max(0, len(piece) - room)

    @staticmethod
    def _text(raw: bytes, cut: int) -> str:
        text = raw.decode(errors="replace").rstrip("\r")
        return f"{text} … [{cut} more bytes in the log]" if cut > 0 else text

    def _publish(self, texts: list[str]) -> None:
        last = next((t for t in reversed(texts) if t.strip()), None)
        if last is not None:
            self.last_line = clip(last)
        self._emit(Line(self.host, "output", tuple(texts)))

    def close(self) -> None:
        if self._partial or self._cut:
            self._publish([self._text(bytes(self._partial), self._cut)])
            self._partial.clear()
            self._cut = 0
        self._file.close()


def clip(text: str, limit: int = 0) -> str:
    """``text`` cut to ``limit`` (default ``LAST_LINE``) characters, with a marker if cut."""
    limit = limit or LAST_LINE
    if len(text) <= limit:
        return text
    return text[:limit] + f" … [{len(text) - limit} more characters]"


def classify(exit_info: Exit) -> State:
    """Exit code 0 is done; stopped by us or by a signal (128+N) is killed; gone without an
    exit code is vanished; else failed."""
    if exit_info.problem == "vanished":
        return State.VANISHED
    if exit_info.problem:
        return State.FAILED
    if exit_info.code == 0:
        return State.DONE
    if exit_info.stopped_by or 128 < exit_info.code <= 128 + 64:
        return State.KILLED
    return State.FAILED


_SIGNALS = frozenset(s.name.removeprefix("SIG") for s in signals.Signals)


def code_and_signal(exit_info: Exit, state: State) -> tuple[int | None, int | None]:
    """The exit code and the signal a host's result shows for its exit: no code when there is
    none (a ``problem``); a signal only when the host was killed: the one it was stopped with,
    else N of an exit code 128+N."""
    code = None if exit_info.problem else exit_info.code
    if state is not State.KILLED:
        return code, None
    stopped = exit_info.stopped_by
    signal = signals.Signals[f"SIG{stopped}"].value if stopped in _SIGNALS else None
    if signal is None and code is not None and code > 128:
        signal = code - 128
    return code, signal


def _last_line(path: Path) -> str:
    """The last non-blank line already in a local log (for a run followed again)."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4096))
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    return clip(lines[-1]) if lines else ""


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_exit(header: str) -> Exit | None:
    """``EXIT STARTED ENDED STOPPED [ESCAPED [STARTUP]]`` (``finish_command``'s first line);
    None while the job has not ended. EXIT may be ``vanished`` or ``empty`` instead of a
    code."""
    code, started, ended, stopped, escaped, startup = (header.split() + ["-"] * 6)[:6]
    problem = code if code in PROBLEMS else None
    if not code.lstrip("-").isdigit() and problem is None:
        return None
    return Exit(
        -1 if problem else int(code),
        _number(started),
        _number(ended),
        None if stopped == "-" else stopped,
        problem,
        int(escaped) if escaped.isdigit() else 0,
        tuple(parse_startup(startup).items()),
    )


def parse_watch_end(stderr: bytes) -> tuple[Exit, int] | None:
    """The ``end EXIT STARTED ENDED STOPPED SIZE ESCAPED STARTUP [STEPPED]`` line
    ``watch_command`` writes last on stderr: the exit and the log's size."""
    lines = stderr.decode(errors="replace").splitlines()
    words = lines[-1].split() if lines else []
    if len(words) not in (7, 8, 9) or words[0] != "end" or not words[5].isdigit():
        return None
    exit_info = parse_exit(" ".join([*words[1:5], *words[6:8]]))
    if exit_info is None:
        return None
    if len(words) == 9 and words[8].isdigit():
        exit_info = replace(exit_info, stepped=int(words[8]))
    return exit_info, int(words[5])


async def follow(
    conn: Connection, paths: Paths, sink: LogSink, started: Started | None = None
) -> Exit:
    """Stream a host's log until its exit file appears; fetch what the stream had not brought
    yet (if anything) and the exit code. ``started``: the launch's own channel, already
    streaming the log (``Ready.started``), read instead of opening a watch."""
    if started is None:
        stderr = bytearray()
        chunks = conn.stream(watch_command(paths, sink.offset), stderr)
    else:
        stderr, chunks = started.stderr, started.output
    async for chunk in chunks:
        sink.feed(chunk)
    end = parse_watch_end(bytes(stderr))
    if end is not None and sink.offset >= end[1]:
        return end[0]  # the usual case: no second channel needed
    header = await fetch_rest(conn, paths, sink.offset, sink.feed)
    if end is not None:  # the stream had fallen behind; now it has everything
        return end[0]
    exit_info = parse_exit(header)
    if exit_info is None:
        raise HostLost(conn.host, "log stream ended before the job did")
    return exit_info


async def fetch_rest(
    conn: Connection, paths: Paths, offset: int, write: Callable[[bytes], object]
) -> str:
    """Stream the log beyond ``offset`` into ``write`` chunk by chunk (never the whole rest in
    memory); returns the state header (``finish_command``'s first line)."""
    head = bytearray()
    header: str | None = None
    async for chunk in conn.stream(finish_command(paths, offset)):
        if header is not None:
            write(chunk)
            continue
        head += chunk
        line, newline, rest = bytes(head).partition(b"\n")
        if not newline:
            if len(head) > 4096:
                raise RemoteError(conn.host, "unreadable run state on the host")
            continue
        if line.strip() == b"missing":
            raise RunDirGone(conn.host, f"run directory {paths.run} is gone from the host")
        header = line.decode(errors="replace")
        write(rest)
    if header is None:
        raise HostLost(conn.host, "connection ended while reading the run's state")
    return header


class Follower:
    """Follows one host's log to its exit across lost connections: reconnects with backoff
    and resumes at the local file's byte offset; gives up after ``reconnect_timeout`` s without
    a connection (or at once when ``give_up`` says so)."""

    def __init__(
        self,
        host: Host,
        paths: Paths,
        sink: LogSink,
        ssh: SSHOptions,
        *,
        conn: Connection | None,
        reconnect_timeout: float,
        on_state: Callable[[State, str], None],
        give_up: Callable[[], bool] = lambda: False,
        started: Started | None = None,
    ) -> None:
        self.host, self.paths, self.sink, self.ssh = host, paths, sink, ssh
        self.conn = conn  # replaced after a reconnect; the caller closes the last one
        self._reconnect_timeout = reconnect_timeout
        self._on_state = on_state
        self._give_up = give_up
        self._started = started  # the launch's channel, for the first follow only

    async def follow(self) -> Exit:
        deadline: float | None = None
        delay = DEFAULTS.reconnect_first_delay
        lost = ""  # why the connection went: kept when reconnecting then times out
        while True:
            if self.conn is None:
                # No attempt may outlive the deadline: give up on time, not a handshake later.
                left = self._reconnect_timeout if deadline is None else deadline - time.monotonic()
                try:
                    async with asyncio.timeout(max(0.0, left)):
                        self.conn = await connect(self.host, self.ssh)
                    self._on_state(State.RUNNING, "connected")
                    deadline, delay = None, DEFAULTS.reconnect_first_delay
                except HostError as exc:
                    reason = exc.message
                except TimeoutError:
                    reason = f"{lost}; " if lost else ""
                    reason += "no connection before the reconnect timeout"
            if self.conn is not None:
                started, self._started = self._started, None
                try:
                    return await follow(self.conn, self.paths, self.sink, started)
                except HostLost as exc:
                    reason = lost = exc.message
                    with contextlib.suppress(Exception):  # the connection is gone already
                        await self.conn.close()
                    self.conn = None
            now = time.monotonic()
            deadline = deadline or now + self._reconnect_timeout
            if now >= deadline or self._give_up():
                raise HostLost(self.host, f"{reason}; gave up reconnecting")
            self._on_state(State.RECONNECTING, reason)
            await asyncio.sleep(min(delay, deadline - now))
            delay = min(delay * 2, DEFAULTS.reconnect_max_delay)
