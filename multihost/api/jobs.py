"""The production path from Python: ``submit_job`` (a queued resource that runs itself, its
code and record in a bucket) and a :class:`JobHandle` to watch, read, stop it; ``jobs()``,
the jobs submitted from here. ``multihost job ...`` calls the same functions and prints.

Nothing here prints: what a call does is told to ``say`` (default: stderr), a watched job's
log lines to ``on_line(host, line)`` (default: stdout, ``[s0/w0] line``), and each poll's view
of the workers to ``on_hosts(record, snapshot)``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihost.api.keywords import check_options, on_stderr
from multihost.api.pods import profile_values
from multihost.bridge import terminating
from multihost.defaults import DEFAULTS
from multihost.errors import UsageError

if TYPE_CHECKING:
    from multihost.cloud.gcloud import Gcloud
    from multihost.job.ops import JobStatus, JobWorker
    from multihost.job.record import JobRecord, Unreadable
    from multihost.job.watch.follow import Outcome
    from multihost.job.watch.verdict import Snapshot
    from multihost.job.watch.watchers import Watching

Say = Callable[[str], None]
OnLine = Callable[[str, str], None]
OnHosts = Callable[["JobRecord", "Snapshot"], None]


def print_line(host: str, line: str) -> None:
    """The default ``on_line``: ``[s0/w0] line`` on stdout."""
    sys.stdout.write(f"[{host}] {line}\n")
    sys.stdout.flush()


def _gcloud() -> Gcloud:
    from multihost.cloud.gcloud import Gcloud

    return Gcloud.from_env()


def _host(host: str | tuple[int, int]) -> tuple[int, int]:
    """``"0/1"`` or ``(0, 1)``: slice 0, worker 1."""
    if isinstance(host, tuple):
        return host
    s, sep, w = host.partition("/")
    if not sep or not s.isdigit() or not w.isdigit():
        raise UsageError(f"--host expects SLICE/WORKER, e.g. 0/1: {host!r}")
    return int(s), int(w)


@dataclass(frozen=True)
class _Display:
    """A watch's three outlets, as the Watcher calls them."""

    on_line: OnLine
    say: Say
    on_hosts: OnHosts | None

    def line(self, host: str, text: str) -> None:
        self.on_line(host, text)

    def note(self, text: str) -> None:
        self.say(text)

    def hosts(self, record: JobRecord, snap: Snapshot) -> None:
        if self.on_hosts is not None:
            self.on_hosts(record, snap)


class JobHandle:
    """A job submitted from here, by its name: what ``submit_job`` returns and ``jobs()``
    lists. Its record in the bucket is the truth; the handle reads it on each call."""

    def __init__(self, name: str, record: JobRecord | None = None) -> None:
        from multihost.job.record import check_name, load_local

        self.name = check_name(name)
        self._record = record if record is not None else load_local(name)

    @property
    def record(self) -> JobRecord:
        """The job's record as last read here (``status()`` reads the bucket's)."""
        return self._record

    def __repr__(self) -> str:
        r = self._record
        return f"<JobHandle {r.name}: {r.state.value}, attempt {r.attempt}, {r.resource}>"

    def status(self) -> JobStatus:
        """The job now: its record (from the bucket), its queued resource's state and each
        worker of the current attempt (``multihost job status``)."""
        from multihost.job import ops

        found = ops.status(_gcloud(), self._record)
        self._record = found.record
        return found

    def workers(self, attempt: int | None = None) -> tuple[JobWorker, ...]:
        """Each worker of ``attempt`` (default: the current one) as the bucket shows it."""
        from multihost.job import ops

        at = self._record.attempt if attempt is None else attempt
        return ops.host_statuses(_gcloud(), self._record, at)

    def watchers(self) -> list[Watching]:
        """The processes on this machine that watch the job (a preemption is resumed only
        while one does)."""
        from multihost.job.watch.watchers import watchers

        return watchers(self.name)

    def watch(
        self,
        *,
        keep: bool = False,
        poll: float = DEFAULTS.poll,
        resubmit: bool = False,
        control_plane_timeout: float = DEFAULTS.control_plane_timeout,
        on_line: OnLine | None = print_line,
        on_hosts: OnHosts | None = None,
        say: Say | None = None,
        fresh: bool = False,
    ) -> Outcome:
        """Follow the job to its end (``multihost job watch``): host 0's log to ``on_line``
        (None: not streamed), resubmitting after preemptions (``max_restarts``), the queued
        resource deleted at the end (unless ``keep``). Returns the outcome: the final record,
        the job's exit code and why. Ctrl-C, SIGTERM or SIGHUP stop the watching (a
        KeyboardInterrupt), not the job. ``fresh``: the record was just written from here
        (``submit_job``), so the bucket's copy is not read first."""
        from multihost.cloud.retry import PatientGcloud
        from multihost.job.watch import watchers
        from multihost.job.watch.follow import Watcher

        say = say or on_stderr
        display = _Display(on_line or (lambda _h, _t: None), say, on_hosts)
        gcloud = PatientGcloud.around(_gcloud(), timeout=control_plane_timeout, warn=say)
        follow = (0, 0) if on_line is not None else None
        with terminating(), watchers.marker(self.name):
            watcher = Watcher(
                self._record,
                gcloud,
                display,
                keep=keep,
                poll=poll,
                resubmit=resubmit,
                follow=follow,
            )
            outcome = watcher.run(fresh=fresh)
        self._record = outcome.record
        return outcome

    def detach(
        self,
        *,
        keep: bool = False,
        poll: float = DEFAULTS.poll,
        resubmit: bool = False,
        control_plane_timeout: float = DEFAULTS.control_plane_timeout,
    ) -> tuple[int, Path]:
        """Watch the job in the background (``job watch --detach``): a process of its own
        session, which outlives this one; returns its pid and its log (``watch.log``)."""
        from multihost.job.watch import watchers

        argv = ["--poll", str(poll), "--control-plane-timeout", str(control_plane_timeout)]
        argv += ["--keep"] * keep + ["--resubmit"] * resubmit
        return watchers.detach(self.name, argv)

    def logs(self, host: str | tuple[int, int] = "0/0", *, attempt: int | None = None) -> str:
        """A worker's log (``"SLICE/WORKER"``) of ``attempt`` (default: the current one), as
        far as the bucket has it."""
        from multihost.job import cloud, ops

        gcloud = _gcloud()
        self._record = cloud.load_record(gcloud, self._record)
        at = self._record.attempt if attempt is None else attempt
        return ops.log_text(gcloud, self._record, at, _host(host)).decode(errors="replace")

    def follow_log(
        self,
        host: str | tuple[int, int] = "0/0",
        *,
        on_line: OnLine = print_line,
        poll: float = DEFAULTS.poll,
        control_plane_timeout: float = DEFAULTS.control_plane_timeout,
        say: Say | None = None,
    ) -> None:
        """A worker's log of the current attempt, line by line to ``on_line`` as it grows,
        until that worker exits or the job ends (``job logs --follow``)."""
        from multihost.cloud.retry import PatientGcloud
        from multihost.job import cloud
        from multihost.job.watch.follow import Watcher

        say = say or on_stderr
        gcloud = PatientGcloud.around(_gcloud(), timeout=control_plane_timeout, warn=say)
        self._record = cloud.load_record(gcloud, self._record)
        display = _Display(on_line, say, None)
        with terminating():
            Watcher(
                self._record, gcloud, display, keep=True, poll=poll, follow=_host(host)
            ).run_logs()

    def stop(self, *, say: Say | None = None) -> JobRecord:
        """Delete the current attempt's queued resource and record the job stopped
        (``multihost job stop``); says what was deleted. Returns the record."""
        from multihost.job import ops

        record, deleted = ops.stop(_gcloud(), self._record)
        what = (
            f"queued resource {record.resource} deleted" if deleted else "no queued resource left"
        )
        (say or on_stderr)(f"job {record.name}: {record.state.value}; {what}")
        self._record = record
        return record


