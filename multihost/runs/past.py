"""Runs after the fact: find them, ask their hosts how they are, sync their logs, clean them."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from multihost.defaults import DEFAULTS
from multihost.envsync.store import EnvStore, store_on
from multihost.errors import RemoteError, UsageError
from multihost.model import Fleet, Host, Job, State
from multihost.options import RunOptions
from multihost.remote.commands import (
    Paths,
    clean_cache_command,
    clean_command,
    host_base,
    status_command,
)
from multihost.results.faces import size
from multihost.results.phases import parse as parse_startup
from multihost.results.records import HostResult
from multihost.runs.record import (
    MANIFEST,
    RecordError,
    RunRecord,
    read_record,
    watch_lock,
    write_record,
)
from multihost.runs.stream import classify, code_and_signal, fetch_rest, parse_exit
from multihost.transport import Connection, HostKeyPolicy, SSHOptions
from multihost.transport.fanout import Outcome, on_every_host


def find_run(log_dir: Path, name: str) -> tuple[Path, RunRecord]:
    """A run's local directory and record; a usage error when there is none. ``last``: the
    latest run (:func:`latest_run`)."""
    if name == LATEST and not (log_dir / name).is_dir():
        name = latest_run(log_dir)
    run_dir = log_dir / name
    try:
        return run_dir, read_record(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"no run {name!r} in {log_dir} (see multihost ls)") from None
    except RecordError as exc:
        raise UsageError(f"{run_dir / MANIFEST} is unreadable: {exc}") from None


LATEST = "last"  # RUN for the run most recently written to (a run may not take this name)


def latest_run(log_dir: Path) -> str:
    """The name of the run whose record was written last: the one running now, or else the one
    that ended last (sweep points included); a usage error when there is none."""
    runs = all_runs(log_dir)
    if not runs:
        raise UsageError(f"no runs in {log_dir} yet")
    return runs[0][0]


def all_runs(log_dir: Path) -> list[tuple[str, RunRecord]]:
    """Every readable run under the log dir (sweep points included), newest first."""
    return scan_runs(log_dir)[0]


def scan_runs(log_dir: Path) -> tuple[list[tuple[str, RunRecord]], list[tuple[str, str]]]:
    """The runs under the log dir, newest first, and the ones whose record cannot be read
    (name, why): ``ls`` lists those too, never hides them."""
    if log_dir.exists() and not log_dir.is_dir():
        raise UsageError(f"log dir {log_dir} is not a directory")
    found, unreadable = [], []
    for manifest in log_dir.rglob(MANIFEST):
        name = str(manifest.parent.relative_to(log_dir))
        try:
            found.append((name, read_record(manifest.parent)))
        except RecordError as exc:
            unreadable.append((name, str(exc)))
        except OSError as exc:
            unreadable.append((name, exc.strerror or str(exc)))
    return sorted(found, key=lambda item: -item[1].updated), sorted(unreadable)


def options_from_record(record: RunRecord, log_dir: Path, **overrides: Any) -> RunOptions:
    """The run's own connection settings (ssh config, host-key policy), then any overrides."""
    policy: HostKeyPolicy = "accept-new" if record.ssh.host_keys == "accept-new" else "strict"
    options = RunOptions(
        log_dir=log_dir,
        ssh=SSHOptions(
            config=tuple(Path(p) for p in record.ssh.config),
            host_keys=policy,
            connect_timeout=record.ssh.connect_timeout,
        ),
        fail_fast=record.fail_fast,
        grace=record.grace,
    )
    return replace(options, **{k: v for k, v in overrides.items() if v is not None})


def record_paths(record: RunRecord) -> dict[int, Paths]:
    """Each host's remote paths, by process id."""
    return {h.process_id: Paths.for_host(h, record.job, record.code_hash) for h in record.fleet}


