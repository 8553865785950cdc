"""Starting the job on every prepared host: plan each host's launch, then start them together
behind a gate (the run is watched) or each as soon as it can (``--detach``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from multihost.core.supervisor import Supervisor
from multihost.errors import MultihostError
from multihost.model import Host, State, host_ranges
from multihost.remote.commands import plan_hosts
from multihost.runs.launch import Ready, launch, launch_ready
from multihost.runs.stream import LogSink
from multihost.transport import burst
from multihost.transport.fanout import map_hosts


async def start_all(sup: Supervisor) -> None:
    """Each host's env, paths, log and launch script (``commands.plan_hosts``), then the launch."""
    internal = {
        pid: s.host.internal_address or (s.conn.peer_address if s.conn else s.host.address)
        for pid, s in sup.slots.items()
    }
    scripts: dict[int, str] = {}
    watch = not sup.options.detach  # launch and watch on one channel
    for plan in plan_hosts(
        sup.fleet, sup.job, sup.code_hash, internal, watch=watch, extra=sup.extra_env
    ):
        slot = sup.slots[plan.host.process_id]
        slot.paths, slot.env = plan.paths, plan.env
        scripts[plan.host.process_id] = plan.launch
        slot.sink = LogSink(plan.host, sup.log_dir / f"{plan.host.file_stem}.log", sup.emit)
    sup.write_record(force=True)

    if not watch:  # --detach: each host's job starts as soon as its launch arrives
        await start_detached(sup, scripts)
    else:
        await start_gated(sup, scripts)
    sup.write_record(force=True)


async def _read_secrets(sup: Supervisor) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``run --secret``: each value read once here, in memory only; or why not."""
    if not sup.options.secrets:
        return (), None
    from multihost.secrets import read_value

    try:
        values = [
            (key, await asyncio.to_thread(read_value, name)) for key, name in sup.options.secrets
        ]
    except MultihostError as exc:
        return (), str(exc)
    return tuple(values), None


async def start_detached(sup: Supervisor, scripts: Mapping[int, str]) -> None:
    """Each host's job starts as soon as its launch arrives; nobody watches it here."""

    async def launch_one(host: Host) -> None:
        slot = sup.slots[host.process_id]
        assert slot.conn is not None
        sup.set_state(slot, State.STARTING)
        pgid, pythons[host] = await launch(slot.conn, scripts[host.process_id])
        sup.set_state(slot, State.RUNNING, f"pgid {pgid}")

    pythons: dict[Host, str] = {}
    outcomes = await map_hosts(
        launch_one, list(sup.fleet), timeout=sup.options.launch_timeout, what="launch"
    )
    for o in outcomes:
        if o.error:
            sup.fail(o.host, State.ERROR, o.error.message)
    python_note(sup, pythons)


def python_note(sup: Supervisor, pythons: Mapping[Host, str]) -> None:
    """Once per run: the hosts that have no ``python``, where the run's is their python3."""
    shimmed = sorted((h for h, p in pythons.items() if p), key=lambda h: h.process_id)
    if not shimmed:
        return
    paths = sorted({pythons[h] for h in shimmed})
    where = "host" if len(shimmed) == 1 else "hosts"
    sup.note(
        f"no python on {len(shimmed)} {where} ({host_ranges(shimmed)}): this run's python is "
        f"their python3 ({', '.join(paths)}), as in a virtual environment",
        "warning",
    )


async def start_gated(sup: Supervisor, scripts: Mapping[int, str]) -> None:
    """Every host writes its run's files and waits at the gate; then all get the word at
    once, so the jobs start together. A host that cannot be launched (or Ctrl-C before
    the word) holds every gate: nothing starts anywhere, no run directory is left."""
    ready: dict[int, Ready] = {}
    timeout = sup.options.launch_timeout

    async def ready_one(host: Host) -> None:
        slot = sup.slots[host.process_id]
        assert slot.conn is not None
        sup.set_state(slot, State.STARTING)
        if slot.early is not None:  # sent while preparing, the same script (plan.plan_host)
            early, slot.early = slot.early, None
            ready[host.process_id] = await early
            return
        shell, slot.shell = slot.shell, None
        ready[host.process_id] = await launch_ready(slot.conn, scripts[host.process_id], shell)

    outcomes = await map_hosts(ready_one, list(sup.fleet), timeout=timeout, what="launch")
    failed = [o for o in outcomes if not o.ok]
    secrets, unread = await _read_secrets(sup) if not failed else ((), None)
    if failed or sup.interrupted or unread:
        for gate in ready.values():
            gate.hold()
        await map_hosts(
            lambda h: ready[h.process_id].drain(),
            [g.host for g in ready.values()],
            timeout=timeout,
            what="launch",
        )
        for o in failed:
            sup.fail(o.host, State.ERROR, o.error.message if o.error else "failed")
        why = f"{failed[0].host.name} could not be launched" if failed else unread
        sup.not_started(why or "interrupted")
        return
    python_note(sup, {g.host: g.python for g in ready.values()})
    # the word to every host before any reply is read, all of it out at once
    with burst(s.conn for s in sup.slots.values() if s.conn is not None):
        for gate in ready.values():
            gate.go(secrets)

    for pid, gate in ready.items():
        slot = sup.slots[pid]
        assert slot.sink is not None
        slot.started = gate.started(slot.sink.feed)
        sup.set_state(slot, State.RUNNING, f"pgid {slot.started.pgid}")
