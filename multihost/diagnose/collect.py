"""Taking the stacks: one shell script per host, all hosts at once, then parse and save.

On each host the script signals (SIGUSR2) every live process of the run whose stack hook is
listening — found by the hook's ``<pid>.ready`` file *and* the process' own environment naming
this run's hook dir, so a recycled pid is never signalled — waits until the dumps stop growing
and prints them. With ``native`` it adds ``py-spy dump --native`` where py-spy is installed.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from multihost import remote
from multihost.diagnose.stacks import HostStacks, ProcessStack, StackReport, group, parse_dump
from multihost.model import Fleet, Host
from multihost.runs.files import private_dir
from multihost.transport import Connection, SSHOptions
from multihost.transport.fanout import Outcome, map_hosts, on_every_host

HOOK_DIR = "hook"  # under the run's directory on each host


def collect_command(run_dir: str, native: bool = False) -> str:
    """The collection script with its two arguments: the run's remote dir, native or not."""
    text = remote.load("stacks").text
    return f"sh -c {shlex.quote(text)} sh {shlex.quote(run_dir)} {int(native)}"


@dataclass(frozen=True)
class Dump:
    """One host's raw answer (saved as it came) and what was parsed from it."""

    raw: str
    stacks: HostStacks


def parse_collect(host: Host, text: str) -> Dump:
    """The collection script's output → that host's processes and their threads."""
    lines = text.splitlines()
    home = lines[0].removeprefix("home ").strip() if lines and lines[0].startswith("home ") else ""
    if len(lines) > 1 and lines[1] == "nohook":
        error = "the run has no stack hook (started by an older multihost, or without Python)"
        return Dump(text, HostStacks(host, (), error))
    if "== end" not in lines:
        return Dump(text, HostStacks(host, (), "the stack collection did not finish"))
    processes: list[ProcessStack] = []
    pid, command, body = 0, "", list[str]()
    for line in [*lines[1:]]:
        if line.startswith("== "):
            if pid:
                processes.append(_process(pid, command, body, home))
            words = line[3:].split(" ", 1)
            if words[0] == "end":
                break
            pid, command, body = int(words[0]), (words[1] if len(words) > 1 else ""), []
        else:
            body.append(line)
    if not processes:
        return Dump(text, HostStacks(host, (), "no Python process of the run is alive"))
    return Dump(text, HostStacks(host, tuple(processes)))


def _process(pid: int, command: str, body: Sequence[str], home: str) -> ProcessStack:
    text = "\n".join(body)
    dump, _, native = text.partition("-- native")
    return ProcessStack(pid, command, parse_dump(dump, home), native.strip(": \n"))


async def collect(
    hosts: Sequence[Host],
    run_dirs: dict[int, str],
    ssh: SSHOptions,
    *,
    native: bool = False,
    limit: int = 64,
) -> list[Dump]:
    """Every host's stacks at once (new connections; bounded handshakes)."""

    async def one(conn: Connection) -> Dump:
        return await _collect_one(conn, run_dirs[conn.host.process_id], native)

    outcomes = await on_every_host(Fleet(tuple(hosts)), ssh, one, limit=limit, timeout=60)
    return [_dump(o) for o in outcomes]


async def collect_over(
    hosts: Sequence[Host],
    conns: Mapping[int, Connection],
    run_dirs: Mapping[int, str],
    *,
    native: bool = False,
) -> list[Dump]:
    """Every host's stacks at once over connections already open (a live run's), all keyed by
    the hosts' process ids in this run."""

    async def one(host: Host) -> Dump:
        dump = await _collect_one(conns[host.process_id], run_dirs[host.process_id], native)
        return Dump(dump.raw, replace(dump.stacks, host=host))

    outcomes = await map_hosts(one, hosts, timeout=60, what="stacks")
    return [_dump(o) for o in outcomes]


async def _collect_one(conn: Connection, run_dir: str, native: bool) -> Dump:
    res = await conn.run(collect_command(run_dir, native))
    return parse_collect(conn.host, res.stdout.decode(errors="replace"))


def _dump(o: Outcome[Dump]) -> Dump:
    if o.value is not None:
        return o.value
    reason = o.error.message if o.error else "failed"
    return Dump("", HostStacks(o.host, (), reason))


def save(dumps: Sequence[Dump], log_dir: Path) -> Path:
    """The raw per-host answers under ``log_dir/stacks/<time>/``; returns that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = log_dir / "stacks" / stamp, 1
    while folder.exists():
        n += 1
        folder = log_dir / "stacks" / f"{stamp}.{n}"
    private_dir(folder)
    for d in dumps:
        text = d.raw or f"error: {d.stacks.error}\n"
        path = folder / f"{d.stacks.host.file_stem}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return folder


async def take(
    hosts: Sequence[Host],
    run_dirs: dict[int, str],
    ssh: SSHOptions,
    log_dir: Path,
    *,
    native: bool = False,
    all_threads: bool = False,
    limit: int = 64,
) -> tuple[StackReport, Path]:
    """Collect every host's stacks, save the raw dumps under ``log_dir``, group them."""
    dumps = await collect(hosts, run_dirs, ssh, native=native, limit=limit)
    folder = save(dumps, log_dir)
    return group((d.stacks for d in dumps), all_threads=all_threads), folder
