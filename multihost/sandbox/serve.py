"""The sandbox's background process: its hosts and the stand-in cloud, until SIGTERM.

``python -m multihost.sandbox.serve --dir STATE --hosts N --sshd SSHD``, started by
``multihost sandbox up`` (``multihost.sandbox.control``), which waits for ``STATE/env``: this
process writes it last, once everything answers. On SIGTERM it deletes every pod still up (its
workers' processes killed), stops the servers and the hosts, and exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from multihost.cloud.gcloud import require
from multihost.sandbox.hosts import MARK, VM_PATH, Hosts, write
from multihost.sandbox.hosts import exports as export_lines
from multihost.sandbox.standin.boot import run_ssh, ssh_launch_command
from multihost.sandbox.standin.env import BUCKET, gcloud_env
from multihost.sandbox.standin.gcs import FakeGcs
from multihost.sandbox.standin.guest import GuestAgent
from multihost.sandbox.standin.resources import QueuedResource, Worker
from multihost.sandbox.standin.secrets import SecretManager
from multihost.sandbox.standin.tpu_api import TpuApi

READY = "env"  # the file written last: `up` waits for it, `env` prints it
FAILED = "sandbox failed: "  # the log's last line when it could not start


def _launcher(
    hosts: Hosts, tpu: list[TpuApi], gcs: FakeGcs, secrets: SecretManager
) -> Callable[[Worker, QueuedResource], None]:
    """How a provisioned worker comes up: its sessions made a TPU VM's (the metadata server,
    gcloud reaching the stand-ins), then the queued resource's startup script run on it."""

    def launch(worker: Worker, qr: QueuedResource) -> None:
        api = tpu[0]
        host = hosts.hosts[worker.host]
        vm = str(host.vm)
        endpoints = gcloud_env("", api.endpoint, gcs.endpoint, secrets.endpoint)
        reach = {k: v for k, v in endpoints.items() if k.startswith("CLOUDSDK_API_ENDPOINT")}
        hosts.set_vm_env(
            worker.host,
            {
                "GCE_METADATA_HOST": worker.metadata.host,
                "GCE_METADATA_ROOT": worker.metadata.host,
                **reach,
                "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
                "CLOUDSDK_CONFIG": f"{vm}/gcloud-vm",
            },
        )
        # the startup script's: as the tests' fleet's VMs boot (tests/cloud/fixture.py)
        env = {k: v for k, v in endpoints.items() if k != "CLOUDSDK_CONFIG"} | {
            "GCE_METADATA_HOST": worker.metadata.host,
            "MULTIHOST_WORK_DIR": f"{vm}/work",  # a job's, else /var/tmp/multihost-UID: shared
            "TMPDIR": str(host.tmp),
            MARK: str(host.dir),
        }
        command = ssh_launch_command(env, vm, path=hosts.path)
        run_ssh(str(hosts.ssh_config), host.alias, command, qr.startup_script)

    return launch


def _config(state: Path, hosts: Hosts) -> None:
    """multihost's own config file for the sandbox's shell: how to reach the hosts, and no
    key of gcloud's added to the stand-in pods' metadata (the hosts take the sandbox's)."""
    config = state / "config" / "multihost"
    config.mkdir(parents=True, mode=0o700)
    write(config / "config.toml", f'ssh-config = "{hosts.ssh_config}"\nno-add-key = true\n')
    for d in ("xdg-state", "logs", "gcloud-config"):
        (state / d).mkdir(mode=0o700, exist_ok=True)


def exports(state: Path, cloud: dict[str, str]) -> str:
    """The shell's ``export`` lines: gcloud pointed at the stand-ins, multihost's config, logs
    and records inside the state dir."""
    chosen = dict(cloud)
    chosen["MULTIHOST_LOG_DIR"] = str(state / "logs")
    chosen["XDG_CONFIG_HOME"] = str(state / "config")  # multihost's config.toml, above
    chosen["XDG_STATE_HOME"] = str(state / "xdg-state")  # pod records, pinned host keys
    chosen["MULTIHOST_SANDBOX_DIR"] = str(state)
    return export_lines(dict(sorted(chosen.items())))


def _start(gcs: FakeGcs, failed: list[BaseException]) -> None:
    try:
        gcs.start()
    except Exception as exc:
        failed.append(exc)


def serve(state: Path, n: int, sshd: str) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    t0 = time.monotonic()
    gcloud_dir = os.path.dirname(os.path.abspath(require()))
    path = ":".join(dict.fromkeys([gcloud_dir, *VM_PATH.split(":")]))  # a TPU VM's gcloud
    gcs = FakeGcs(state / "gcs")
    hosts = Hosts(state, n, sshd, path)
    secrets = SecretManager()
    holder: list[TpuApi] = []
    tpu = TpuApi(range(n), _launcher(hosts, holder, gcs, secrets), hosts.clear)
    holder.append(tpu)
    gcs_failed: list[BaseException] = []
    gcs_ready = threading.Thread(target=_start, args=(gcs, gcs_failed))
    try:
        gcs_ready.start()  # its start overlaps the hosts'
        hosts.start()
        gcs_ready.join()
        if gcs_failed:
            raise gcs_failed[0]
        gcs.create_bucket(BUCKET)
        tpu.vm_image = True  # its VMs serve what a TPU VM serves to a session: autodown works
        tpu.host_key = lambda i: hosts.hosts[i].host_key()
        tpu.guest_agent = GuestAgent(
            hosts.guest_keys, lambda i: hosts.user, file_of=lambda i: hosts.hosts[i].alias
        )
        _config(state, hosts)
        cloud = gcloud_env(
            str(state / "gcloud-config"), tpu.endpoint, gcs.endpoint, secrets.endpoint
        )
        write(state / READY, exports(state, cloud))
        print(f"sandbox: {n} hosts, TPU API {tpu.endpoint}, {time.monotonic() - t0:.2f} s")
        sys.stdout.flush()
        stop.wait()
    finally:
        (state / READY).unlink(missing_ok=True)
        if gcs_ready.ident is not None:
            gcs_ready.join()
        # each server's shutdown waits out its poll (0.5 s): all at once, the pods' processes
        # killed by the TPU API's, every host's by the hosts'
        stopping = [threading.Thread(target=f) for f in (tpu.stop, secrets.stop, gcs.stop)]
        for thread in stopping:
            thread.start()
        hosts.stop()
        for thread in stopping:
            thread.join()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multihost.sandbox.serve")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--sshd", required=True)
    args = parser.parse_args(argv)
    try:
        serve(args.dir, args.hosts, args.sshd)
    except Exception as exc:  # the cause, as the log's last line: `up` says it
        traceback.print_exc()
        print(f"{FAILED}{exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
