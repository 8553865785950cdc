"""Watching launched hosts: one worker per host follows its job to the exit (``stream.Follower``:
reconnect and resume), a watchdog takes stacks on request or when every host falls silent, and
the police loop applies the stop policy (failure, timeout, hang, interrupt) as hosts end.

All of it runs in one ``asyncio.TaskGroup``: an error in a worker is never dropped.

This watches a run multihost launched over SSH, live, through each host's connection. A
production job (``multihost job``) is watched elsewhere, by polling its queued resource and
its bucket from the runner (:mod:`multihost.job.watch`); the two share no code: nothing here
reaches a bucket, nothing there an SSH connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from multihost.core.livehost import LiveHost
from multihost.core.supervisor import Supervisor
from multihost.defaults import DEFAULTS
from multihost.errors import HostError, RunDirGone
from multihost.model import State, host_ranges
from multihost.runs.launch import stop
from multihost.runs.stream import Exit, Follower, classify

if TYPE_CHECKING:
    from multihost.diagnose.stacks import StackReport


async def watch_all(sup: Supervisor, started: float) -> None:
    """Follow every launched host to its exit, applying the stop policy as hosts end."""
    slots = [s for s in sup.slots.values() if s.sink is not None and s.state != State.ERROR]
    async with asyncio.TaskGroup() as tg:
        workers = {tg.create_task(watch_one(sup, s)): s for s in slots}
        dog = tg.create_task(_watchdog(sup))
        tracing = asyncio.Event()
        tracer = tg.create_task(_tracer(sup, slots, tracing)) if sup.options.trace else None
        await _police(sup, tg, workers, started)
        dog.cancel()
        if tracer is not None and not tracing.is_set():
            tracer.cancel()  # a capture under way ends by itself, bounded; else none is taken
            sup.note(
                "trace: none taken, the run ended before every JAX process had "
                "completed its first step (annotated with jax.profiler."
                "StepTraceAnnotation): run more steps, or for a program that annotates "
                "none, --trace-after S traces S s after its first JAX computation",
                "warning",
            )


async def watch_one(sup: Supervisor, slot: LiveHost) -> None:
    """One host's worker: follow its log to the exit, then say how it ended."""
    assert slot.paths is not None
    assert slot.sink is not None

    def on_state(state: State, detail: str) -> None:
        sup.set_state(slot, state, detail)

    follower = Follower(
        slot.host,
        slot.paths,
        slot.sink,
        sup.options.ssh,
        conn=slot.conn,
        reconnect_timeout=sup.options.reconnect_timeout,
        on_state=on_state,
        give_up=lambda: sup.stop_reason() is not None,
        started=slot.started,
    )
    slot.started = None
    try:
        slot.exit = await follower.follow()
    except RunDirGone as exc:  # kill finds the run by its marker
        slot.conn = follower.conn
        slot.sink.close()
        await _run_dir_gone(sup, slot, exc)
        return
    except HostError as exc:
        sup.fail(slot.host, State.LOST, exc.message)
        return
    finally:
        slot.conn = follower.conn
        slot.sink.close()
    state = classify(slot.exit)
    if state is not State.DONE:
        from multihost.diagnose.jaxfaults import read_fault  # only for a host that failed

        slot.fault = read_fault(slot.sink.path)
        slot.exit = _aborted_first(slot)
        explain_jax(sup, slot)
    if slot.exit.escaped:
        sup.note(
            f"{slot.host.name}: stopped {slot.exit.escaped} process(es) that had left the "
            "job's process group (setsid, daemons)",
            "warning",
        )
    if slot.exit.reason:
        slot.error = slot.exit.reason
        sup.fail(slot.host, state, slot.exit.reason)
    elif state is State.DONE:
        sup.set_state(slot, state, "exit 0")
    elif state is State.KILLED and slot.exit.stopped_by:
        slot.error = f"stopped by multihost (SIG{slot.exit.stopped_by})"
        sup.set_state(slot, state, slot.error)
    else:
        slot.state = state  # its reason reads the signal of a killed host from its state
        sup.fail(slot.host, state, slot.result().reason)


def _aborted_first(slot: LiveHost) -> Exit:
    """A host stopped by multihost whose process had died of its own abort first (JAX's
    coordination service aborting every process of the job; its log says so): its exit as if
    the stop had not come, so that it shows SIGABRT and the service's reason, not the stop."""
    assert slot.exit is not None
    died = slot.exit.code - 128
    stopped = slot.exit.stopped_by
    if slot.fault is None or not stopped or died != signal.SIGABRT or stopped == "ABRT":
        return slot.exit
    return dataclasses.replace(slot.exit, stopped_by=None)


def explain_jax(sup: Supervisor, ended: LiveHost) -> None:
    """Every host's cause from what every ended host's log says JAX's coordination service
    did (multihost.diagnose.jaxfaults): a host at fault is named on the others' rows too.
    Called as each host ends with such a fault (``ended``); a host aborted as one already
    explained was gets the same words without going over every host again (a whole pod's
    processes abort together)."""
    fault = ended.fault
    if fault is None:
        return
    at_fault = set(fault.tasks)
    if fault.kind != "join" and ended.host.process_id not in at_fault:
        for other in sup.slots.values():
            if other.fault == fault and other.cause and other.host.process_id not in at_fault:
                ended.cause = other.cause
                return
    from multihost.diagnose.jaxfaults import explain

    faults = {p: s.fault for p, s in sup.slots.items()}
    # a run on some hosts (--workers) wired no JAX job: its process ids are the program's own
    names = {} if sup.job.workers else {p: s.host.name for p, s in sup.slots.items()}
    causes = explain(faults, names)
    for p, slot in sup.slots.items():
        slot.cause = causes.get(p)


