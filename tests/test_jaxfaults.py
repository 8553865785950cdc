"""A JAX job that its coordination service aborts says why, naming the host at fault: the
parsing of the service's words (pure), on texts jax 0.10.2 printed for real.

tests/fixtures/jax_faults holds whole logs of processes of real multi-process JAX jobs on CPU
(``jax.distributed.initialize`` on 127.0.0.1, JAX_PLATFORMS=cpu):

- incarnation_*: a 2-process job whose process 1 started a child Python that joined with its
  parent's ids (the worker's log also holds the orphaned child's own abort, 5 minutes later);
- heartbeat_*: a 4-process job, processes 1 and 2 SIGSTOPped (heartbeat_timeout_seconds=3);
  heartbeat_one: a 3-process job, process 1 SIGKILLed;
- join_timeout*: a process of a 2-process job alone (initialization_timeout=5; the verbose one
  with TF_CPP_MIN_LOG_LEVEL=0);
- shutdown_barrier_*: a 3-process job whose process 2 slept past shutdown_timeout_seconds=3;
- leader_gone: a 3-process job whose process 0 (the coordinator) was SIGKILLed.

The end-to-end runs that produce these under multihost are in tests/faults/test_jax.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from multihost.core.supervisor import Supervisor
from multihost.core.watch import explain_jax
from multihost.diagnose.jaxfaults import Fault, explain, find_fault, read_fault
from multihost.model import Fleet, Host, Job, State
from multihost.options import RunOptions
from multihost.results.faces import host_row
from multihost.results.records import HostResult
from multihost.runs.record import _host_entry, _host_of

FIXTURES = Path(__file__).parent / "fixtures" / "jax_faults"
NAMES = {i: f"s0/w{i}" for i in range(4)}


@pytest.mark.parametrize(
    ("log", "kind", "tasks"),
    [
        ("incarnation_coordinator", "incarnation", (1,)),
        ("incarnation_worker", "incarnation", (1,)),  # the child's later join abort ranks below
        ("heartbeat_coordinator", "heartbeat", (1, 2)),
        ("heartbeat_worker", "heartbeat", (1, 2)),
        ("heartbeat_one", "heartbeat", (1,)),
        ("join_timeout", "join", ()),
        ("join_timeout_verbose", "join", ()),
        ("shutdown_barrier_coordinator", "barrier", (2,)),
        ("shutdown_barrier_worker", "barrier", (2,)),
        ("leader_gone", "leader", (0,)),
    ],
)
def test_each_captured_abort_is_read(log: str, kind: str, tasks: tuple[int, ...]) -> None:
    fault = read_fault(FIXTURES / f"{log}.log")
    assert fault is not None
    assert (fault.kind, fault.tasks) == (kind, tasks)
    assert fault.status
    assert "\n" not in fault.status


def test_a_log_without_an_abort_has_no_fault(tmp_path: Path) -> None:
    assert find_fault("Traceback (most recent call last):\nValueError: bad\n") is None
    assert find_fault("") is None
    assert read_fault(tmp_path / "missing.log") is None
    # a task named the way other versions name it; a status never seen before still counts
    named = "F0 client.h:80] " + (
        "Terminating process because the JAX distributed service detected fatal errors. "
        "absl::Status: ABORTED: /job:jax_worker/replica:0/task:3 unexpectedly tried to connect "
        "with a different incarnation. It has likely restarted.\n*** Check failure stack trace:"
    )
    assert find_fault(named) == Fault(
        "incarnation",
        (3,),
        status="ABORTED: /job:jax_worker/replica:0/task:3 unexpectedly tried to connect with a "
        "different incarnation. It has likely restarted.",
    )
    odd = named.replace("ABORTED: /job:jax_worker/replica:0/task:3 unexpectedly", "NEW: it")
    assert find_fault(odd) == Fault("other", status=odd.split("absl::Status: ")[1].split("\n")[0])


def _fault(log: str) -> Fault | None:
    return read_fault(FIXTURES / f"{log}.log")


def test_the_host_at_fault_is_named_on_every_aborted_host() -> None:
    causes = explain({0: _fault("incarnation_coordinator"), 1: _fault("incarnation_worker")}, NAMES)
    joined = "a second process joined as JAX process 1"
    assert causes == {
        0: f"aborted by JAX's coordination service because of s0/w1: {joined}",
        1: joined,
    }
    # SIGSTOPped hosts say nothing themselves: the others' logs name them
    hung = explain(
        {0: _fault("heartbeat_coordinator"), 1: None, 2: None, 3: _fault("heartbeat_worker")}, NAMES
    )
    assert hung[1] == hung[2] == "stopped answering (heartbeat timed out)"
    assert (
        hung[0]
        == hung[3]
        == (
            "aborted by JAX's coordination service because of s0/w1, s0/w2: stopped answering "
            "(heartbeat timed out)"
        )
    )
    late = explain({0: _fault("shutdown_barrier_coordinator")}, NAMES)
    assert late[2] == "did not reach the end-of-job barrier in time (shutdown barrier timed out)"
    assert "because of s0/w2:" in late[0]
    gone = explain({1: _fault("leader_gone"), 2: _fault("leader_gone")}, NAMES)
    assert gone[0] == "stopped answering as the JAX job's coordinator (JAX process 0)"
    assert gone[1].startswith("aborted by JAX's coordination service because of s0/w0:")
    assert explain({}, NAMES) == explain({0: None}, NAMES) == {}
    # a task with no host in the run (a program's own ids) is named as JAX's, and on no row
    odd = explain({0: Fault("heartbeat", (7,))}, {0: "s0/w0"})
    assert set(odd) == {0}
    assert "because of JAX process 7" in odd[0]


def test_a_job_that_never_formed_names_who_did_not_join_when_it_can() -> None:
    """The service names nobody; the hosts whose wait timed out waited, and had every process
    joined the job would have formed: one host left is the one, several are among whom."""
    waited = _fault("join_timeout")
    two = explain({0: waited, 1: None}, {0: "s0/w0", 1: "s0/w1"})
    assert two == {
        0: "gave up waiting for s0/w1 to join the JAX job (jax.distributed.initialize timed out)",
        1: "never joined the JAX job (the others timed out waiting for it)",
    }
    four = explain({0: waited, 1: waited, 2: None, 3: None}, NAMES)
    assert set(four) == {0, 1}
    assert four[0].endswith("not all of s0/w2, s0/w3 joined")
    three = explain({0: waited, 1: waited, 2: waited, 3: None}, NAMES)
    assert three[3] == "never joined the JAX job (the others timed out waiting for it)"
    assert (
        three[0]
        == three[2]
        == ("gave up waiting for s0/w3 to join the JAX job (jax.distributed.initialize timed out)")
    )


def test_the_cause_leads_the_reason_and_the_raw_exit_stays() -> None:
    host = Host("local1", worker_id=1, process_id=1)
    aborted = HostResult(
        host, State.KILLED, exit_code=134, signal=6, cause="aborted by JAX's coordination service"
    )
    assert aborted.reason == (
        "aborted by JAX's coordination service; exited with code 134: killed by signal 6 (SIGABRT)"
    )
    assert host_row(aborted)[3] == "signal 6"
    stopped = HostResult(
        host,
        State.KILLED,
        signal=9,
        error="stopped by multihost (SIGKILL)",
        cause="stopped answering",
    )
    assert stopped.reason == "stopped answering; stopped by multihost (SIGKILL)"
    assert HostResult(host, State.DONE, exit_code=0).reason == ""
    # run.json keeps it, and a host without one is laid out as before
    entry = _host_entry(aborted)
    assert entry["cause"] == aborted.cause
    assert _host_of(entry, Path()) == aborted
    assert "cause" not in _host_entry(HostResult(host, State.FAILED, exit_code=1))


def _supervisor(n: int, tmp_path: Path, workers: str = "") -> Supervisor:
    hosts = tuple(Host(f"h{i}", worker_id=i, process_id=i) for i in range(n))
    job = Job("python x.py", "r", workers=workers)
    return Supervisor(Fleet(hosts), job, RunOptions(log_dir=tmp_path), None)


def test_a_run_explains_each_host_as_it_ends(tmp_path: Path) -> None:
    """The run's bookkeeping (core.watch.explain_jax): as each aborted host ends, every host's
    cause; a pod whose processes abort together costs one pass over the hosts, not one each."""
    sup = _supervisor(6, tmp_path)
    slots = list(sup.slots.values())
    joined = _fault("incarnation_coordinator")
    for slot in (slots[0], slots[3], slots[1], slots[5]):  # in the order they end
        slot.fault = joined
        explain_jax(sup, slot)
    full = explain(
        {s.host.process_id: s.fault for s in slots}, {i: s.host.name for i, s in sup.slots.items()}
    )
    assert {i: s.cause for i, s in sup.slots.items() if s.cause} == full  # as if all at once
    aborted = "aborted by JAX's coordination service because of s0/w1: a second process joined"
    assert slots[1].cause == "a second process joined as JAX process 1"
    for i in (0, 3, 5):
        assert (slots[i].cause or "").startswith(aborted)
    assert slots[2].cause is slots[4].cause is None  # not ended, or ended otherwise
    # on some hosts of a fleet (--workers) the ids are the program's: no host is blamed
    part = _supervisor(3, tmp_path, workers="0,2")
    first, second, third = part.slots.values()
    first.fault = joined
    explain_jax(part, first)
    assert first.cause == "aborted by JAX's coordination service because of JAX process 1: " + (
        "a second process joined as JAX process 1"
    )
    assert second.cause is third.cause is None
