"""Bytes on the wire per host: what the runner writes to each host's socket for one run of a
trivial command, SSH handshake included, multihost (cold and warm, with and without a locked
environment) beside parallel-ssh and bare asyncssh running the same command.

Every host of the loopback fleet (``tests/fleet.py``) is reached through a counting TCP relay
on 127.0.0.1 (one listener per host, in this process): the runner connects to the relay, the
relay to the host's sshd, and it counts the bytes each way. *up*: bytes the runner wrote to
the host (handshake, authentication, channels, commands, staged code and scripts); *down*:
bytes the host wrote back. Rows:

- ``multihost cold``: ``multihost run`` on hosts that have nothing of it (a fresh
  ``--remote-dir``): the code, the hook and the run's scripts go to every host;
- ``multihost warm``: the same command again (a new run name, the same code): nothing but the
  run itself should go;
- ``multihost cold/warm, environment``: the same with a ``uv.lock`` in the code dir (one
  small locked dependency from a local index): the environment is built once and shipped
  cold; warm, each host only checks that it has it;
- ``parallel-ssh``: parallel-ssh 2.16 (libssh2), one ``run_command`` per host;
- ``asyncssh``: bare asyncssh, one ``conn.run`` per host (the floor under an asyncssh runner).

Medians over ``--repeat`` rounds (methods interleaved in each round), per host.
Usage: ``python benchmarks/wire.py [--hosts 4] [--repeat 3]`` (hold /tmp/mh-ssh.lock if other
work uses the fleet); writes its section of benchmarks/RESULTS.md. Traffic: 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fanout import machine  # noqa: E402
from benchmarks.results import markers, write_section  # noqa: E402
from tests import fleet as loopback  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.relay import Relay, relayed_client  # noqa: E402

TIMEOUT = 300.0
COMMAND = "true"
GOAL = 8 * 1024  # a warm re-run: at most this many bytes per host in all, handshake included


def multihost(
    config: Path, hosts: str, code: Path, remote: str, logs: Path, root: Path = ROOT
) -> None:
    """One ``multihost run`` of COMMAND, multihost from the checkout ``root``."""
    argv = [
        sys.executable,
        "-m",
        "multihost",
        "run",
        "--hosts",
        hosts,
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--remote-dir",
        remote,
        "--log-dir",
        str(logs),
        "--stream",
        "none",
        "--run-name",
        f"wire-{secrets.token_hex(4)}",
        "--cmd",
        COMMAND,
    ]
    # from elsewhere than ``root`` (python -m puts the working directory first on the path),
    # writing no bytecode into another checkout
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=logs.parent
    )
    if r.returncode != 0:
        raise RuntimeError(f"multihost rc={r.returncode}: {(r.stdout + r.stderr)[-1500:]}")


def pssh(fleet: loopback.Fleet, relay: Relay) -> None:
    code = (
        "import sys\n"
        "from pssh.clients import ParallelSSHClient\n"
        "from pssh.config import HostConfig\n"
        "ports, users, key = sys.argv[1].split(','), sys.argv[2].split(','), sys.argv[3]\n"
        "cfg = [HostConfig(user=u, port=int(p), private_key=key) for p, u in zip(ports, users)]\n"
        "c = ParallelSSHClient(['127.0.0.1'] * len(ports), host_config=cfg)\n"
        f"out = c.run_command({COMMAND!r})\n"
        "c.join(out)\n"
        "sys.exit(any(o.exit_code != 0 or o.exception for o in out))\n"
    )
    ports = ",".join(map(str, relay.ports))
    users = ",".join(h.user for h in fleet.hosts)
    argv = [sys.executable, "-c", code, ports, users, str(fleet.key)]
    subprocess.run(argv, check=True, timeout=TIMEOUT, capture_output=True)


def bare_asyncssh(fleet: loopback.Fleet, relay: Relay, known: Path) -> None:
    code = (
        "import asyncio, sys, asyncssh\n"
        "ports, users, key, known = sys.argv[1].split(','), sys.argv[2].split(','), "
        "sys.argv[3], sys.argv[4]\n"
        "async def one(p, u):\n"
        "    async with asyncssh.connect('127.0.0.1', int(p), username=u, client_keys=[key],\n"
        "            known_hosts=known, config=None, agent_path=None,\n"
        "            encryption_algs=['aes128-gcm@openssh.com']) as c:\n"
        f"        return (await c.run({COMMAND!r}, check=False)).exit_status\n"
        "async def main():\n"
        "    return await asyncio.gather(*(one(p, u) for p, u in zip(ports, users)))\n"
        "sys.exit(any(asyncio.run(main())))\n"
    )
    ports = ",".join(map(str, relay.ports))
    users = ",".join(h.user for h in fleet.hosts)
    argv = [sys.executable, "-c", code, ports, users, str(fleet.key), str(known)]
    subprocess.run(argv, check=True, timeout=TIMEOUT, capture_output=True)


def code_dir(root: Path, index_url: str | None) -> Path:
    """A small code dir (a few files, ~5 KB); with ``index_url``, a uv project with a lock."""
    root.mkdir(parents=True)
    (root / "main.py").write_text("print('hello')\n" * 40)
    (root / "README.md").write_text("wire benchmark\n" * 200)
    if index_url is not None:
        from tests.pyindex import uv_project

        uv_project(root, index_url)
    return root


def measure(relay: Relay, n: int, action: Callable[[], None]) -> tuple[float, float]:
    """Bytes per host up and down for one ``action``."""
    relay.reset()
    action()
    wait_for(lambda: relay.open == 0, 30, "the relayed connections to end")
    up, down = relay.totals()
    return up / n, down / n


METHODS = (
    "multihost cold",
    "multihost warm",
    "multihost cold, environment",
    "multihost warm, environment",
    "parallel-ssh",
    "asyncssh",
)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="also measure the multihost of another checkout (rows 'before: ...')",
    )
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    fleet = loopback.load().head(args.hosts)
    relay = Relay([(h.address, h.port) for h in fleet.hosts])
    relay.start()
    from tests.pyindex import tinyab

    methods = [*METHODS]
    roots = [("", ROOT)]
    if args.before is not None:
        roots.append(("before: ", args.before.resolve()))
        methods[4:4] = [f"before: {m}" for m in METHODS[:4]]
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(prefix="mh-wire-") as tmp:
        t = Path(tmp)
        config = relayed_client(fleet, relay, t / "client")
        hosts = ",".join(h.alias for h in fleet.hosts)
        index = tinyab(t / "index")
        with index.serving():
            plain, project = code_dir(t / "plain", None), code_dir(t / "project", index.url)
            for r in range(args.repeat):
                for label, root in roots:
                    remote = f"~/.mh-wire-{secrets.token_hex(4)}"  # nothing of multihost there
                    logs = t / f"logs{r}"
                    for name, code in (("", plain), (", environment", project)):
                        run = functools.partial(multihost, config, hosts, code, remote, logs, root)
                        rows[f"{label}multihost cold{name}"].append(measure(relay, args.hosts, run))
                        rows[f"{label}multihost warm{name}"].append(measure(relay, args.hosts, run))
                    for h in fleet.hosts:
                        shutil.rmtree(h.home / remote[2:], ignore_errors=True)
                rows["parallel-ssh"].append(measure(relay, args.hosts, lambda: pssh(fleet, relay)))
                rows["asyncssh"].append(
                    measure(
                        relay,
                        args.hosts,
                        lambda: bare_asyncssh(fleet, relay, t / "client" / "known_hosts"),
                    )
                )
                print(f"round {r + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    table = [
        "| method | up: runner → host (bytes/host) | down: host → runner (bytes/host) |",
        "|---|---:|---:|",
    ]
    for m in methods:
        up = statistics.median(u for u, _ in rows[m])
        down = statistics.median(d for _, d in rows[m])
        table.append(f"| {m} | {up:,.0f} | {down:,.0f} |")
    warm = statistics.median(u for u, _ in rows["multihost warm"])
    warm_env = statistics.median(u for u, _ in rows["multihost warm, environment"])
    verdict = (
        f"Goal: a warm re-run writes at most {GOAL:,} bytes per host in all: "
        f"{warm:,.0f} ({'met' if warm <= GOAL else 'MISSED'}), with an environment "
        f"{warm_env:,.0f} ({'met' if warm_env <= GOAL else 'MISSED'})."
    )
    begin, end = markers("wire")
    block = "\n".join(
        [
            begin,
            "## Bytes on the wire per host: one trivial run",
            "",
            f"Machine: {machine()}; {args.hosts} loopback hosts, {args.repeat} round(s), "
            f"medians; load average before/after: {load_before:.1f} / "
            f"{os.getloadavg()[0]:.1f}.",
            "",
            "Every byte counted at the socket by a TCP relay on 127.0.0.1 between the runner "
            "and each host's sshd (SSH handshake, authentication, channels, commands and "
            f"anything staged), for `{COMMAND}` run once. Cold: a fresh `--remote-dir` (no "
            "code, hook or scripts there); warm: the same command again. With an environment: "
            "the code dir has a `uv.lock` (one small locked dependency from a local index).",
            "",
            f"Command: `python benchmarks/wire.py --hosts {args.hosts} --repeat {args.repeat}"
            + (" --before DIR`" if args.before else "`")
            + (
                f" (`before`: the checkout {args.before}, this branch's base, measured in the "
                "same rounds)"
                if args.before
                else ""
            ),
            "",
            *table,
            "",
            verdict,
            end,
        ]
    )
    print(block)
    if not args.no_write:
        write_section("wire", block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
