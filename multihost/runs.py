"""Runs after the fact: find them, ask their hosts how they are, sync their logs, clean them."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multihost.errors import RemoteError, UsageError
from multihost.fanout import Outcome
from multihost.fleetops import on_every_host
from multihost.manifest import (
    MANIFEST,
    host_from_json,
    read_manifest,
    watch_lock,
    write_json_atomic,
)
from multihost.model import Fleet, Host, Job, State
from multihost.plan import Paths, clean_command, finish_command, status_command
from multihost.runstate import RunOptions
from multihost.stream import classify, parse_exit
from multihost.transport import Connection, SSHOptions


def find_run(log_dir: Path, name: str) -> tuple[Path, dict[str, Any]]:
    """A run's local directory and manifest; a usage error when there is none."""
    run_dir = log_dir / name
    try:
        return run_dir, read_manifest(run_dir)
    except FileNotFoundError:
        raise UsageError(f"no run {name!r} in {log_dir} (see multihost ls)") from None
    except ValueError as exc:
        raise UsageError(f"{run_dir / MANIFEST} is unreadable: {exc}") from None


def run_state(record: dict[str, Any]) -> str:
    """One word for a whole run: running, done, failed, killed, interrupted."""
    states = [State(h["state"]) for h in record["hosts"]]
    if not all(s.final for s in states):
        return "running"
    if record.get("interrupted"):
        return "interrupted"
    if all(s is State.DONE for s in states):
        return "done"
    return "killed" if all(s is State.KILLED for s in states) else "failed"