def parse_status(host: Host, text: str) -> HostResult:
    """A host's outcome as its state files say now (``status_command``'s output), with what
    only the host knows: its log's size and when it last grew."""
    header, _, last = text.partition("\n")
    if header.strip() == "missing":
        return HostResult(host, State.MISSING, log_bytes=0)
    words = (header.split() + ["-"] * 10)[:10]
    code, started, ended, stopped, _, alive, kept, mtime, escaped, startup = words
    exit_info = parse_exit(" ".join((code, started, ended, stopped, escaped)))
    exit_code = signal = ended_at = None
    started_at = _float(started)
    if exit_info is None:
        state = State.RUNNING if alive == "yes" else State.VANISHED
    else:
        state = classify(exit_info)
        exit_code, signal = code_and_signal(exit_info, state)
        started_at, ended_at = exit_info.started_at, exit_info.ended_at
    return HostResult(
        host,
        state,
        exit_code=exit_code,
        signal=signal,
        started_at=started_at,
        ended_at=ended_at,
        last_line=last.strip(),
        log_bytes=_int(kept),
        log_mtime=_float(mtime),
        startup=parse_startup(startup),
    )


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


async def host_statuses(record: RunRecord, ssh: SSHOptions) -> list[Outcome[HostResult]]:
    """Ask every host of a run for its state files (unreachable hosts come back as errors)."""
    paths = record_paths(record)

    async def one(conn: Connection) -> HostResult:
        res = await conn.run(status_command(paths[conn.host.process_id]))
        return parse_status(conn.host, res.stdout.decode(errors="replace"))

    return await on_every_host(
        record.fleet, ssh, one, timeout=ssh.connect_timeout + DEFAULTS.status_slack
    )