def submit_job(
    name: str,
    cmd: str,
    *,
    tpu_type: str | None = None,
    runtime_version: str | None = None,
    bucket: str | None = None,
    num_slices: int | None = None,
    capacity: str | None = None,
    zone: str | None = None,
    project: str | None = None,
    max_restarts: int | None = None,
    profile: str | None = None,
    say: Say | None = None,
    **options: Any,
) -> JobHandle:
    """Submit a production job (``multihost job submit``): the code (``script_dir=``, default
    the current directory) packed and uploaded once to ``bucket``, the record written, the
    queued resource requested; each worker runs ``cmd`` at boot, its log and exit code in the
    bucket. Keywords: ``job submit``'s flags by dest (``env=``, ``secret=``, ``exclude=``,
    ``start_timeout=``, ``no_sync=``...); ``profile=`` puts a config profile under them (its
    ``tpu-type``, ``bucket``, ...). Returns the job's handle; ``.watch()`` follows it."""
    given = {
        k: v
        for k, v in {
            "tpu_type": tpu_type,
            "runtime_version": runtime_version,
            "bucket": bucket,
            "num_slices": num_slices,
            "capacity": capacity,
            "zone": zone,
            "project": project,
            "max_restarts": max_restarts,
            "profile": profile,
            **options,
        }.items()
        if v is not None
    }
    check_options("submit_job", given)
    config = profile_values(profile, given.get("script_dir"))
    return submitted(name, {**config, **given, "cmd": cmd}, say or on_stderr)


def submitted(name: str, given: Mapping[str, Any], say: Say) -> JobHandle:
    """``submit_job``, of settings by dest (``vars(args)``; keywords over a profile)."""
    from multihost.job.submit import request_of, submit

    done = submit(request_of(name, given), _gcloud(), say)
    r = done.record
    say(
        f"queued resource {r.resource} requested ({r.num_slices} x {r.tpu_type}); follow "
        f"with: multihost job watch {r.name}"
    )
    return JobHandle(r.name, r)


def job(name: str) -> JobHandle:
    """The handle of a job submitted from here, by its name."""
    return JobHandle(name)


def jobs() -> list[JobHandle]:
    """The jobs submitted from here (``multihost job ls``), oldest first; a record that
    cannot be read is a :class:`~multihost.errors.UsageError` naming it."""
    handles, unreadable = listing()
    if unreadable:
        raise UsageError(f"job {unreadable[0].name}: unreadable record: {unreadable[0].why}")
    return handles


def listing() -> tuple[list[JobHandle], Sequence[Unreadable]]:
    """Every job recorded here: the readable ones' handles, and the unreadable (never
    hidden)."""
    from multihost.job.record import JobRecord, list_local

    listed = list_local()
    handles = [JobHandle(r.name, r) for r in listed if isinstance(r, JobRecord)]
    return handles, [r for r in listed if not isinstance(r, JobRecord)]
