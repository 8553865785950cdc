"""The ``cloud`` pytest fixture: fake GCS + the TPU API stand-in + the loopback fleet (the
stand-in's servers are the package's, ``multihost.sandbox.standin``; the fleet is the tests',
one Unix user per host)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from multihost.sandbox.standin.boot import run_ssh, ssh_launch_command
from multihost.sandbox.standin.env import BUCKET as BUCKET
from multihost.sandbox.standin.env import ZONE as ZONE
from multihost.sandbox.standin.env import free_port, gcloud_env
from multihost.sandbox.standin.faults import FaultProxy, Faults
from multihost.sandbox.standin.gcs import FakeGcs
from multihost.sandbox.standin.guest import GuestAgent
from multihost.sandbox.standin.resources import QueuedResource, Worker
from multihost.sandbox.standin.secrets import SecretManager
from multihost.sandbox.standin.tpu_api import TpuApi
from tests import fleet as loopback
from tests import gcloud_zygote


@contextlib.contextmanager
def bucket_for_hosts(
    hosts: Sequence[loopback.FleetHost], root: Path, bucket: str
) -> Iterator[tuple[FakeGcs, dict[str, str]]]:
    """fake-gcs-server with ``bucket``; each host's own gcloud config points at it (as a VM's
    would at Cloud Storage); yields it and the env that points the runner's gcloud there."""
    gcs = FakeGcs(root / "gcs")
    gcs.start()
    made: list[Path] = []
    try:
        gcs.create_bucket(bucket)
        for h in hosts:
            config = h.home / ".config" / "gcloud"
            if config.exists():
                pytest.skip(f"{config} exists: not overwriting it")
            made.append(config)
            (config / "configurations").mkdir(parents=True)
            (config / "active_config").write_text("default")
            (config / "configurations" / "config_default").write_text(
                "[core]\nproject = p\ndisable_prompts = true\n[auth]\ndisable_credentials = true\n"
                f"[api_endpoint_overrides]\nstorage = {gcs.endpoint}\n"
            )
            for p in (config.parent, *config.parent.rglob("*")):
                shutil.chown(p, h.user, h.user)
        (root / "gcloud").mkdir()
        dead = "http://127.0.0.1:9/"
        yield gcs, gcloud_env(str(root / "gcloud"), dead, gcs.endpoint, dead)
    finally:
        for config in made:
            shutil.rmtree(config.parent, ignore_errors=True)
        gcs.stop()


@dataclass
class Cloud:
    """What a test sees: the servers, the env for the runner's gcloud, and the hooks."""

    gcs: FakeGcs
    tpu: TpuApi
    fleet: loopback.Fleet
    env: dict[str, str]
    secrets: SecretManager
    faults: Faults
    faulty_env: dict[str, str]  # the runner's gcloud through the faults (storage and TPU API)
    guest: GuestAgent
    bucket: str = BUCKET

    def preempt(self, name: str, notice: float = 1.0) -> None:
        """Spot preemption, ``notice`` seconds after its notice (GCE gives 30 s)."""
        self.tpu.preempt(name, notice)

    def fail(self, name: str) -> None:
        self.tpu.fail(name)

    def break_storage(self, name: str) -> None:
        """The named resource's VMs cannot reach Cloud Storage at all."""
        self.tpu.broken_storage.add(name)

    def requests(self, method: str | None = None) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.tpu.requests if method in (None, r.method)]

    def objects(self, prefix: str = "") -> dict[str, int]:
        return self.gcs.objects(self.bucket, prefix)

    def read(self, name: str) -> str:
        return self.gcs.read(self.bucket, name).decode()


def scratch_dir(host: loopback.FleetHost) -> Path:
    """Where a worker's startup script and its gcloud config live on that host (the VM's own
    /tmp): removed when the stand-in stops."""
    return Path(f"/tmp/multihost-cloud-{host.user}")


def vm_session_env(host: loopback.FleetHost, tpu: TpuApi, worker: Worker) -> dict[str, str]:
    """What an ordinary SSH session on a TPU VM image has: the metadata server (as
    ``GCE_METADATA_HOST`` for google-auth, ``GCE_METADATA_ROOT`` for gcloud) and gcloud, on
    PATH, reaching the TPU API (here the stand-in) with no credentials of its own."""
    return {
        "GCE_METADATA_HOST": worker.metadata.host,
        "GCE_METADATA_ROOT": worker.metadata.host,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu.endpoint,
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_CONFIG": f"{scratch_dir(host)}/gcloud-vm",
    }


def _ssh_environment(host: loopback.FleetHost) -> Path:
    return host.home / ".ssh" / "environment"


def set_vm_image(host: loopback.FleetHost, env: dict[str, str] | None) -> None:
    """``~/.ssh/environment`` (the fleet's sshd permits these names): written, or removed."""
    path = _ssh_environment(host)
    if env is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(mode=0o700, exist_ok=True)
    shutil.chown(path.parent, host.user, host.user)
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    shutil.chown(path, host.user, host.user)