async def sync_logs(run_dir: Path, record: RunRecord, ssh: SSHOptions) -> list[Outcome[int]]:
    """Append to each local log what the host has beyond it; returns bytes fetched per host."""
    paths = record_paths(record)
    logs = record.logs(run_dir)

    async def one(conn: Connection) -> int:
        local = logs[conn.host.process_id]
        offset = local.stat().st_size if local.exists() else 0
        fd = os.open(local, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "ab") as f:
            await fetch_rest(conn, paths[conn.host.process_id], offset, f.write)
            return f.tell() - offset

    with watch_lock(run_dir):
        return await on_every_host(record.fleet, ssh, one)


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` (or plain seconds) → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        age = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        age = -1.0
    if not 0 <= age < float("inf"):
        raise UsageError(f"not an age: {text!r} (use e.g. 7d, 12h, 30m)")
    return age


async def clean(
    log_dir: Path, older_than: float, ssh: SSHOptions | None, *, dry_run: bool = False
) -> list[str]:
    """Remove finished runs older than ``older_than`` s, on the hosts and locally, then on those
    hosts the staged code and the environments that no remaining run uses and that were last
    used longer ago than that (``multihost.envsync.store``); says what. ``dry_run``: asks the
    hosts which environments would go, removes nothing."""
    said: list[str] = []
    now = time.time()
    gone: dict[tuple[str, str], list[str]] = {}  # (host, base) -> runs removed there so far
    for name, record in all_runs(log_dir):
        age = now - (record.updated or now)
        if age < older_than or record.state == "running":
            continue
        paths = record_paths(record)
        options = ssh or options_from_record(record, log_dir).ssh
        if dry_run:
            said.append(f"would remove {name} ({age / 86400:.1f} days old)")

            async def ask(
                conn: Connection, paths: dict[int, Paths] = paths, run: str = record.job.run_name
            ) -> EnvStore:
                base = paths[conn.host.process_id].base
                removed = gone.setdefault((conn.host.target, base), [])
                removed.append(run)
                return await store_on(conn, base, "dry", older_than, removed)

            said += _env_lines(await on_every_host(record.fleet, options, ask), dry=True)
            continue

        async def rm(conn: Connection, paths: dict[int, Paths] = paths) -> tuple[int, EnvStore]:
            res = await conn.run(clean_command(paths[conn.host.process_id], older_than))
            if res.exit_status != 0:
                raise RemoteError(conn.host, res.stderr.decode(errors="replace").strip())
            pruned = await store_on(conn, paths[conn.host.process_id].base, "prune", older_than)
            return len(res.stdout.split()), pruned

        outcomes = await on_every_host(record.fleet, options, rm)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            reasons = "; ".join(o.error.message for o in failed if o.error)
            said.append(f"kept {name}: could not clean {len(failed)} host(s): {reasons}")
            continue
        shutil.rmtree(log_dir / name)
        said.append(f"removed {name} ({age / 86400:.1f} days old) locally and on its hosts")
        if pruned := sum(o.value[0] for o in outcomes if o.value):
            said.append(f"  and {pruned} staged code dir(s) no remaining run on those hosts uses")
        stores = [Outcome(o.host, o.value[1]) for o in outcomes if o.value]
        said += _env_lines(stores, dry=False)
    return said


async def clean_caches(log_dir: Path, *, dry_run: bool = False) -> list[str]:
    """Remove the compile cache (``BASE/compile-cache``) from every host the log dir's runs
    used, once per host and base, each reached as its newest run reached it; says how much went
    and which hosts could not be asked (``dry_run``: how much there is, removing nothing)."""
    said: list[str] = []
    seen: set[tuple[str, bool, str]] = set()
    kib = held = 0
    for name, record in all_runs(log_dir):
        hosts = []
        for h in record.fleet:
            key = (h.target, h.local, host_base(h, record.job))
            if key not in seen:
                seen.add(key)
                hosts.append(h)
        if not hosts:
            continue

        async def rm(conn: Connection, job: Job = record.job) -> int:
            res = await conn.run(clean_cache_command(conn.host, job, dry=dry_run))
            words = res.stdout.split()
            if res.exit_status != 0 or not words or not words[0].isdigit():
                raise RemoteError(conn.host, res.stderr.decode(errors="replace").strip() or "?")
            return int(words[0])

        ssh = options_from_record(record, log_dir).ssh
        for o in await on_every_host(Fleet(tuple(hosts)), ssh, rm):
            if o.error is not None:
                why = o.error.message
                said.append(f"kept the compile cache of {o.host.name} (run {name}): {why}")
            elif o.value:
                kib += o.value
                held += 1
    verb = "would remove" if dry_run else "removed"
    said.append(f"{verb} the compile cache of {held} of {len(seen)} host(s): {size(kib * 1024)}")
    return said


def _env_lines(stores: list[Outcome[EnvStore]], *, dry: bool) -> list[str]:
    """What a prune removed (or would remove), per environment across the hosts."""
    lines: list[str] = []
    per_key: dict[str, list[int]] = {}
    for o in stores:
        if o.value is None:
            continue
        held = {e.key: e.bytes for e in o.value.envs}
        for key in o.value.removed:
            per_key.setdefault(key, []).append(held.get(key, 0))
    if dry:
        for key, sizes in sorted(per_key.items()):
            lines.append(
                f"  and environment {key[:12]} ({size(sum(sizes))}) on "
                f"{len(sizes)} host(s): no remaining run uses it"
            )
        if failed := [o for o in stores if o.error is not None]:
            why = failed[0].error.message if failed[0].error else "?"
            lines.append(f"  (could not ask {len(failed)} host(s) about environments: {why})")
    elif per_key:
        total = sum(sum(v) for v in per_key.values())
        hosts = sum(1 for o in stores if o.value is not None and o.value.removed)
        lines.append(
            f"  and {len(per_key)} environment(s) no remaining run on those hosts uses "
            f"({size(total)} on {hosts} host(s))"
        )
    return lines


def mark_states(run_dir: Path, record: RunRecord, statuses: list[Outcome[HostResult]]) -> None:
    """Record what a refresh learned about finished hosts in run.json: how each one that the
    record still shows running ended, as its state files say."""
    by_pid = {o.host.process_id: o.value for o in statuses if o.value is not None}
    hosts = []
    for h in record.hosts:
        st = by_pid.get(h.host.process_id)
        if st is not None and st.state in _ENDED and not h.state.final:
            h = replace(
                h,
                state=st.state,
                exit_code=st.exit_code,
                signal=st.signal,
                started_at=st.started_at,
                ended_at=st.ended_at,
                startup=st.startup or h.startup,
            )
        hosts.append(h)
    write_record(run_dir, replace(record, hosts=tuple(hosts)))


_ENDED = frozenset({State.DONE, State.FAILED, State.KILLED})