async def _run_dir_gone(sup: Supervisor, slot: LiveHost, exc: RunDirGone) -> None:
    """The run's directory was removed under its job. Stopping: the job's processes are found
    by the MULTIHOST_RUN_DIR in their environment and stopped; else the host is lost."""
    if sup.stop_reason() is None or slot.conn is None or slot.paths is None:
        sup.fail(slot.host, State.LOST, f"{exc.message} (multihost kill stops what runs)")
        return
    # the stop under way does the same on this host: whichever comes first finds them
    await stop(slot.conn, slot.paths, sup.stop_signal, sup.options.grace)
    slot.error = (
        "stopped by multihost: its run directory was gone; its processes were found by "
        "their MULTIHOST_RUN_DIR and stopped"
    )
    sup.set_state(slot, State.KILLED, slot.error)


async def _police(
    sup: Supervisor,
    tg: asyncio.TaskGroup,
    workers: Mapping[asyncio.Task[None], LiveHost],
    started: float,
) -> None:
    """Wait for the workers; start stopping everyone on a failure, timeout or interrupt;
    after the stop, give the hosts a last moment to report, then call the rest lost."""
    opts = sup.options
    deadline = None if opts.timeout is None else started + opts.timeout
    stopper: asyncio.Task[None] | None = None
    pending = set(workers)
    while pending:
        reason = sup.stop_reason()
        if reason and stopper is None:
            stopper = tg.create_task(sup.stop_all(reason))
        if sup.observe_only and sup.interrupted:
            break
        sup.wake.clear()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if stopper is not None and stopper.done():
            left = DEFAULTS.last_report
        waiter = asyncio.ensure_future(sup.wake.wait())
        done, _ = await asyncio.wait(
            pending | {waiter}, timeout=left, return_when=asyncio.FIRST_COMPLETED
        )
        waiter.cancel()
        pending -= done
        if not done and stopper is not None and stopper.done():
            break
        if deadline is not None and time.monotonic() >= deadline and not sup.timed_out:
            sup.timed_out = True
            sup.note(f"timeout: the run took longer than {opts.timeout:g} s", "error")
    for task in pending:
        task.cancel()
        if not sup.observe_only:
            slot = workers[task]
            sup.fail(slot.host, State.LOST, "did not report an exit after being stopped")


async def _watchdog(sup: Supervisor) -> None:
    """Stacks on request (``request_stacks``), and when every live host has been silent for
    ``hang_timeout`` s: take them, name the stragglers, then stop (or only report)."""
    limit = sup.options.hang_timeout
    quiet_since_report = 0.0
    while True:
        try:
            async with asyncio.timeout(1.0):
                await sup.stacks_wanted.wait()
        except TimeoutError:
            pass
        live = [s for s in sup.slots.values() if s.sink and s.paths and s.conn]
        live = [s for s in live if not s.state.final]
        if sup.stacks_wanted.is_set():
            sup.stacks_wanted.clear()
            await _take_stacks(sup, live, "on request")
        if not limit or not live or sup.observe_only:
            continue
        last = max(max(s.sink.last_output for s in live if s.sink), quiet_since_report)
        silent = time.monotonic() - last
        if silent < limit:
            continue
        report = await _take_stacks(sup, live, f"no output from any host for {silent:.0f} s")
        quiet_since_report = time.monotonic()
        if sup.options.on_hang == "stop":
            who = host_ranges(report.stragglers) if report.stragglers else "none stands out"
            sup.hung = f"hang: no output for {silent:.0f} s (straggler(s): {who})"
            if sup.first_failure is None:
                sup.first_failure = sup.hung
            sup.wake.set()
            return


async def _take_stacks(sup: Supervisor, slots: list[LiveHost], why: str) -> StackReport:
    from multihost.diagnose.collect import collect_over, save  # only when stacks are taken
    from multihost.diagnose.stacks import group, summary_lines

    conns = {s.host.process_id: s.conn for s in slots if s.conn is not None}
    dirs = {s.host.process_id: s.paths.run for s in slots if s.paths is not None}
    dumps = await collect_over([s.host for s in slots if s.conn is not None], conns, dirs)
    folder = save(dumps, sup.log_dir)
    report = group(d.stacks for d in dumps)
    lines = "\n".join(summary_lines(report))
    sup.note(f"stacks ({why}), saved in {folder}:\n{lines}", "warning")
    return report


async def _tracer(sup: Supervisor, slots: list[LiveHost], tracing: asyncio.Event) -> None:
    """``run --trace``: once every JAX process of the run steps, one capture over the run's
    connections; its rows go to ``traces/<capture>/summary.json`` for the CLI's table."""
    from multihost.diagnose.capture import capture, when_stepping
    from multihost.diagnose.captured import in_words, save_rows

    seconds = sup.options.trace
    assert seconds is not None
    conns = {s.host.process_id: s.conn for s in slots if s.conn is not None}
    dirs = {s.host.process_id: s.paths.run for s in slots if s.paths is not None}
    hosts = [s.host for s in slots if s.host.process_id in conns]
    if not await when_stepping(hosts, conns, dirs, sup.options.trace_after):
        return
    tracing.set()
    sup.note(
        f"trace: every JAX process has completed its first step; tracing {seconds:g} s "
        "on every host"
    )
    try:
        result = await capture(hosts, dirs, sup.log_dir, seconds=seconds, conns=conns)
        save_rows(result)
    except OSError as exc:
        sup.note(f"trace: could not be saved: {exc}", "error")
        return
    sup.note(*in_words(result))
