"""``job watch``: poll the queued resource and the bucket until the job's truth is known.

Each poll reads the resource's state and the attempt's objects (two gcloud calls, side by
side), then ``decide`` (:mod:`multihost.job.watch.verdict`, pure) says what that means; the
``Watcher`` acts on it: streams the followed log, deletes, resubmits, records the outcome.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from multihost.cloud.bucket import parse_host_object
from multihost.cloud.gcloud import Gcloud
from multihost.defaults import DEFAULTS
from multihost.errors import CloudError
from multihost.job import cloud
from multihost.job.cloud import GONE_STATES
from multihost.job.record import JobRecord, JobState
from multihost.job.startup import ENV_FAILED, FETCH_FAILED, SECRET_FAILED, WORK_DIR_REFUSED
from multihost.job.submit import startup_script
from multihost.job.watch.verdict import HostKey, HostView, Snapshot, Verdict, decide

A = TypeVar("A")
B = TypeVar("B")


class Display(Protocol):
    def line(self, host: str, text: str) -> None: ...
    def note(self, text: str) -> None: ...
    def hosts(self, record: JobRecord, snap: Snapshot) -> None: ...


@dataclass(frozen=True)
class Outcome:
    record: JobRecord
    exit_code: int
    message: str


@dataclass
class Watcher:
    """Follows one job; the record in the bucket, not this object, is the source of truth."""

    record: JobRecord
    gcloud: Gcloud
    display: Display
    keep: bool = False
    poll: float = DEFAULTS.poll
    follow: HostKey | None = (0, 0)
    resubmit: bool = False  # once, when the resource is deleted or vanishes before ACTIVE
    clock: Callable[[], float] = time.time
    _exits: dict[HostKey, int] = field(default_factory=dict)
    _started: set[HostKey] = field(default_factory=set)
    _workers: int | None = None
    _offset: int = 0
    _partial: bytes = b""
    _active_since: float | None = None
    _last_hosts: tuple[HostView, ...] = ()
    _last_state: str | None = "?"
    _state: str | None = "?"
    _described: float = 0.0
    _suspending_since: float | None = None  # when this attempt's resource was seen SUSPENDING

    def run(self, *, fresh: bool = False) -> Outcome:
        """Follow the job to its end; ``fresh``: the record was just written by this process."""
        if not fresh:
            self.record = cloud.load_record(self.gcloud, self.record)
        if self.record.state.final:
            return self._outcome_of(self.record)
        self._workers = self.record.expected_workers
        self.display.note(
            f"job {self.record.name}: attempt {self.record.attempt}, "
            f"queued resource {self.record.resource}"
        )
        with ThreadPoolExecutor(2) as pool:
            while True:
                begun = self.clock()
                snap = self._snapshot(pool)
                verdict, host = decide(
                    snap,
                    active_since=self._active_since,
                    start_timeout=self.record.start_timeout,
                    now=self.clock(),
                    seen_active=self._active_since is not None,
                )
                if verdict is Verdict.CONTINUE:
                    time.sleep(max(0.0, self.poll - (self.clock() - begun)))
                    continue
                outcome = self._act(verdict, host, snap)
                if outcome is not None:
                    return outcome

    def run_logs(self) -> None:
        """Print the followed host's log as it grows, until that host exits or the job ends."""
        self.record = cloud.load_record(self.gcloud, self.record)
        with ThreadPoolExecutor(2) as pool:
            while True:
                snap = self._snapshot(pool)
                if self.follow in self._exits:
                    return
                if snap.resource_state is None or snap.resource_state in GONE_STATES:
                    fresh = cloud.load_record(self.gcloud, self.record)
                    if fresh.attempt != self.record.attempt:
                        self._adopt(fresh)
                        continue
                    if fresh.state.final:
                        return
                time.sleep(self.poll)

    # ------------------------------------------------------------ one poll

    def _snapshot(self, pool: ThreadPoolExecutor) -> Snapshot:
        # Once the resource is ACTIVE its state is asked every other poll only: each gcloud
        # call costs about a second of CPU, and only a preemption changes it then.
        now = self.clock()
        describe = self._active_since is None or now - self._described >= 2 * self.poll
        state_f = pool.submit(cloud.describe_state, self.gcloud, self.record) if describe else None
        objects = self.gcloud.objects(self.record.attempt_prefix())
        if state_f is not None:
            self._state, self._described = state_f.result(), now
        state = self._state
        logs: dict[HostKey, int] = {}
        new_exits: dict[HostKey, str] = {}
        for url, size in objects.items():
            parsed = parse_host_object(url)
            if parsed is None:
                continue
            s, w, kind = parsed
            if kind == "log":
                logs[s, w] = size
            elif kind == "started" and (s, w) not in self._started:
                self._started.add((s, w))
                if self._workers is None:
                    self._workers = int(self.gcloud.cat(url).split()[0])
            elif kind == "exit" and (s, w) not in self._exits:
                new_exits[s, w] = url
        if new_exits:  # one call for all of them: each exit object is one line
            texts = self.gcloud.cat_many(list(new_exits.values())).decode().split()
            for key, text in zip(new_exits, texts, strict=False):
                self._exits[key] = int(text) if text.lstrip("-").isdigit() else 255
        if state == "ACTIVE" and self._active_since is None:
            self._active_since = self.clock()
        keys = set(logs) | self._started | set(self._exits)
        if self._workers is not None:
            keys |= {(s, w) for s in range(self.record.num_slices) for w in range(self._workers)}
        hosts = tuple(
            HostView(s, w, (s, w) in self._started, self._exits.get((s, w)), logs.get((s, w), 0))
            for s, w in sorted(keys)
        )
        expected = None if self._workers is None else self._workers * self.record.num_slices
        snap = Snapshot(state, hosts, expected)
        if self.follow is not None:
            self._stream(logs.get(self.follow, 0), final=self.follow in self._exits)
        if hosts != self._last_hosts or state != self._last_state:
            self.display.hosts(self.record, snap)
            self._last_hosts, self._last_state = hosts, state
        return snap

    def _stream(self, size: int, *, final: bool) -> None:
        """New bytes of the followed host's log, whole lines only (the last at the end)."""
        if self.follow is None or size <= self._offset:
            return
        s, w = self.follow
        data = self.gcloud.cat(self.record.host_url(s, w, "log"), self._offset)
        self._offset += len(data)
        text = self._partial + data
        lines = text.split(b"\n")
        self._partial = lines.pop()
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self.display.line(f"s{s}/w{w}", line.decode(errors="replace"))

    # ------------------------------------------------------------ what a verdict does

    def _act(self, verdict: Verdict, host: HostView | None, snap: Snapshot) -> Outcome | None:
        r = self.record
        if verdict is Verdict.SUCCEEDED:
            if self.follow is not None:  # the exit may have landed before the final log
                with contextlib.suppress(CloudError):
                    self._stream(self._offset + 1, final=True)
            kept = " (queued resource kept)" if self.keep else ", queued resource deleted"
            message = f"every worker exited 0{kept}"
            if self.keep:
                return self._finish(JobState.SUCCEEDED, 0, message)
            return _both(
                lambda: cloud.delete(self.gcloud, r),
                lambda: self._finish(JobState.SUCCEEDED, 0, message),
            )[1]
        if verdict is Verdict.FAILED and host is not None:
            tail = _both(lambda: cloud.delete(self.gcloud, r), lambda: self._tail(host))[1]
            code = host.exit_code if host.exit_code and 0 < host.exit_code < 256 else 1
            why = {
                FETCH_FAILED: "could not fetch the code",
                SECRET_FAILED: "could not read a --secret from Secret Manager",
                WORK_DIR_REFUSED: "refused its work directory (not its own, or not private)",
                ENV_FAILED: "could not get the locked environment",
            }.get(host.exit_code or 0, "exited")
            message = (
                f"{host.name} (slice {host.slice_id}, worker {host.worker}) {why} with code "
                f"{host.exit_code} in attempt {r.attempt}; queued resource deleted, not retried"
            )
            if tail:
                message += "\n  last lines:\n" + "\n".join(f"    {t}" for t in tail)
            return self._finish(JobState.FAILED, code, message)
        if verdict is Verdict.START_TIMEOUT:
            cloud.delete(self.gcloud, r)
            missing = [h.name for h in snap.hosts if not h.started and h.exit_code is None]
            who = ", ".join(missing) if missing else "no worker"
            message = (
                f"attempt {r.attempt}: {who} never reported within --start-timeout "
                f"{r.start_timeout:g}s of the resource being ACTIVE (code fetch or startup "
                "script failed?); queued resource deleted"
            )
            return self._finish(JobState.FAILED, 1, message)
        if verdict in (Verdict.NEVER_ACTIVE, Verdict.DELETED):
            return self._gone(verdict, snap)
        # Preempted. While the resource is SUSPENDING its VMs are in their notice: the hosts
        # send their logs, a user's own handler saves a checkpoint. Deleting it then would cut
        # that short, so the watch waits for SUSPENDED (at most notice_wait s).
        if snap.resource_state == "SUSPENDING":
            now = self.clock()
            if self._suspending_since is None:
                self._suspending_since = now
                self.display.note(
                    f"attempt {r.attempt} preempted: its hosts have their notice (logs, "
                    "checkpoints); waiting for them to stop before the next attempt"
                )
            if now - self._suspending_since < DEFAULTS.notice_wait:
                return None
        # Deleting the preempted resource is right whoever else watches the job; the record
        # (the truth) says whether another watcher has moved the job on already.
        _, fresh = _both(
            lambda: cloud.delete(self.gcloud, r), lambda: cloud.load_record(self.gcloud, r)
        )
        if fresh.attempt != r.attempt or fresh.state.final:
            self.display.note("another watcher moved the job on; following it")
            self._adopt(fresh)
            return self._outcome_of(fresh) if fresh.state.final else None
        if r.attempt - r.resubmits >= r.max_restarts:
            message = (
                f"queued resource {r.resource} was preempted ({snap.resource_state or 'gone'}) "
                f"in attempt {r.attempt}; --max-restarts {r.max_restarts} used up"
            )
            return self._finish(JobState.FAILED, 1, message)
        nxt = self._next_attempt(r)
        self.display.note(
            f"preempted ({snap.resource_state or 'resource gone'}) in attempt {r.attempt}: its "
            f"logs are kept under {r.attempt_prefix()}/; attempt {nxt.attempt} created as "
            f"{nxt.resource} (MULTIHOST_ATTEMPT={nxt.attempt})"
        )
        self._adopt(nxt)
        return None

    def _next_attempt(self, r: JobRecord, **changes: object) -> JobRecord:
        """Record attempt N+1 and create its resource; a create whose first try reached the
        API before its answer was lost finds its resource there (ALREADY_EXISTS): that one."""
        nxt = r.evolve(
            attempt=r.attempt + 1, attempt_times=(*r.attempt_times, time.time()), **changes
        )

        def create() -> None:
            try:
                cloud.create(self.gcloud, nxt, startup_script(nxt))
            except CloudError as exc:
                if "ALREADY_EXISTS" not in str(exc):
                    raise

        _both(lambda: cloud.save_record(self.gcloud, nxt), create)
        return nxt

    def _gone(self, verdict: Verdict, snap: Snapshot) -> Outcome | None:
        """Deleted, or gone before it was ever ACTIVE: not a preemption. At most one new
        attempt, and only when asked (``--resubmit``); else the job fails here."""
        r = self.record
        fresh = cloud.load_record(self.gcloud, r)
        if fresh.attempt != r.attempt or fresh.state.final:
            self.display.note("another watcher moved the job on; following it")
            self._adopt(fresh)
            return self._outcome_of(fresh) if fresh.state.final else None
        state = snap.resource_state
        if verdict is Verdict.NEVER_ACTIVE:
            how = "was deleted" if state in (None, "DELETING") else f"ended {state}"
            what = f"queued resource {r.resource} {how} before it was ever ACTIVE"
        else:
            what = f"queued resource {r.resource} was deleted while ACTIVE (by someone else?)"
        what += f" in attempt {r.attempt}: not a preemption"
        if state not in (None, "DELETING"):
            cloud.delete(self.gcloud, r)
        if self.resubmit and r.resubmits < 1:
            nxt = self._next_attempt(r, resubmits=r.resubmits + 1)
            self.display.note(
                f"{what}; resubmitted once (--resubmit) as attempt {nxt.attempt}, {nxt.resource}"
            )
            self._adopt(nxt)
            return None
        if r.resubmits:
            what += "; already resubmitted once"
        elif not self.resubmit:
            what += "; not resubmitted (watch --resubmit would, once)"
        return self._finish(JobState.FAILED, 1, what)

    def _adopt(self, record: JobRecord) -> None:
        self.record = record
        self._exits, self._started = {}, set()
        self._offset, self._partial, self._active_since = 0, b"", None
        self._last_hosts, self._last_state = (), "?"
        self._state, self._described = "?", 0.0
        self._suspending_since = None

    def _tail(self, host: HostView, n: int = 10) -> list[str]:
        try:
            data = self.gcloud.cat(self.record.host_url(host.slice_id, host.worker, "log"))
        except CloudError:
            return []
        return data.decode(errors="replace").rstrip("\n").splitlines()[-n:]

    def _finish(self, state: JobState, code: int, message: str) -> Outcome:
        record = self.record.evolve(state=state, exit_code=code, message=message)
        cloud.save_record(self.gcloud, record)
        self.record = record
        return Outcome(record, code, message)

    @staticmethod
    def _outcome_of(record: JobRecord) -> Outcome:
        code = record.exit_code if record.exit_code is not None else 1
        return Outcome(record, code, record.message or record.state.value)


def _both(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """Two gcloud calls side by side (each costs about a second); an error of either raises."""
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(first)
        mine = second()
        return other.result(), mine
