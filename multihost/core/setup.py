"""``--setup CMD``: for projects without a lock, CMD runs on every host
at once before the gate, in the staged code dir (inside the locked environment when there is
one). Success is recorded on each host under a key of (CMD, the code's hash): a later run with
the same key skips it, a changed command or code runs it again. A failure on any host stops
the run before the gate with that host's last lines; nothing starts anywhere. Each host's
setup output goes to ``<host>.setup.log`` in the run's log dir.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from multihost.core.supervisor import Supervisor
from multihost.errors import RemoteError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.envsync import SETUP
from multihost.runs.launch import release
from multihost.transport.fanout import Outcome

if TYPE_CHECKING:
    from multihost.envsync.probe import RunnerUv
    from multihost.transport import Completed

TAIL = 5  # lines of a failed setup's output in its error


def setup_key(command: str, code_hash: str) -> str:
    return hashlib.sha256(f"{command}\0{code_hash}".encode()).hexdigest()[:32]


async def run_setup(sup: Supervisor, command: str) -> list[Outcome[None]]:
    """CMD on every host of ``sup``, unless done before for this code; says what it did."""
    key = setup_key(command, sup.code_hash)
    said: dict[int, str] = {}

    async def one(host: Host) -> None:
        slot = sup.slots[host.process_id]
        assert slot.conn is not None
        paths = sup.paths(host)
        env = sup.extra_env.get(host.process_id, {})
        prelude = "".join(f"export {k}={_quote(v)}\n" for k, v in env.items())
        text = prelude + script(
            SETUP, paths={"b": paths.base, "c": paths.code}, key=key, cmd=command
        )
        res = await slot.conn.run(text)
        out = res.stdout.decode(errors="replace")
        word, _, output = out.partition("\n")
        said[host.process_id] = word.strip()
        if word.strip() == "ran":
            log = sup.log_dir / f"{host.file_stem}.setup.log"
            _write_private(log, output)
        if res.exit_status != 0:
            lines = [ln for ln in output.splitlines() if ln.strip()][-TAIL:]
            tail = " | ".join(lines) or "no output"
            raise RemoteError(host, f"setup failed (exit {res.exit_status}): {tail}")

    outcomes = await sup.phase(one, None, None, "setup")
    ran = sum(1 for w in said.values() if w == "ran")
    skipped = sum(1 for w in said.values() if w == "skipped")
    if skipped and not ran:
        sup.note(f"setup: skipped on all {skipped} host(s) (done before for this code and command)")
    else:
        sup.note(f"setup: ran on {ran} host(s)" + (f", skipped on {skipped}" if skipped else ""))
    return outcomes


def _quote(value: str) -> str:
    return shlex.quote(value)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


async def before_launch(
    sup: Supervisor, uv: RunnerUv | None, checked: dict[int, Completed]
) -> list[Outcome[None]]:
    """The locked environment on every host (multihost.envsync), then ``--setup``; on a
    failure or a usage error (a Python that does not satisfy requires-python) every claim is
    released. ``uv`` and ``checked``: the runner's uv and what each host's check said on the
    way (``Prepare``)."""
    from multihost.envsync.phase import sync_environment

    opts = sup.options
    outcomes: list[Outcome[None]] = []
    try:
        if opts.environment is not None:
            outcomes = await sync_environment(sup, opts.environment, uv, checked)
        if opts.setup and all(o.ok for o in outcomes) and not sup.interrupted:
            outcomes = await run_setup(sup, opts.setup)
    finally:
        if not outcomes or sup.interrupted or not all(o.ok for o in outcomes):
            conns = sup.connections
            paths = {h.process_id: sup.paths(h) for h in sup.fleet}
            await release(
                [h for h in sup.fleet if h.process_id in conns],
                conns,
                paths,
                sup.options.launch_timeout,
            )
    return outcomes