def _launcher(  # type: ignore[no-untyped-def]
    fleet: loopback.Fleet, gcs: FakeGcs, tpu: list[TpuApi], dead: str, secrets: SecretManager
):
    def launch(worker: Worker, qr: QueuedResource) -> None:
        host = fleet.hosts[worker.host]
        if tpu[0].vm_image:
            set_vm_image(host, vm_session_env(host, tpu[0], worker))
        storage = dead if qr.name in tpu[0].broken_storage else gcs.endpoint
        scratch = str(scratch_dir(host))
        env = gcloud_env(f"{scratch}/gcloud", tpu[0].endpoint, storage, secrets.endpoint)
        env.pop("CLOUDSDK_CONFIG")
        env["GCE_METADATA_HOST"] = worker.metadata.host
        run_ssh(
            str(fleet.ssh_config),
            host.alias,
            ssh_launch_command(env | _vm_gcloud(), scratch, _vm_path()),
            qr.startup_script,
        )

    return launch


_VM_PATH = "/usr/local/bin:/usr/bin:/bin"  # ssh_launch_command's: a systemd unit's


def _vm_gcloud() -> dict[str, str]:
    """A VM's way to the session's gcloud zygote (tests/gcloud_zygote.py), where it has one."""
    vm_dir = os.environ.get(gcloud_zygote.VM_DIR_ENV)
    return {gcloud_zygote.SOCKET_ENV: str(gcloud_zygote.vm_path(Path(vm_dir))[1])} if vm_dir else {}


def _vm_path() -> str:
    """The VM's PATH: the zygote's shim first, where the session has one."""
    vm_dir = os.environ.get(gcloud_zygote.VM_DIR_ENV)
    return f"{gcloud_zygote.vm_path(Path(vm_dir))[0]}:{_VM_PATH}" if vm_dir else _VM_PATH


@pytest.fixture(scope="session")
def cloud_plane(ssh_fleet: loopback.Fleet) -> Iterator[Cloud]:
    """Started once per session; every test gets it clean through ``cloud``."""
    with standin(ssh_fleet) as cloud:
        yield cloud


@contextlib.contextmanager
def standin(ssh_fleet: loopback.Fleet) -> Iterator[Cloud]:
    """Fake GCS with the test bucket, the TPU API stand-in, and the env that points gcloud at
    them (for the fixture and for benchmarks/job_times.py)."""
    tmp = Path(tempfile.mkdtemp(prefix="multihost-cloud-"))
    gcs = FakeGcs(tmp / "gcs")
    gcs.start()
    gcs.create_bucket(BUCKET)
    holder: list[TpuApi] = []
    dead = f"http://127.0.0.1:{free_port()}/storage/v1/"
    faults = Faults()
    secrets = SecretManager()
    proxy = FaultProxy(("127.0.0.1", gcs.port), faults)

    def stop_hosts(indices: list[int]) -> None:
        ssh_fleet.kill_user_processes(indices)
        for i in indices:
            set_vm_image(ssh_fleet.hosts[i], None)

    tpu = TpuApi(
        [h.index for h in ssh_fleet.hosts],
        _launcher(ssh_fleet, gcs, holder, dead, secrets),
        stop_hosts,
        faults=faults,
    )
    holder.append(tpu)
    guest = GuestAgent(ssh_fleet.dir / "guest_keys", lambda i: ssh_fleet.hosts[i].user)
    keys = ssh_fleet.dir / "hosts"
    tpu.host_key = lambda i: (keys / ssh_fleet.hosts[i].alias / "host_key.pub").read_text()
    tpu.guest_agent = guest
    (tmp / "gcloud").mkdir()
    env = dict(os.environ) | gcloud_env(
        str(tmp / "gcloud"), tpu.endpoint, gcs.endpoint, secrets.endpoint
    )
    env["MULTIHOST_LOG_DIR"] = str(tmp / "logs")
    # --wait's gcloud polls and first contact's tries every 0.5 s, not 5 s and 2 s: the
    # stand-in provisions in about a second and its guest agent installs a key after one
    env.setdefault("MULTIHOST_WAIT_POLL", "0.5")
    faulty = env | {"CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{proxy.url}/storage/v1/"}
    try:
        yield Cloud(gcs, tpu, ssh_fleet, env, secrets, faults, faulty, guest)
    finally:
        guest.forget()
        tpu.stop()
        proxy.stop()
        secrets.stop()
        gcs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        _delete_vm_disks(ssh_fleet)


def _delete_vm_disks(fleet: loopback.Fleet) -> None:
    """What deleting the VMs deletes: each host's scratch (``/tmp/multihost-cloud-USER``, where
    its startup script and gcloud config were) and a job's work dir (``/var/tmp/multihost-UID``,
    job_startup.sh's default), also when the fleet itself stays up."""
    for host in fleet.hosts:
        shutil.rmtree(scratch_dir(host), ignore_errors=True)
        with contextlib.suppress(KeyError):
            uid = pwd.getpwnam(host.user).pw_uid
            shutil.rmtree(f"/var/tmp/multihost-{uid}", ignore_errors=True)


@pytest.fixture
def cloud(cloud_plane: Cloud) -> Iterator[Cloud]:
    """The stand-in control plane, clean: no queued resource, no process left on the hosts, an
    empty bucket and no job record mirrored locally."""
    cloud_plane.tpu.reset()
    cloud_plane.secrets.reset()
    cloud_plane.gcs.clear(BUCKET)
    shutil.rmtree(Path(cloud_plane.env["MULTIHOST_LOG_DIR"]) / "jobs", ignore_errors=True)
    yield cloud_plane
    cloud_plane.tpu.reset()
    cloud_plane.guest.forget()