def all_runs(log_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every run under the log dir (sweep points included), newest first."""
    found = []
    for manifest in log_dir.rglob(MANIFEST):
        try:
            found.append(
                (str(manifest.parent.relative_to(log_dir)), read_manifest(manifest.parent))
            )
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda item: -float(item[1].get("updated") or 0))


def options_from_record(record: dict[str, Any], log_dir: Path, **overrides: Any) -> RunOptions:
    """The run's own connection settings (ssh config, host-key policy), then any overrides."""
    ssh = record.get("ssh") or {}
    options = RunOptions(
        log_dir=log_dir,
        ssh=SSHOptions(
            config=tuple(Path(p) for p in ssh.get("config", ())),
            host_keys=ssh.get("host_keys", "strict"),
            connect_timeout=float(ssh.get("connect_timeout", 20.0)),
        ),
        fail_fast=bool(record.get("fail_fast", True)),
        grace=float(record.get("grace", 10.0)),
    )
    return replace(options, **{k: v for k, v in overrides.items() if v is not None})


def _paths(record: dict[str, Any]) -> dict[int, Paths]:
    job = Job(**{k: v for k, v in record["job"].items() if k in Job.__dataclass_fields__})
    code = record.get("code_hash") or ""
    hosts = [host_from_json(h["host"]) for h in record["hosts"]]
    return {h.process_id: Paths.for_host(h, job, code) for h in hosts}


def record_fleet(record: dict[str, Any]) -> Fleet:
    return Fleet(tuple(host_from_json(h["host"]) for h in record["hosts"]))


@dataclass(frozen=True)
class HostStatus:
    """What a host's state files say right now."""

    host: Host
    state: str
    exit_code: int | None
    started_at: float | None
    ended_at: float | None
    stopped_by: str | None
    log_bytes: int
    last_line: str


def parse_status(host: Host, text: str) -> HostStatus:
    """Parse ``status_command`` output."""
    header, _, last = text.partition("\n")
    if header.strip() == "missing":
        return HostStatus(host, "missing", None, None, None, None, 0, "")
    fields = (header.split() + ["-"] * 7)[:7]
    exit_info = parse_exit(" ".join(fields[:4]))
    alive, size = fields[5], fields[6]
    started = exit_info.started_at if exit_info else _float(fields[1])
    if exit_info is None:
        state = "running" if alive == "yes" else "vanished"
        return HostStatus(host, state, None, started, None, None, _int(size), last.strip())
    word = {State.DONE: "exited", State.FAILED: "exited", State.KILLED: "killed"}
    return HostStatus(
        host, word.get(classify(exit_info), "exited"), exit_info.code, started,
        exit_info.ended_at, exit_info.stopped_by, _int(size), last.strip(),
    )  # fmt: skip


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


async def host_statuses(record: dict[str, Any], ssh: SSHOptions) -> list[Outcome[HostStatus]]:
    """Ask every host of a run for its state files (unreachable hosts come back as errors)."""
    paths = _paths(record)

    async def one(conn: Connection) -> HostStatus:
        res = await conn.run(status_command(paths[conn.host.process_id]))
        return parse_status(conn.host, res.stdout.decode(errors="replace"))

    return await on_every_host(record_fleet(record), ssh, one, timeout=ssh.connect_timeout + 30)


async def sync_logs(run_dir: Path, record: dict[str, Any], ssh: SSHOptions) -> list[Outcome[int]]:
    """Append to each local log what the host has beyond it; returns bytes fetched per host."""
    paths = _paths(record)
    logs = {host_from_json(h["host"]).process_id: run_dir / h["log"] for h in record["hosts"]}

    async def one(conn: Connection) -> int:
        local = logs[conn.host.process_id]
        offset = local.stat().st_size if local.exists() else 0
        res = await conn.run(finish_command(paths[conn.host.process_id], offset))
        header, _, rest = res.stdout.partition(b"\n")
        if header.strip() == b"missing":
            raise RemoteError(conn.host, "run directory is gone from the host")
        with local.open("ab") as f:
            f.write(rest)
        return len(rest)

    with watch_lock(run_dir):
        return await on_every_host(record_fleet(record), ssh, one)


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` (or plain seconds) → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        if text[-1:] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise UsageError(f"not an age: {text!r} (use e.g. 7d, 12h, 30m)") from None


async def clean(
    log_dir: Path, older_than: float, ssh: SSHOptions | None, *, dry_run: bool = False
) -> list[str]:
    """Remove finished runs older than ``older_than`` s, on the hosts and locally; says what."""
    said: list[str] = []
    now = time.time()
    for name, record in all_runs(log_dir):
        age = now - float(record.get("updated") or now)
        if age < older_than or run_state(record) == "running":
            continue
        paths = _paths(record)
        if dry_run:
            said.append(f"would remove {name} ({age / 86400:.1f} days old)")
            continue

        async def rm(conn: Connection, paths: dict[int, Paths] = paths) -> int:
            res = await conn.run(clean_command(paths[conn.host.process_id], older_than))
            if res.exit_status != 0:
                raise RemoteError(conn.host, res.stderr.decode(errors="replace").strip())
            return len(res.stdout.split())

        options = ssh or options_from_record(record, log_dir).ssh
        outcomes = await on_every_host(record_fleet(record), options, rm)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            reasons = "; ".join(o.error.message for o in failed if o.error)
            said.append(f"kept {name}: could not clean {len(failed)} host(s): {reasons}")
            continue
        shutil.rmtree(log_dir / name)
        said.append(f"removed {name} ({age / 86400:.1f} days old) locally and on its hosts")
        if pruned := sum(o.value or 0 for o in outcomes):
            said.append(f"  and {pruned} staged code dir(s) no remaining run on those hosts uses")
    return said


def mark_states(run_dir: Path, record: dict[str, Any], statuses: list[Outcome[HostStatus]]) -> None:
    """Record what a refresh learned about finished hosts in run.json."""
    by_pid = {o.host.process_id: o.value for o in statuses if o.value is not None}
    for h in record["hosts"]:
        st = by_pid.get(int(h["host"]["process_id"]))
        if st is not None and st.state in ("exited", "killed") and not State(h["state"]).final:
            h["state"] = (
                "done" if st.exit_code == 0 else ("killed" if st.state == "killed" else "failed")
            )
            h["exit_code"], h["started_at"], h["ended_at"] = (
                st.exit_code,
                st.started_at,
                st.ended_at,
            )
    record["updated"] = time.time()
    write_json_atomic(run_dir / MANIFEST, record)
