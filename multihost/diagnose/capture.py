"""Taking a trace: every JAX process of a run traces the same seconds, then the files come back.

On each host one script writes the run's ``hook/trace.request`` (capture name, a common start
time, seconds); the hook's watcher thread in every process that imported jax picks it up (see
``diagnose/hook.py``). The script waits, bounded, until each such process of the run says it is
done or failed (or is gone), prints one line per process, and the runner pulls
``<run dir>/traces/<capture>/`` into ``<local run dir>/traces/<capture>/<host>/``.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.copyback import pull_host
from multihost.defaults import DEFAULTS
from multihost.diagnose.traces import HostTrace, host_trace
from multihost.errors import UsageError
from multihost.fanout import map_hosts
from multihost.model import Host
from multihost.transport import Connection, SSHOptions, connect

START_MARGIN_S = 1.5  # the request reaches every host before the common start time
END_MARGIN_S = 30.0
MAX_SECONDS = 3600  # after start + seconds, a process that has not said it is done is late

TRACE = r"""
r=$1 capture=$2 start_at=$3 seconds=$4 deadline=$5
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
d=$r/hook
test -d "$d" || { echo "nohook"; exit 0; }
if [ -e "$r/exit" ]; then echo "finished"; exit 0; fi
printf '{"capture": "%s", "start_at": %s, "seconds": %s}\n' "$capture" "$start_at" "$seconds" \
  > "$d/trace.request.$$" && mv -f "$d/trace.request.$$" "$d/trace.request"
mine() { tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | grep -qxF "MULTIHOST_STACK_DIR=$d"; }
pids=
for m in "$d"/*.trace-ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.trace-ready}
  mine "$p" && pids="$pids $p"
done
for m in "$d"/*.ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.ready}
  [ -e "$d/$p.trace-ready" ] && continue
  mine "$p" && printf 'nojax %s %s\n' "$p" "$(cat "$m" 2>/dev/null)"
done
[ -n "$pids" ] || { echo "none"; exit 0; }
left=$pids
while [ -n "$left" ]; do
  now=$(date +%s)
  rest=
  for p in $left; do
    if [ -e "$d/$p.$capture.done" ]; then
      printf 'done %s %s\n' "$p" "$(cat "$d/$p.$capture.done")"
    elif [ -e "$d/$p.$capture.error" ]; then
      printf 'error %s %s\n' "$p" "$(head -c 500 "$d/$p.$capture.error")"
    elif ! [ -d "/proc/$p" ]; then
      printf 'gone %s\n' "$p"
    elif [ "$now" -ge "$deadline" ]; then
      if [ -e "$d/$p.$capture.started" ]; then
        printf 'late %s started but did not finish\n' "$p"
      else
        printf 'late %s never started (busy in native code without releasing the GIL?)\n' "$p"
      fi
    else
      rest="$rest $p"
    fi
  done
  left=$rest
  [ -z "$left" ] || sleep 0.2
done
echo "end"
"""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class ProcessTrace:
    """One process's answer: ``done``, ``error``, ``gone``, ``late`` or ``nojax``."""

    pid: int
    state: str
    detail: str = ""


@dataclass(frozen=True)
class HostCapture:
    """One host's capture: its processes' answers, then its trace row once pulled."""

    host: Host
    processes: tuple[ProcessTrace, ...] = ()
    error: str | None = None  # the host as a whole (unreachable, no hook, run finished)
    row: HostTrace | None = None


@dataclass(frozen=True)
class Capture:
    """A whole capture: its name, where it came back to and every host's answer."""

    name: str
    folder: Path
    seconds: float
    hosts: tuple[HostCapture, ...]


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
    args = [run_dir, capture, f"{start_at:.3f}", f"{seconds:g}", str(deadline)]
    return f"sh -c {shlex.quote(TRACE)} sh " + " ".join(shlex.quote(a) for a in args)


def parse_answer(text: str) -> tuple[tuple[ProcessTrace, ...], str | None]:
    """The script's lines: the processes' answers and a host-wide error (or None)."""
    processes: list[ProcessTrace] = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "nohook":
            return (), "the run has no hook (started by an older multihost, or without Python)"
        if word == "finished":
            return (), "the run has finished on this host: nothing to trace"
        if word == "none" and not processes:
            return (), "no process of the run has imported jax"
        if word in ("done", "error", "gone", "late", "nojax"):
            pid, _, detail = rest.partition(" ")
            if pid.isdigit():
                processes.append(ProcessTrace(int(pid), word, detail.strip()))
    if not any(p.state != "nojax" for p in processes):
        if processes:
            return tuple(processes), "no process of the run has imported jax"
        return (), "the trace script ended early"
    return tuple(processes), None


def host_error(capture: HostCapture) -> str | None:
    """Why this host has no trace, in words; None when at least one process traced."""
    if capture.error is not None:
        return capture.error
    if any(p.state == "done" for p in capture.processes):
        return None
    reasons = [f"pid {p.pid} {p.state}{': ' + p.detail if p.detail else ''}"
               for p in capture.processes if p.state != "nojax"]  # fmt: skip
    return "; ".join(reasons) or "no process traced"


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
    if not 0 < seconds <= MAX_SECONDS:
        raise UsageError(f"--seconds must be over 0 and at most {MAX_SECONDS}, not {seconds:g}")
    chosen, folder = new_folder(local_run_dir, name or capture_name())
    start_at = time.time() + START_MARGIN_S
    gate = asyncio.Semaphore(limit)

    async def one(host: Host) -> HostCapture:
        if conns is not None:
            return await _one(conns[host.process_id], host, run_dirs[host.process_id],
                              chosen, folder, start_at, seconds)  # fmt: skip
        assert ssh is not None
        async with gate:
            conn = await connect(host, ssh)
        try:
            return await _one(conn, host, run_dirs[host.process_id], chosen, folder, start_at,
                              seconds)  # fmt: skip
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


async def _one(conn: Connection, host: Host, run_dir: str, chosen: str, folder: Path,
               start_at: float, seconds: float) -> HostCapture:  # fmt: skip
    res = await conn.run(trace_command(run_dir, chosen, start_at, seconds))
    processes, error = parse_answer(res.stdout.decode(errors="replace"))
    answer = HostCapture(host, processes, error)
    dest = folder / host.file_stem
    if any(p.state == "done" for p in processes):
        work = f"{run_dir.rstrip('/')}/traces/{chosen}"
        pulled = await pull_host(conn, work, ["."], dest, lambda _e: None)
        if not pulled.ok and not pulled.files:
            answer = HostCapture(host, processes, "; ".join(pulled.errors))
    row = host_trace(host.name, dest, host_error(answer))
    return HostCapture(host, answer.processes, answer.error, row)
