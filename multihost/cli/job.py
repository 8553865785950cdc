"""``multihost job ...``: the production path's arguments read, the library's functions
called (``multihost.api.jobs``, as ``multihost.submit_job`` and a ``JobHandle`` are) and what
they say and return printed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from multihost.api import jobs as api


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


def _json_line(attempt: int) -> Callable[[str, str], None]:
    """``logs --json``: one JSON object per log line on stdout."""

    def line(host: str, text: str) -> None:
        sys.stdout.write(json.dumps({"host": host, "attempt": attempt, "line": text}) + "\n")
        sys.stdout.flush()

    return line


def cmd_job(args: argparse.Namespace, err: Console) -> int:
    handlers: dict[str, Callable[[argparse.Namespace, Console], int]] = {
        "submit": _submit,
        "watch": _watch,
        "status": _status,
        "logs": _logs,
        "stop": _stop,
        "ls": _ls,
    }
    return handlers[args.job_command](args, err)


def _submit(args: argparse.Namespace, err: Console) -> int:
    handle = api.submitted(args.name, vars(args), _Display(err).note)
    if args.watch and args.detach:
        return _detach(handle, args, err)
    return _follow(handle, args, err, fresh=True) if args.watch else 0


def _detach(handle: api.JobHandle, args: argparse.Namespace, err: Console) -> int:
    pid, log = handle.detach(
        keep=args.keep,
        poll=args.poll,
        resubmit=args.resubmit,
        control_plane_timeout=args.control_plane_timeout,
    )
    err.print(
        f"[bold]multihost:[/] watching job {escape(args.name)} in the background (pid {pid}); "
        f"its output: {escape(str(log))}; see it with: multihost job status {escape(args.name)}"
    )
    return 0


def _watch(args: argparse.Namespace, err: Console) -> int:
    handle = api.job(args.name)
    if args.detach:
        return _detach(handle, args, err)
    return _follow(handle, args, err, fresh=False)


def _follow(handle: api.JobHandle, args: argparse.Namespace, err: Console, *, fresh: bool) -> int:
    display = _Display(err)
    try:
        outcome = handle.watch(
            keep=args.keep,
            poll=args.poll,
            resubmit=args.resubmit,
            control_plane_timeout=args.control_plane_timeout,
            on_line=display.line,
            on_hosts=display.hosts,
            say=display.note,
            fresh=fresh,
        )
    except KeyboardInterrupt:
        display.note(
            f"stopped watching; job {handle.name} keeps running on its queued resource. "
            f"Follow it again: multihost job watch {handle.name} — "
            f"end it: multihost job stop {handle.name}"
        )
        return 130
    style = "green" if outcome.exit_code == 0 else "red"
    err.print(
        f"[{style}]job {outcome.record.name} {outcome.record.state.value}:[/] "
        f"{escape(outcome.message)}"
    )
    return outcome.exit_code


def _status(args: argparse.Namespace, err: Console) -> int:
    handle = api.job(args.name)
    st = handle.status()
    r = st.record
    watching = handle.watchers()
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


def _logs(args: argparse.Namespace, err: Console) -> int:
    from multihost.errors import UsageError

    handle = api.job(args.name)
    host = api._host(args.host)
    if args.follow:
        if args.all or args.attempt not in (None, handle.status().record.attempt):
            raise UsageError("--follow follows one host of the current attempt")
        line = _json_line(handle.record.attempt) if args.json else _Display(err).line
        try:
            handle.follow_log(
                host,
                on_line=line,
                poll=args.poll,
                control_plane_timeout=args.control_plane_timeout,
                say=_Display(err).warn,
            )
        except KeyboardInterrupt:
            return 130
        return 0
    text = handle.logs(host, attempt=args.attempt)  # reads the bucket's record first
    attempt = handle.record.attempt if args.attempt is None else args.attempt
    hosts = {f"s{host[0]}/w{host[1]}": text}
    if args.all:
        hosts = {
            f"s{w.slice_id}/w{w.worker}": handle.logs((w.slice_id, w.worker), attempt=attempt)
            for w in handle.workers(attempt)
        }
    jsonl = _json_line(attempt)
    for name, text in hosts.items():
        for each in text.splitlines():
            if args.json:
                jsonl(name, each)
            else:
                print(f"{name} | {each}" if args.all else each)
    return 0


def _stop(args: argparse.Namespace, err: Console) -> int:
    api.job(args.name).stop(say=lambda text: err.print(escape(text)))
    return 0


def _ls(args: argparse.Namespace, err: Console) -> int:
    handles, unreadable = api.listing()
    records = [h.record for h in handles]
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
