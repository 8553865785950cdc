"""Taking a trace: every JAX process of a run traces the same seconds, then the files come back.

On each host one script writes the run's ``hook/trace.request`` (capture name, a common start
time, seconds); the hook's watcher thread in every process that imported jax picks it up (see
``diagnose/hook.py``). The script waits, bounded, until each such process of the run says it is
done or failed (or is gone), prints one line per process, and the runner pulls
``<run dir>/traces/<capture>/`` into ``<local run dir>/traces/<capture>/<host>/``.
"""

from __future__ import annotations

import asyncio
import math
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

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
    # alive or not is read before the answers: a process that writes its answer as it exits
    # (the job ended during the capture) is gone only if it had none before it went
    alive=1
    [ -d "/proc/$p" ] || alive=0
    if [ -e "$d/$p.$capture.done" ]; then
      printf 'done %s %s\n' "$p" "$(cat "$d/$p.$capture.done")"
    elif [ -e "$d/$p.$capture.error" ]; then
      printf 'error %s %s\n' "$p" "$(head -c 500 "$d/$p.$capture.error")"
    elif [ "$alive" = 0 ]; then
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
        script = f"sh -c {shlex.quote(STEPPING)} sh {shlex.quote(run_dirs[host.process_id])}"
        res = await conns[host.process_id].run(script)
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
