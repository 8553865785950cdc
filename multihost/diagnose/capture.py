"""Taking a trace: every JAX process of a run traces the same seconds, then the files come back.

On each host one script (``remote/trace.sh``) writes the run's ``hook/trace.request`` (capture
name, a common start time, seconds); the hook's watcher thread in every process that imported
jax picks it up (see ``diagnose/hook.py``). The script waits, bounded, until each such process
of the run says it is done or failed (or is gone), prints one line per process, and the runner
pulls ``<run dir>/traces/<capture>/`` into ``<local run dir>/traces/<capture>/<host>/``.
"""

from __future__ import annotations

import asyncio
import math
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from multihost import remote
from multihost.defaults import DEFAULTS
from multihost.diagnose.captured import (
    Capture,
    HostCapture,
    host_error,
    parse_answer,
    with_counted,
)
from multihost.diagnose.traces import HostTrace, host_trace
from multihost.errors import UsageError
from multihost.model import Host
from multihost.runs.pull import pull_host
from multihost.transport import Connection, SSHOptions, connect
from multihost.transport.fanout import map_hosts

START_MARGIN_S = 1.5  # the request reaches every host before the common start time
END_MARGIN_S = 30.0  # after start + seconds, a process that has not said it is done is late

TRACE = remote.load("trace")  # r capture start_at seconds deadline
STEPPING = remote.load("stepping")  # r: what ``run --trace`` waits for


def ready_ago(text: str, after: float | None = None) -> float | None:
    """From a host's STEPPING answer: how many seconds ago its last JAX process became ready
    to trace. By default (``after`` None) when its first annotated step completed (compiled
    and run once; a first step still running is waited for, however long); with ``after``
    (``--trace-after``) when it began its first step, or, annotating none, made its first JAX
    computation. None while any is not ready, or none imported jax; infinity when the host's
    job has ended (nothing to wait for there)."""
    now, moments = None, []
    for line in text.splitlines():
        word, *rest = line.split() or [""]
        try:
            if word == "finished":  # this host's job has ended: nothing to wait for here
                return math.inf
            if word == "now" and rest:
                now = float(rest[0])
            elif word == "p" and len(rest) == 4:
                began, stepped, backend = rest[1:]
                moment = stepped if after is None else (began if began != "-" else backend)
                if moment == "-":
                    return None
                moments.append(float(moment))
        except ValueError:
            return None
    if now is None or not moments or max(moments) > now:
        return None
    return now - max(moments)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def capture_name(now: float | None = None) -> str:
    """A capture's default name: its UTC time (sortable)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))


def new_folder(local_run_dir: Path, name: str) -> tuple[str, Path]:
    """A fresh ``traces/<name>`` folder (``name.2``… when taken): an earlier capture is never
    overwritten."""
    if not _NAME.fullmatch(name):
        raise UsageError(f"not a capture name: {name!r} (letters, digits, '._-')")
    base = local_run_dir / "traces"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    chosen, n = name, 1
    while (base / chosen).exists():
        n += 1
        chosen = f"{name}.{n}"
    (base / chosen).mkdir(mode=0o700)
    return chosen, base / chosen


def trace_command(run_dir: str, capture: str, start_at: float, seconds: float) -> str:
    """The host's script with its five arguments, quoted."""
    deadline = int(start_at + seconds + END_MARGIN_S) + 1
    text = remote.script(
        TRACE,
        r=run_dir,  # as given: the script expands a leading ~ itself
        capture=capture,
        start_at=f"{start_at:.3f}",
        seconds=f"{seconds:g}",
        deadline=deadline,
    )
    return f"sh -c {shlex.quote(text)}"


def stepping_command(run_dir: str) -> str:
    """The host's readiness script (see :func:`ready_ago`) for the run in ``run_dir``."""
    return f"sh -c {shlex.quote(remote.script(STEPPING, r=run_dir))}"


