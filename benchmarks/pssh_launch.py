"""The parallel-ssh method of benchmarks/fanout.py, run as its own process (like the others).

``python benchmarks/pssh_launch.py FLEET_JSON N TARBALL TAG CMD``: parallel-ssh 2.16's
``ParallelSSHClient`` (libssh2) copies the archive to every host over SFTP (``copy_file``),
then one ``run_command`` unpacks it into a fresh dir and runs CMD; waits for every exit.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Stage and run on the first N hosts of the fleet; exit 1 if any host failed."""
    fleet_json, n, tarball, tag, cmd = argv
    from gevent import joinall
    from pssh.clients import ParallelSSHClient
    from pssh.config import HostConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.results import worker_exit
    from tests.fleet import Fleet

    fleet = Fleet.from_json(Path(fleet_json).read_text()).head(int(n))
    config = [HostConfig(user=h.user, port=h.port, private_key=str(fleet.key)) for h in fleet.hosts]
    client = ParallelSSHClient([h.address for h in fleet.hosts], host_config=config)
    name = Path(tarball).name
    joinall(client.copy_file(tarball, name), raise_error=True)
    remote = f"fanout-mt/{tag}"
    output = client.run_command(
        f"mkdir -p {remote} && mv {name} {remote}/ && cd {remote} && tar xzf {name} && {cmd}"
    )
    client.join(output)
    failed = [o.host for o in output if o.exit_code != 0 or o.exception is not None]
    return worker_exit("parallel-ssh", failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
