"""Why a JAX job died through its coordination service, in words, naming the host.

When one process of a JAX job fails in a way the coordination service sees (a second process
joins under a process id already taken, a process stops sending heartbeats, a barrier times
out, the coordinator goes away, the job never forms), the service aborts EVERY process: each
ends with SIGABRT after one ``Terminating process because the JAX distributed service detected
fatal errors ... absl::Status: ...`` line. The status names the tasks at fault by number, and a
task's number is its JAX process id, which multihost maps to a host (``s{slice}/w{worker}``).

Pure: ``find_fault`` reads one host's log text, ``explain`` turns every host's finding into
each host's cause. The texts are jax 0.10.2's (tests/fixtures/jax_faults, captured on CPU).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TAIL = 256 * 1024  # bytes of a log's end read: the abort is its last words, but for a stack

FATAL = "Terminating process because the JAX distributed service detected fatal errors"
PROPAGATED = "Use error polling to propagate the following error to all tasks:"
# a fatal line's status runs to the stack trace that follows it (its RPC line included)
_STATUS = re.compile(
    re.escape(FATAL) + r"[^\n]*?absl::Status: (.*?)(?=\n\*\*\* Check failure|\n[EFIW]\d{4} |\Z)",
    re.S,
)
_PROPAGATED = re.compile(re.escape(PROPAGATED) + r" (.*?)(?=\n[EFIW]\d{4} |\Z)", re.S)
_TASK = re.compile(r"^(?:/job:[\w.-]+/replica:\d+/task:)?(\d+)$")
_INCARNATION = re.compile(r"(\S+) unexpectedly tried to connect with a different incarnation")
_HEARTBEAT = "The following tasks are unhealthy (stopped sending heartbeats):"
_BARRIER = re.compile(r"Barrier timed out\. Id: (\S+?)\.(?:\s|$)")
_BARRIER_TASKS = "Some timed out task names:"
_LEADER = "Failed to send RPC to coordination service. Either the leader task"
_JOIN = "/xla.coordination.CoordinationService/RegisterTask"

# what each kind of fault says of the tasks it names, most telling first (``explain`` takes
# the first kind that any host's log shows)
KINDS = ("incarnation", "heartbeat", "leader", "barrier", "join", "other")


@dataclass(frozen=True)
class Fault:
    """What one host's log says the JAX coordination service did to it.

    ``kind``: ``incarnation`` (a process joined under a JAX process id already in the job),
    ``heartbeat`` (tasks stopped sending heartbeats), ``leader`` (the coordinator, JAX process
    0, stopped answering), ``barrier`` (tasks never reached a barrier; ``barrier`` is its id),
    ``join`` (the job never formed: jax.distributed.initialize timed out waiting for every
    process; the service names no task) or ``other``. ``tasks``: the JAX process ids it names.
    ``status``: the service's own words, first line."""

    kind: str
    tasks: tuple[int, ...] = ()
    barrier: str = ""
    status: str = ""


def find_fault(text: str) -> Fault | None:
    """The coordination service's fault in one host's log text (its end is enough), or None
    when no process there died of one. Every fatal status and every error the coordinator
    propagated counts, the most telling kept: a log may also hold a helper process's abort
    (a child that still waited to join when its parent's job was gone)."""
    statuses = [m.group(1) for m in _STATUS.finditer(text)]
    statuses += [m.group(1) for m in _PROPAGATED.finditer(text)]
    faults = [classify(s) for s in statuses]
    return min(faults, key=lambda f: KINDS.index(f.kind), default=None)


def classify(status: str) -> Fault:
    """A coordination-service status (the text after ``absl::Status:``) as a ``Fault``."""
    first = status.strip().split("\n", 1)[0][:300]
    if found := _INCARNATION.search(status):
        return Fault("incarnation", _tasks([found.group(1)]), status=first)
    if _HEARTBEAT in status:
        return Fault("heartbeat", _tasks_after(status, _HEARTBEAT), status=first)
    if _LEADER in status:
        return Fault("leader", (0,), status=first)
    if found := _BARRIER.search(status):
        return Fault(
            "barrier", _tasks_after(status, _BARRIER_TASKS), barrier=found.group(1), status=first
        )
    if _JOIN in status and "DEADLINE_EXCEEDED" in status:
        return Fault("join", status=first)
    return Fault("other", status=first)