async def capture(
    hosts: Sequence[Host],
    run_dirs: Mapping[int, str],
    local_run_dir: Path,
    *,
    seconds: float,
    name: str | None = None,
    conns: Mapping[int, Connection] | None = None,
    ssh: SSHOptions | None = None,
    limit: int = DEFAULTS.connect_limit,
) -> Capture:
    """Trace every host's JAX processes for ``seconds`` from one common start, pull the traces
    back and read them; every host yields a row (a failure is a row with its reason). Over a
    live run's connections (``conns``) or new ones (``ssh``, ``limit`` handshakes at a time)."""
    if not 0 < seconds <= DEFAULTS.trace_max:
        raise UsageError(
            f"--seconds must be over 0 and at most {DEFAULTS.trace_max:g}, not {seconds:g}"
        )
    chosen, folder = new_folder(local_run_dir, name or capture_name())
    start_at = time.time() + START_MARGIN_S
    gate = asyncio.Semaphore(limit)

    async def one(host: Host) -> HostCapture:
        if conns is not None:
            return await _one(
                conns[host.process_id],
                host,
                run_dirs[host.process_id],
                chosen,
                folder,
                start_at,
                seconds,
            )
        assert ssh is not None
        async with gate:
            conn = await connect(host, ssh)
        try:
            return await _one(
                conn, host, run_dirs[host.process_id], chosen, folder, start_at, seconds
            )
        finally:
            await conn.close()

    timeout = START_MARGIN_S + seconds + END_MARGIN_S + DEFAULTS.command_timeout
    outcomes = await map_hosts(one, list(hosts), timeout=timeout, what="trace")
    rows: list[HostCapture] = []
    for o in outcomes:
        if o.value is not None:
            rows.append(o.value)
        else:
            reason = o.error.message if o.error else "failed"
            rows.append(HostCapture(o.host, (), reason, HostTrace(o.host.name, None, (), reason)))
    return Capture(chosen, folder, seconds, tuple(rows))


async def _one(
    conn: Connection,
    host: Host,
    run_dir: str,
    chosen: str,
    folder: Path,
    start_at: float,
    seconds: float,
) -> HostCapture:
    res = await conn.run(trace_command(run_dir, chosen, start_at, seconds))
    processes, error = parse_answer(res.stdout.decode(errors="replace"))
    answer = HostCapture(host, processes, error)
    dest = folder / host.file_stem
    if any(p.state == "done" for p in processes):
        work = f"{run_dir.rstrip('/')}/traces/{chosen}"
        pulled = await pull_host(conn, work, ["."], dest, lambda _e: None)
        if not pulled.ok and not pulled.files:
            answer = HostCapture(host, processes, "; ".join(pulled.errors))
    row = with_counted(host_trace(host.name, dest, host_error(answer)), processes)
    return HostCapture(host, answer.processes, answer.error, row)


async def when_stepping(
    hosts: Sequence[Host],
    conns: Mapping[int, Connection],
    run_dirs: Mapping[int, str],
    after: float | None,
    *,
    poll: float = 0.5,
) -> bool:
    """Return once every JAX process of the run completed its first step, or ``after``
    seconds after each began it (see :func:`ready_ago`), asking every host each ``poll``
    seconds (a host that cannot answer is asked again); False at once when every host's job
    has ended. The run's end cancels it."""

    async def ask(host: Host) -> float | None:
        res = await conns[host.process_id].run(stepping_command(run_dirs[host.process_id]))
        return ready_ago(res.stdout.decode(errors="replace"), after)

    while True:
        outcomes = await map_hosts(
            ask, list(hosts), timeout=DEFAULTS.command_timeout, what="trace readiness"
        )
        ages = [o.value for o in outcomes if o.value is not None]
        if len(ages) == len(hosts):
            if all(math.isinf(a) for a in ages):
                return False
            youngest = min(ages)
            if after is not None and youngest < after:
                await asyncio.sleep(after - youngest)
            return True
        await asyncio.sleep(poll)
