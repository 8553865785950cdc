"""Preparing every host before anything starts: connect, check host 0's coordinator port,
stage the code, check for stale accelerator holders, claim the run's directory, then any
extra per-host steps (:class:`HostStep`). Nothing is launched unless every host is ready.

Two shapes, the same steps: *pipelined* (the default: each host goes through all of them as
soon as it is connected) and *phased* (each step on every host before the next: a sweep's
shared session, ``--stage-via``, a stale check).

The port and stale checks and the extra per-host steps (:class:`~multihost.core.steps.HostStep`,
and how to add one) are in :mod:`.steps`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from multihost.core.early import EarlyLaunch
from multihost.core.setup import before_launch
from multihost.core.steps import HostStep, port_free, stale_check
from multihost.core.supervisor import Supervisor
from multihost.defaults import DEFAULTS
from multihost.errors import (
    ConnectError,
    EnvFailed,
    HostError,
    PortBusy,
    RemoteError,
    RunNameTaken,
    UsageError,
)
from multihost.events import Transfer
from multihost.model import Host, State
from multihost.remote.commands import Paths
from multihost.results.records import Staging
from multihost.runs.launch import claim, name_taken, release
from multihost.staging import via as stagevia
from multihost.staging.archive import Archive, stage_then
from multihost.transport import Completed, connect
from multihost.transport.fanout import Outcome

if TYPE_CHECKING:
    from multihost.envsync.probe import RunnerUv
    from multihost.envsync.request import EnvRequest


class Prepare:
    """Gets every host of ``sup`` ready to launch; ``await prepare()`` says whether all are.

    ``staged`` code (a sweep's session) is on the hosts already: it is not staged again.
    """

    def __init__(
        self,
        sup: Supervisor,
        archive: Archive,
        *,
        staged: bool = False,
        steps: Sequence[HostStep] = (),
    ) -> None:
        self.sup, self.archive, self.staged, self.steps = sup, archive, staged, tuple(steps)
        self.stage_done: set[int] = set()  # process ids whose staging finished
        # --stage-via auto: the way chosen (again once the seeds' addresses are known), and why
        self.via, self.why = stagevia.StageVia("direct"), ""
        # the environment's check, on the staging's channel (pipelined): its script per host
        # (with the runner's uv it was made for) and what it said, by process id
        self.check: Callable[[Host], str] | None = None
        self.uv: RunnerUv | None = None
        self.checked: dict[int, Completed] = {}
        # pipelined, watched: each host's launch on a channel opened beside its staging, sent
        # as soon as the code is on its way (see core.early)
        self.early = EarlyLaunch(sup, later=bool(self.steps))
        self.kits: dict[int, int] = {}  # the kit's bytes each host was sent (commands.Kit)

    async def __call__(self) -> bool:
        """Connect to and stage code on every host; launch nothing unless all succeed."""
        sup, opts = self.sup, self.sup.options
        stale = opts.stale != "off" and not sup.fleet.local
        self._choose()
        direct = self.via.kind == "direct"
        if not self.staged and direct and not stale:
            if self.why:
                sup.note(f"code via direct ({self.why})")
            if opts.environment is not None:  # checked on the staging's channel
                await self._check_on_the_way(opts.environment)
            outcomes = await self._pipelined()
        else:
            outcomes = await self._phased(stale)
        if (opts.environment or opts.setup) and all(o.ok for o in outcomes) and not sup.interrupted:
            outcomes = await before_launch(self.sup, self.uv, self.checked)
        failed = [o for o in outcomes if not o.ok]
        if busy := [o.error for o in failed if isinstance(o.error, PortBusy)]:
            for slot in sup.slots.values():
                sup.set_state(slot, State.ERROR, "not started: the coordinator port is busy")
            raise busy[0]
        for o in failed:
            sup.fail(o.host, State.ERROR, o.error.message if o.error else "failed")
        sup.env_failure = next((o.error for o in failed if isinstance(o.error, EnvFailed)), None)
        if failed or sup.interrupted:
            interrupted = sup.interrupted and not failed
            sup.not_started(
                "interrupted" if interrupted else f"{failed[0].host.name} could not be prepared"
            )
            sup.write_record(force=True)
            return False
        return True

    async def session(self) -> list[Outcome[None]]:
        """A sweep's session: every host connected and the code staged as a run stages it
        (``--stage-via``, ``sup.staging`` says how); nothing claimed, nothing launched."""
        self._choose()
        outcomes = await self._connect_all()
        if all(o.ok for o in outcomes) and not self.sup.interrupted:
            outcomes = await self._stage_all()
        return outcomes

    def _choose(self) -> None:
        """``--stage-via``: the way the code goes, before the seeds' addresses are known."""
        opts = self.sup.options
        self.via, self.why = stagevia.choose(
            stagevia.parse(opts.stage_via),
            list(self.sup.fleet),
            len(self.archive.data),
            threshold=stagevia.auto_threshold(),
            bucket=opts.stage_bucket,
        )

    async def _connect_all(self) -> list[Outcome[None]]:
        opts = self.sup.options
        return await self.sup.phase(
            self._connect_one,
            opts.connect_limit,
            opts.ssh.connect_timeout + DEFAULTS.connect_slack,
            "connect",
        )

    async def _phased(self, stale: bool) -> list[Outcome[None]]:
        """Each step on every host before the next."""
        sup, opts = self.sup, self.sup.options
        outcomes = await self._connect_all()
        if all(o.ok for o in outcomes) and self._checks_port:
            outcomes = await sup.phase(
                self._port_free, None, DEFAULTS.command_timeout, "coordinator port check"
            )
        if all(o.ok for o in outcomes) and not self.staged:
            outcomes = await self._stage_all()
        if all(o.ok for o in outcomes) and stale:
            outcomes = await sup.phase(self._stale_one, None, DEFAULTS.stale_timeout, "stale check")
        claimed = False
        if all(o.ok for o in outcomes) and not sup.interrupted:
            if opts.environment is not None:  # checked on the claim's channel
                await self._check_on_the_way(opts.environment)
            outcomes = await self._claim_all()
            claimed = all(o.ok for o in outcomes)
        for step in self.steps:
            if all(o.ok for o in outcomes) and not sup.interrupted:
                outcomes = await sup.phase(self._step(step), None, step.timeout, step.name)
        if claimed and (sup.interrupted or not all(o.ok for o in outcomes)):
            conns = sup.connections  # a step failed, or Ctrl-C: no host keeps the directory
            paths = {h.process_id: sup.paths(h) for h in sup.fleet}
            await release(
                [h for h in sup.fleet if h.process_id in conns], conns, paths, opts.launch_timeout
            )
        return outcomes

    async def _pipelined(self) -> list[Outcome[None]]:
        """Each host on its own as soon as it can: connect (at most ``connect_limit``
        handshakes at a time), then claim the run's directory and stage the code on one
        channel. Any failure releases every claim made, so nothing starts anywhere."""
        sup, opts = self.sup, self.sup.options
        gate = asyncio.Semaphore(opts.connect_limit)
        connect_timeout = opts.ssh.connect_timeout + DEFAULTS.connect_slack

        async def one(host: Host) -> None:
            try:
                async with gate, asyncio.timeout(connect_timeout):
                    await self._connect_one(host)
            except HostError:
                raise  # ConnectTimeout too: it is a TimeoutError that says which limit
            except TimeoutError:
                raise RemoteError(host, f"connect timed out after {connect_timeout:g} s") from None
            try:
                async with asyncio.timeout(opts.stage_timeout):
                    if opts.detach:
                        await self._stage_checking_port(host)
                    else:  # the launch then only sends its script
                        await self.early.beside(host, self._stage_checking_port)
            except HostError:
                raise
            except TimeoutError:
                why = f"staging timed out after {opts.stage_timeout:g} s"
                raise RemoteError(host, why) from None
            for step in self.steps:
                await self._timed(step, host)

        outcomes = await sup.phase(one, None, None, "prepare")
        staged = self._finished()
        sent = sum(c.bytes_out for c in sup.connections.values()) - sum(self.kits.values())
        sup.staging = self._with_kits(
            stagevia.summarize(self.via, self.archive, staged, sent, 0, self.why)
        )
        if all(o.ok for o in outcomes) and not sup.interrupted:
            return outcomes
        await sup.hold_early()  # each removes its run's directory, as a release does
        taken = [o.host for o in outcomes if isinstance(o.error, RunNameTaken)]
        unclaimed = (RunNameTaken, ConnectError)
        claimed = [o.host for o in outcomes if not isinstance(o.error, unclaimed)]
        conns = sup.connections
        paths = {h.process_id: sup.paths(h) for h in sup.fleet}
        await release(
            [h for h in claimed if h.process_id in conns], conns, paths, opts.launch_timeout
        )
        if taken:
            for slot in sup.slots.values():
                sup.set_state(slot, State.ERROR, "not started: the run name is taken")
            sup.write_record(force=True)
            raise name_taken(taken)
        return outcomes

    async def _check_on_the_way(self, req: EnvRequest) -> None:
        """Each host checks its environment on a channel the run opens anyway, once its run
        directory is claimed (pipelined: the one that claims it and stages the code; phased:
        the claim's): a warm run's check costs no round trip of its own. The environment
        phase reads what they said."""
        from multihost.envsync.probe import probe_script, runner_uv

        uv = self.uv = await runner_uv(self.sup.options.host_uv)
        self.check = lambda host: probe_script(self.sup, host, req, uv)

    # -- the steps, one host each --------------------------------------------------------------
    def _step(self, step: HostStep) -> Callable[[Host], Awaitable[None]]:
        return lambda host: step.run(self.sup, host)

    async def _port_free(self, host: Host) -> None:
        await port_free(self.sup, host)

    async def _stale_one(self, host: Host) -> None:
        await stale_check(self.sup, host)

    async def _timed(self, step: HostStep, host: Host) -> None:
        try:
            async with asyncio.timeout(step.timeout):
                await step.run(self.sup, host)
        except HostError:
            raise
        except TimeoutError:
            raise RemoteError(host, f"{step.name} timed out after {step.timeout:g} s") from None

    async def _connect_one(self, host: Host) -> None:
        slot = self.sup.slots[host.process_id]
        if slot.conn is not None:  # shared by the caller's session
            return
        self.sup.set_state(slot, State.CONNECTING)
        slot.conn = await connect(host, self.sup.options.ssh)

    @property
    def _checks_port(self) -> bool:
        """Whether host 0's coordinator port is checked before anything starts (over SSH; a
        ``--local`` run picked a free one; a sweep's runs share a session that checked)."""
        return not self.sup.fleet.local and not self.sup.shared and not self.sup.job.workers

    async def _stage_checking_port(self, host: Host) -> None:
        """Claim and stage; on host 0, check the coordinator port meanwhile on a second
        channel (no round trip of its own before the run)."""
        if host.process_id != 0 or not self._checks_port:
            await self._stage_one(host, claim=True)
            return
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._stage_one(host, claim=True))
                tg.create_task(self._port_free(host))
        except* HostError as group:
            busy = [e for e in group.exceptions if isinstance(e, PortBusy)]
            raise (busy or group.exceptions)[0] from None

    async def _stage_one(self, host: Host, *, claim: bool = False) -> None:
        sup = self.sup
        slot = sup.slots[host.process_id]
        assert slot.conn is not None
        sup.set_state(slot, State.STAGING)
        paths = Paths.for_host(host, sup.job, self.archive.short)
        size = len(self.archive.data)

        def progress(done: int) -> None:
            self.early.launch(host)  # the code is on its way: the launch may follow it
            sup.emit(Transfer(host, "stage", done, size))

        try:
            then = self.check(host) if self.check else ""
            slot.bytes_sent, checked, self.kits[host.process_id] = await stage_then(
                slot.conn, self.archive, paths, then, progress, claim=claim
            )
            if then:
                self.checked[host.process_id] = checked
            self.stage_done.add(host.process_id)  # only a finished staging is counted
        finally:  # sent, had it already (0 of 0), or failed: this host's transfer is over
            sup.emit(Transfer(host, "stage", slot.bytes_sent, slot.bytes_sent, finished=True))

    def _with_kits(self, staging: Staging) -> Staging:
        """``staging`` with the kit's part: the hosts sent it and its bytes in all."""
        sent = [n for n in self.kits.values() if n]
        return replace(staging, kits=len(sent), kit_bytes=sum(sent))

    def _finished(self) -> list[stagevia.Staged]:
        """How each host whose staging finished got the code: a host never reached, or
        whose staging failed, is no "had it"."""
        return [
            stagevia.Staged("sent" if s.bytes_sent else "present", s.bytes_sent)
            for pid, s in self.sup.slots.items()
            if pid in self.stage_done
        ]

    async def _stage_all(self) -> list[Outcome[None]]:
        """The code on every host: from the runner to each, or ``--stage-via`` a seed per
        slice or a bucket (multihost.staging.via); counts what leaves the runner."""
        sup = self.sup
        conns = sup.connections
        if self.why and self.via.kind == "peer":  # auto: can every seed serve privately?
            seeds = {
                h.process_id: stagevia.bind_address(h, conns[h.process_id])
                for h in sup.fleet
                if h.process_id in conns
            }
            self.via, self.why = stagevia.choose(
                stagevia.StageVia("auto"),
                list(sup.fleet),
                len(self.archive.data),
                threshold=stagevia.auto_threshold(),
                seed_addresses=seeds,
            )
        if self.why:
            sup.note(f"code via {self.via} ({self.why})")
        via = self.via
        before = sum(c.bytes_out for c in conns.values())
        if via.kind == "direct":
            outcomes = await sup.phase(self._stage_one, None, sup.options.stage_timeout, "staging")
            staged = self._finished()
            uploaded = 0
        else:
            for slot in sup.slots.values():
                sup.set_state(slot, State.STAGING)
            paths = {h.process_id: sup.paths(h) for h in sup.fleet}
            results, uploaded = await sup.unless_interrupted(
                stagevia.stage_fleet(
                    via,
                    list(sup.fleet),
                    conns,
                    self.archive,
                    paths,
                    timeout=sup.options.stage_timeout,
                    note=sup.note,
                ),
                ([Outcome[stagevia.Staged](h) for h in sup.fleet], 0),
            )
            staged = [o.value for o in results if o.value is not None]
            for o in results:
                sup.slots[o.host.process_id].bytes_sent = o.value.sent if o.value else 0
            outcomes = [Outcome[None](o.host, error=o.error) for o in results]
        sent = sum(c.bytes_out for c in conns.values()) - before + uploaded
        sup.staging = stagevia.summarize(
            via, self.archive, staged, sent, int(uploaded > 0), self.why
        )
        return outcomes

    async def _claim_all(self) -> list[Outcome[None]]:
        """The run's directory on every host before any job starts (see launch.claim)."""
        sup = self.sup
        conns = sup.connections
        paths = {h.process_id: sup.paths(h) for h in sup.fleet}
        try:
            outcomes = await claim(
                list(sup.fleet),
                conns,
                paths,
                sup.options.launch_timeout,
                self.check,
                self.checked,
                self.kits,
            )
            if sup.staging is not None:
                sup.staging = self._with_kits(sup.staging)
            return outcomes
        except UsageError:
            for slot in sup.slots.values():
                sup.set_state(slot, State.ERROR, "not started: the run name is taken")
            sup.write_record(force=True)
            raise
