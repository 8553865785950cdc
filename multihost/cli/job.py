"""``multihost job ...``: the queued-resource production path (argument parsing and printing)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from multihost.errors import UsageError


class _Display:
    """Host 0's lines on stdout; per-host state changes and notes on stderr."""

    def __init__(self, err: Console, *, show_hosts: bool = True) -> None:
        self.err = err
        self.show_hosts = show_hosts

    def line(self, host: str, text: str) -> None:
        sys.stdout.write(f"{host} | {text}\n")
        sys.stdout.flush()

    def note(self, text: str) -> None:
        self.err.print(f"[bold]multihost:[/] {escape(text)}")

    def warn(self, text: str) -> None:
        self.err.print(f"[bold yellow]multihost: warning:[/] {escape(text)}")

    def hosts(self, record: Any, snap: Any) -> None:
        if not self.show_hosts:
            return
        groups: dict[str, list[str]] = {}
        for h in snap.hosts:
            label = h.state if h.exit_code is None else f"{h.state}({h.exit_code})"
            groups.setdefault(label, []).append(h.name)
        hosts = "; ".join(f"{k}: {' '.join(v)}" for k, v in groups.items()) or "no worker yet"
        self.err.print(
            f"[dim]attempt {record.attempt} {snap.resource_state or 'GONE'} — {escape(hosts)}[/]"
        )


class _JsonLines(_Display):
    """``logs --json``: one JSON object per log line on stdout."""

    def __init__(self, err: Console, attempt: int) -> None:
        super().__init__(err, show_hosts=False)
        self.attempt = attempt

    def line(self, host: str, text: str) -> None:
        sys.stdout.write(json.dumps({"host": host, "attempt": self.attempt, "line": text}) + "\n")
        sys.stdout.flush()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def cmd_job(args: argparse.Namespace, err: Console) -> int:
    from multihost.cloud.gcloud import Gcloud

    gcloud = Gcloud.from_env()
    handlers: dict[str, Callable[[argparse.Namespace, Console, Gcloud], int]] = {
        "submit": _submit,
        "watch": _watch,
        "status": _status,
        "logs": _logs,
        "stop": _stop,
        "ls": _ls,
    }
    return handlers[args.job_command](args, err, gcloud)


def _submit(args: argparse.Namespace, err: Console, gcloud: Any) -> int:
    from multihost.job.submit import JobRequest, submit

    req = JobRequest(
        name=args.name,
        bucket=args.bucket,
        tpu_type=args.tpu_type,
        runtime_version=args.runtime_version,
        command=args.cmd,
        num_slices=args.num_slices,
        project=args.project,
        zone=args.zone,
        capacity=args.capacity or "on-demand",
        max_restarts=args.max_restarts,
        script_dir=args.script_dir,
        excludes=tuple(args.exclude),
        env=tuple(args.env),
        log_interval=args.log_interval,
        start_timeout=args.start_timeout,
        coordinator_port=args.coordinator_port,
        megascale_port=args.megascale_port,
        secrets=tuple(args.secret),
        sync=not args.no_sync,
        extras=tuple(args.extra),
        all_extras=args.all_extras,
        groups=tuple(args.group),
        no_dev=args.no_dev,
        requirements=args.requirements,
        env_wait=args.env_wait,
        compile_cache=args.compile_cache_max if args.compile_cache else 0,
    )
    display = _Display(err)
    done = submit(req, gcloud, display.note)
    display.note(
        f"queued resource {done.record.resource} requested ({args.num_slices} x "
        f"{args.tpu_type}); follow with: multihost job watch {args.name}"
    )
    if args.watch and args.detach:
        return _detach(args, err)
    return _watch(args, err, gcloud, done.record) if args.watch else 0


def _detach(args: argparse.Namespace, err: Console) -> int:
    from multihost.job.watch import watchers

    argv = ["--poll", str(args.poll), "--control-plane-timeout", str(args.control_plane_timeout)]
    argv += ["--keep"] * args.keep + ["--resubmit"] * args.resubmit
    pid, log = watchers.detach(args.name, argv)
    err.print(
        f"[bold]multihost:[/] watching job {escape(args.name)} in the background (pid {pid}); "
        f"its output: {escape(str(log))}; see it with: multihost job status {escape(args.name)}"
    )
    return 0


def _watch(args: argparse.Namespace, err: Console, gcloud: Any, record: Any = None) -> int:
    from multihost.cloud.retry import PatientGcloud
    from multihost.job.record import load_local
    from multihost.job.watch import watchers
    from multihost.job.watch.follow import Watcher

    fresh = record is not None
    record = record or load_local(args.name)
    if args.detach:
        return _detach(args, err)
    display = _Display(err)
    gcloud = PatientGcloud.around(gcloud, timeout=args.control_plane_timeout, warn=display.warn)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        with watchers.marker(record.name):
            watcher = Watcher(
                record, gcloud, display, keep=args.keep, poll=args.poll, resubmit=args.resubmit
            )
            outcome = watcher.run(fresh=fresh)
    except KeyboardInterrupt:
        display.note(
            f"stopped watching; job {record.name} keeps running on its queued resource. "
            f"Follow it again: multihost job watch {record.name} — "
            f"end it: multihost job stop {record.name}"
        )
        return 130
    style = "green" if outcome.exit_code == 0 else "red"
    err.print(
        f"[{style}]job {outcome.record.name} {outcome.record.state.value}:[/] "
        f"{escape(outcome.message)}"
    )
    return outcome.exit_code