def _tasks(words: list[str]) -> tuple[int, ...]:
    return tuple(int(m.group(1)) for w in words if (m := _TASK.match(w.strip())))


def _tasks_after(status: str, heading: str) -> tuple[int, ...]:
    """The task names listed one per line after ``heading``."""
    found: list[int] = []
    for line in status.split(heading, 1)[1].split("\n")[1:]:
        task = _tasks([line])
        if not task:
            break
        found += task
    return tuple(found)


def read_fault(path: Path) -> Fault | None:
    """``find_fault`` over the end of a log file (a missing file has none)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL))
            return find_fault(f.read().decode(errors="replace"))
    except OSError:
        return None


def explain(faults: Mapping[int, Fault | None], names: Mapping[int, str]) -> dict[int, str]:
    """Each host's cause, by process id, from every host's fault so far (``names``: every
    host of the job by JAX process id). A host at fault gets what it did ("a second process
    joined as JAX process 1"); a host whose own process the service aborted gets why, naming
    the host at fault ("aborted by JAX's coordination service because of s0/w1: stopped
    answering (heartbeat timed out)"); others get nothing. A job that never formed names the
    one host that did not join when every other host is known to have waited (else the hosts
    among which it is)."""
    found = {pid: f for pid, f in faults.items() if f is not None}
    if not found:
        return {}
    kind = next(k for k in KINDS if any(f.kind == k for f in found.values()))
    root = [f for f in found.values() if f.kind == kind]
    if kind == "join":
        return _never_joined(found, names)
    if kind == "other":
        return {
            pid: f"aborted by JAX's coordination service: {f.status}" for pid, f in found.items()
        }
    culprits = sorted({t for f in root for t in f.tasks})
    what = _what(root[0])
    why = f"aborted by JAX's coordination service because of {_names(culprits, names)}: {what}"
    return dict.fromkeys(found, why) | dict.fromkeys((c for c in culprits if c in names), what)


def _what(fault: Fault) -> str:
    """What the hosts a fault names did, in words."""
    if fault.kind == "incarnation":
        return "a second process joined as JAX process {}".format(*fault.tasks or ("?",))
    if fault.kind == "heartbeat":
        return "stopped answering (heartbeat timed out)"
    if fault.kind == "leader":
        return "stopped answering as the JAX job's coordinator (JAX process 0)"
    if fault.barrier.startswith("Shutdown"):
        return "did not reach the end-of-job barrier in time (shutdown barrier timed out)"
    return f"did not reach barrier {fault.barrier} in time (barrier timed out)"


def _never_joined(found: Mapping[int, Fault], names: Mapping[int, str]) -> dict[int, str]:
    """The job never formed: the hosts whose log shows the wait timed out waited; at least one
    of the others never joined (had every process joined, the job would have formed)."""
    waited = {pid for pid, f in found.items() if f.kind == "join"}
    others = sorted(set(names) - waited)
    waiting = (
        "gave up waiting for every process to join the JAX job "
        "(jax.distributed.initialize timed out)"
    )
    if len(others) == 1:
        (late,) = others
        causes = {
            pid: f"gave up waiting for {names[late]} to join the JAX job "
            "(jax.distributed.initialize timed out)"
            for pid in waited
        }
        causes[late] = "never joined the JAX job (the others timed out waiting for it)"
        return causes
    why = f"{waiting}: not all of {_names(others, names)} joined" if others else waiting
    return dict.fromkeys(waited, why)


def _names(pids: list[int], names: Mapping[int, str]) -> str:
    return ", ".join(names.get(p, f"JAX process {p}") for p in pids)
