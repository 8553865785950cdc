"""Taking a trace: every JAX process of a run traces the same seconds, then the files come back.

On each host one script writes the run's ``hook/trace.request`` (capture name, a common start
time, seconds); the hook's watcher thread in every process that imported jax picks it up (see
``diagnose/hook.py``). The script waits, bounded, until each such process of the run says it is
done or failed (or is gone), prints one line per process, and the runner pulls
``<run dir>/traces/<capture>/`` into ``<local run dir>/traces/<capture>/<host>/``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multihost.copyback import pull_host
from multihost.defaults import DEFAULTS
from multihost.diagnose.traces import HostTrace, host_trace, slowest
from multihost.errors import UsageError
from multihost.fanout import map_hosts
from multihost.model import Host
from multihost.transport import Connection, SSHOptions, connect

START_MARGIN_S = 1.5  # the request reaches every host before the common start time
END_MARGIN_S = 30.0  # after start + seconds, a process that has not said it is done is late

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

# Vars: $1 run dir. Prints "now T" (host clock), then "p PID STEPPING STEPPED BACKEND" for every
# process of the run that imported jax ("-" for a mark not yet there): what ``run --trace``
# waits for. Builtins only, but for the environ check of each process.
STEPPING = r"""
r=$1
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
d=$r/hook
echo "now $(date +%s.%N)"
if [ -e "$r/exit" ]; then echo finished; exit 0; fi
for m in "$d"/*.trace-ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.trace-ready}
  [ -d "/proc/$p" ] || continue
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qxF "MULTIHOST_STACK_DIR=$d" || continue
  s=; e=; b=
  { read -r s < "$d/$p.stepping"; } 2>/dev/null
  { read -r e < "$d/$p.stepped"; } 2>/dev/null
  { read -r b < "$d/$p.backend"; } 2>/dev/null
  echo "p $p ${s:--} ${e:--} ${b:--}"
done
"""


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


@dataclass(frozen=True)
class ProcessTrace:
    """One process's answer: ``done``, ``error``, ``gone``, ``late`` or ``nojax``."""

    pid: int
    state: str
    detail: str = ""  # done: "BEGAN END full|exit STEPS MEDIAN" (host clock), else the reason

    def traced(self) -> tuple[float, bool] | None:
        """A done process's traced seconds, and whether its program exited during them."""
        parts = self.detail.split()
        if self.state != "done" or len(parts) < 2:
            return None
        try:
            return max(0.0, float(parts[1]) - float(parts[0])), parts[2:3] == ["exit"]
        except ValueError:
            return None

    def counted(self) -> tuple[int, float] | None:
        """The steps that ended during the capture and their median duration, as the hook
        timed them (a step that began before the capture included); None when not said."""
        parts = self.detail.split()
        if self.state != "done" or len(parts) < 5 or not parts[3].isdigit():
            return None
        try:
            return int(parts[3]), float(parts[4])
        except ValueError:
            return None


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
    reasons = [f"pid {p.pid} {GONE if p.state == 'gone' else p.state}"
               f"{': ' + p.detail if p.detail else ''}"
               for p in capture.processes if p.state != "nojax"]  # fmt: skip
    return "; ".join(reasons) or "no process traced"


GONE = "ended before its trace was written (killed, or its job ended as the capture began)"


def in_words(result: Capture) -> tuple[str, str]:
    """The capture in one line and its level: how many hosts traced, and when the job ended
    during it, how far the capture got and what to change."""
    hosts = result.hosts
    traced = sum(1 for h in hosts if h.row is not None and h.row.stats is not None)
    line = f"trace {result.name}: {traced}/{len(hosts)} host(s) traced, in {result.folder}"
    level = "info" if traced == len(hosts) else "warning"
    cut = [w[0] for h in hosts for p in h.processes if (w := p.traced()) is not None and w[1]]
    if cut:
        got = min(cut)
        line += (f"; the job ended {got:.1f} s into the {result.seconds:g} s capture (kept what "
                 f"ran until then): for a whole window, trace less (--trace {max(got, 0.1):.1f})"
                 " or run more steps")  # fmt: skip
        level = "warning"
    elif traced < len(hosts) and any("finished" in (h.error or "") for h in hosts):
        line += ("; the job ended before the capture began: run more steps, or start sooner "
                 "(a smaller --trace-after)")  # fmt: skip
    return line, level


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
    row = with_counted(host_trace(host.name, dest, host_error(answer)), processes)
    return HostCapture(host, answer.processes, answer.error, row)


def with_counted(row: HostTrace, processes: Sequence[ProcessTrace]) -> HostTrace:
    """The row with the steps the hook counted (the process with the most stands for the
    host): every step that ended in the capture, where the trace itself shows only those that
    also began in it (none at all when a step is longer than half the capture)."""
    counts = [c for p in processes if (c := p.counted()) is not None]
    if row.stats is None or not counts:
        return row
    steps, median = max(counts)
    stats = replace(row.stats, steps=steps, median_step_s=median if steps else None)
    return replace(row, stats=stats)


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
        script = f"sh -c {shlex.quote(STEPPING)} sh {shlex.quote(run_dirs[host.process_id])}"
        res = await conns[host.process_id].run(script)
        return ready_ago(res.stdout.decode(errors="replace"), after)

    while True:
        outcomes = await map_hosts(ask, list(hosts), timeout=DEFAULTS.command_timeout,
                                   what="trace readiness")  # fmt: skip
        ages = [o.value for o in outcomes if o.value is not None]
        if len(ages) == len(hosts):
            if all(math.isinf(a) for a in ages):
                return False
            youngest = min(ages)
            if after is not None and youngest < after:
                await asyncio.sleep(after - youngest)
            return True
        await asyncio.sleep(poll)


def save_rows(result: Capture) -> Path:
    """The capture's rows as ``summary.json`` in its folder (``run --trace`` shows them after
    the run); returns the file."""
    data = summary(result)
    path = result.folder / "summary.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    return path


def rows(result: Capture) -> list[dict[str, object]]:
    """One dict per host: what the table shows and ``--json`` prints."""
    out: list[dict[str, object]] = []
    for h in result.hosts:
        row = h.row
        stats = row.stats if row is not None else None
        windows = [w for p in h.processes if (w := p.traced()) is not None]
        out.append({
            "host": h.host.name,
            "ok": stats is not None,
            "traced_s": max((s for s, _ in windows), default=None),
            "cut": any(cut for _, cut in windows),  # the job ended during the capture
            "span_s": stats.span_s if stats else None,
            "step_name": stats.step_name if stats else None,
            "steps": stats.steps if stats else 0,
            "median_step_s": stats.median_step_s if stats else None,
            "xla_busy": stats.busy if stats else None,
            "files": list(row.files) if row else [],
            "error": row.error if row else h.error,
            "skipped": [{"pid": p.pid, "command": p.detail}
                        for p in h.processes if p.state == "nojax"],
        })  # fmt: skip
    return out


def summary(result: Capture) -> dict[str, Any]:
    """The capture as data (``--json``, ``summary.json``)."""
    worst = slowest([h.row for h in result.hosts if h.row is not None])
    return {"capture": result.name, "folder": str(result.folder), "seconds": result.seconds,
            "hosts": rows(result),
            "slowest": {"host": worst[0], "gap": worst[1]} if worst else None}  # fmt: skip