def _status(args: argparse.Namespace, err: Console, gcloud: Any) -> int:
    import time

    from multihost.job import ops
    from multihost.job.record import load_local
    from multihost.job.watch.watchers import watchers

    st = ops.status(gcloud, load_local(args.name))
    r = st.record
    watching = watchers(r.name)
    if args.json:
        data = {
            "name": r.name,
            "state": r.state.value,
            "attempt": r.attempt,
            "exit_code": r.exit_code,
            "message": r.message,
            "resource": r.resource,
            "resource_state": st.resource_state,
            "bucket": r.bucket,
            "hosts": [
                {
                    "slice": h.slice_id,
                    "worker": h.worker,
                    "state": h.state,
                    "exit_code": h.exit_code,
                    "log_bytes": h.log_bytes,
                }
                for h in st.hosts
            ],
            "watchers": [{"pid": w.pid, "mode": w.mode, "since": w.since} for w in watching],
        }
        print(json.dumps(data, indent=1))
        return 0
    out = Console(highlight=False)
    out.print(
        f"job {r.name}: {r.state.value}, attempt {r.attempt} of at most "
        f"{r.max_restarts + 1}; queued resource {r.resource}: "
        f"{st.resource_state or 'gone'}"
    )
    if r.message:
        out.print(escape(r.message))
    for w in watching:
        since = time.strftime("%H:%M:%S", time.localtime(w.since))
        out.print(f"watched from here by pid {w.pid} ({w.mode}, since {since})")
    if not watching and not r.state.final:
        out.print(
            "nothing watches this job from here: a preemption is resumed only while a watch "
            f"runs (multihost job watch {escape(r.name)} --detach)"
        )
    table = Table("host", "state", "exit", "log bytes")
    for h in st.hosts:
        code = "" if h.exit_code is None else str(h.exit_code)
        table.add_row(f"s{h.slice_id}/w{h.worker}", h.state, code, str(h.log_bytes))
    out.print(table)
    return 0


def _parse_host(text: str) -> tuple[int, int]:
    s, sep, w = text.partition("/")
    if not sep or not s.isdigit() or not w.isdigit():
        raise UsageError(f"--host expects SLICE/WORKER, e.g. 0/1: {text!r}")
    return int(s), int(w)


def _logs(args: argparse.Namespace, err: Console, gcloud: Any) -> int:
    from multihost.cloud.retry import PatientGcloud
    from multihost.job import cloud, ops
    from multihost.job.record import load_local
    from multihost.job.watch.follow import Watcher

    host = _parse_host(args.host)
    record = load_local(args.name)
    if args.follow:
        warn = _Display(err).warn
        gcloud = PatientGcloud.around(gcloud, timeout=args.control_plane_timeout, warn=warn)
    record = cloud.load_record(gcloud, record)
    attempt = record.attempt if args.attempt is None else args.attempt
    if args.follow:
        if args.all or attempt != record.attempt:
            raise UsageError("--follow follows one host of the current attempt")
        display = _JsonLines(err, attempt) if args.json else _Display(err, show_hosts=False)
        watcher = Watcher(record, gcloud, display, keep=True, poll=args.poll, follow=host)
        try:
            watcher.run_logs()
        except KeyboardInterrupt:
            return 130
        return 0
    hosts = [host]
    if args.all:
        hosts = [(h.slice_id, h.worker) for h in ops.host_statuses(gcloud, record, attempt)]
    jsonl = _JsonLines(err, attempt)
    for key in hosts:
        text = ops.log_text(gcloud, record, attempt, key).decode(errors="replace")
        name = f"s{key[0]}/w{key[1]}"
        for line in text.splitlines():
            if args.json:
                jsonl.line(name, line)
            else:
                print(f"{name} | {line}" if args.all else line)
    return 0


def _stop(args: argparse.Namespace, err: Console, gcloud: Any) -> int:
    from multihost.job import ops
    from multihost.job.record import load_local

    record, deleted = ops.stop(gcloud, load_local(args.name))
    what = f"queued resource {record.resource} deleted" if deleted else "no queued resource left"
    err.print(f"job {record.name}: {record.state.value}; {what}")
    return 0


def _ls(args: argparse.Namespace, err: Console, gcloud: Any) -> int:
    import time

    from multihost.job.record import JobRecord, list_local

    listed = list_local()
    records = [r for r in listed if isinstance(r, JobRecord)]
    unreadable = [r for r in listed if not isinstance(r, JobRecord)]
    if args.json:
        rows = [json.loads(r.to_json()) for r in records]
        rows += [{"name": u.name, "state": "unreadable", "error": u.why} for u in unreadable]
        print(json.dumps(rows, indent=1))
    else:
        table = Table("job", "state", "attempt", "tpu", "bucket", "submitted")
        for r in records:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))
            table.add_row(
                r.name,
                r.state.value,
                str(r.attempt),
                f"{r.num_slices}x {r.tpu_type}",
                r.bucket,
                when,
            )
        for u in unreadable:
            table.add_row(escape(u.name), "[red]unreadable[/]", "", "", "", "")
        Console(highlight=False).print(table)
    for u in unreadable:
        err.print(f"multihost: job {escape(u.name)}: unreadable record: {escape(u.why)}")
    return 1 if unreadable else 0
