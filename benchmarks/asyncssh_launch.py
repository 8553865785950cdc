"""The bare-asyncssh method of benchmarks/fanout.py: the least any asyncssh runner can spend
on the same work, with none of multihost around it.

``python benchmarks/asyncssh_launch.py FLEET_JSON N TARBALL TAG CMD``: asyncssh (the
library multihost uses, with its cipher, host keys checked against the fleet's known_hosts)
opens every host's connection (64 handshakes at a time, as multihost), and one channel
each unpacks the tar.gz sent on stdin into a fresh dir and runs CMD; waits for every exit.
No config file, no claim, no gate, no log, no record: it is a floor under the runner's CPU
per host, not a tool.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import worker_exit
from tests.fleet import Fleet


async def launch(fleet_json: str, n: int, tarball: str, tag: str, cmd: str) -> list[str]:
    """The hosts that failed."""
    import asyncssh

    fleet = Fleet.from_json(Path(fleet_json).read_text()).head(n)
    key = asyncssh.read_private_key(str(fleet.key))
    known = asyncssh.read_known_hosts(str(fleet.known_hosts))
    data = Path(tarball).read_bytes()
    remote = f"fanout-mt/{tag}"
    command = f"mkdir -p {remote} && cd {remote} && tar xzf - && {cmd}"
    gate = asyncio.Semaphore(64)

    async def one(address: str, port: int, user: str) -> bool:
        async with gate:
            conn = await asyncssh.connect(
                address,
                port,
                username=user,
                client_keys=[key],
                known_hosts=known,
                config=None,
                agent_path=None,
                encryption_algs=["aes128-gcm@openssh.com"],
            )
        async with conn:
            result = await conn.run(command, input=data, encoding=None, check=False)
            return result.exit_status == 0

    oks = await asyncio.gather(*(one(h.address, h.port, h.user) for h in fleet.hosts))
    return [h.alias for h, ok in zip(fleet.hosts, oks, strict=True) if not ok]


def main(argv: list[str]) -> int:
    """Stage and run on the first N hosts of the fleet; exit 1 if any host failed."""
    fleet_json, n, tarball, tag, cmd = argv
    failed = asyncio.run(launch(fleet_json, int(n), tarball, tag, cmd))
    return worker_exit("asyncssh", failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
