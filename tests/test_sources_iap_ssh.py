"""Issue 26: workers with internal addresses only, reached through IAP with the REAL gcloud.

The stand-in gives the workers 127.1.0.x addresses where nothing listens; the only way in is
``gcloud alpha compute start-iap-tunnel`` (the real CLI, through ``tests/cloud/gcloud_iap``) to
the relay in ``tests/cloud/iap.py``, which knows the instance names' fleet hosts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clitools import cli, host_logs, wait_for
from tests.cloud.fixture import ZONE, Cloud
from tests.cloud.iap import WRAPPER, IapRelay
from tests.test_sources_queued_ssh import run_args, ssh_config

pytestmark = pytest.mark.usefixtures("fresh_runs")


@pytest.fixture
def relay(cloud: Cloud) -> Iterator[IapRelay]:
    def resolve(instance: str) -> str | None:
        worker = cloud.tpu.worker_by_instance(instance)
        return None if worker is None else cloud.fleet.hosts[worker.host].address

    r = IapRelay(resolve)
    yield r
    r.stop()


def iap_env(cloud: Cloud, relay: IapRelay, tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("test-token\n")
    return cloud.env | {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "MULTIHOST_GCLOUD": str(WRAPPER),
        "MULTIHOST_TEST_IAP_URL": relay.url,
        "MULTIHOST_TEST_IAP_TOKEN": str(token),
    }


def tunnels_left(relay: IapRelay) -> list[int]:
    """Local processes still running a tunnel to this relay."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"start-iap-tunnel" in cmd and relay.url.encode() in cmd:
                found.append(int(proc.name))
    return found


def test_internal_only_workers_through_iap(
    cloud: Cloud, relay: IapRelay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud.tpu.add("myqr", "v4-16", 1, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    internal = {i: f"127.1.0.{2 + i}" for i in (0, 1)}
    config = ssh_config(cloud.fleet, tmp_path, internal)
    env = iap_env(cloud, relay, tmp_path)
    direct = cli(run_args(config, tmp_path, "direct"), **env)
    assert direct.returncode == 1
    assert "cannot connect to 127.1.0.2" in direct.stderr
    assert "--tunnel-through-iap" in direct.stderr
    res = cli(run_args(config, tmp_path, "iap", "--tunnel-through-iap"), **env)
    assert res.returncode == 0, res.stderr
    assert "NumPy" not in res.stderr  # each tunnel's own warnings stay out of the terminal
    assert host_logs(tmp_path / "logs", "iap") == {
        "slice_0000_worker_0000": "hi from h0\n", "slice_0000_worker_0001": "hi from h1\n",
    }  # fmt: skip
    assert {t for t in relay.tunnels} == {("t1v-n-myqr-w-0-0", 2222), ("t1v-n-myqr-w-0-1", 2222)}
    wait_for(lambda: not tunnels_left(relay) and relay.open == 0, timeout=10,
             what="every tunnel closed")  # fmt: skip
    # a worker the relay does not know: the tunnel's own error comes back, named
    monkeypatch.setattr(cloud.tpu, "worker_by_instance", lambda instance: None)
    gone = cli(run_args(config, tmp_path, "gone", "--tunnel-through-iap"), **env)
    assert gone.returncode == 1
    assert "cannot connect to 127.1.0.2 through its proxy command" in gone.stderr
    assert "ERROR:" in gone.stderr
    assert "Unknown child process" not in gone.stderr


def test_ssh_config_proxy_command_is_honoured(
    cloud: Cloud, relay: IapRelay, tmp_path: Path
) -> None:
    """Any host: a ProxyCommand in the user's ssh config (here the same IAP tunnel)."""
    cloud.tpu.add("myqr", "v4-8", 1, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    h = cloud.fleet.hosts[0]
    tunnel = (f"{WRAPPER} alpha compute start-iap-tunnel t1v-n-myqr-w-0-0 %p --listen-on-stdin "
              f"--project=p --zone={ZONE} --verbosity=warning")  # fmt: skip
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host tpu0\n  HostName 127.1.0.2\n  User {h.user}\n  Port {h.port}\n"
        f"  IdentityFile {cloud.fleet.key}\n  IdentitiesOnly yes\n  ProxyCommand {tunnel}\n"
    )
    code = tmp_path / "code"
    code.mkdir()
    res = cli(["run", "--hosts", "tpu0", "--ssh-config", str(config), "--host-keys", "accept-new",
               "--script-dir", str(code), "--log-dir", str(tmp_path / "logs"), "--run-name", "pc",
               "--cmd", "echo hi from $MULTIHOST_TEST_HOST"],
              **iap_env(cloud, relay, tmp_path))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "pc") == {"slice_0000_worker_0000": "hi from h0\n"}
    assert relay.tunnels == [("t1v-n-myqr-w-0-0", 2222)]
    wait_for(lambda: not tunnels_left(relay), timeout=10, what="the tunnel closed")


def test_ssh_config_proxy_jump_is_honoured(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A host reached through another (``ProxyJump``): asyncssh's own tunnel; a jump host that
    cannot be reached fails the host, so the jump is really taken."""
    h0, h1 = ssh_fleet.hosts[0], ssh_fleet.hosts[1]
    code = tmp_path / "code"
    code.mkdir()

    def run(jump: str, name: str) -> subprocess.CompletedProcess[str]:
        config = tmp_path / f"ssh_config_{name}"
        config.write_text(
            f"Host behind\n  HostName {h1.address}\n  Port {h1.port}\n  User {h1.user}\n"
            f"  ProxyJump {jump}\n  UserKnownHostsFile {ssh_fleet.known_hosts}\n\n"
            "Host nowhere\n  HostName 127.1.0.9\n  Port 2222\n\n" + ssh_fleet.ssh_config.read_text()
        )
        return cli(["run", "--hosts", "behind", "--ssh-config", str(config), "--script-dir",
                    str(code), "--log-dir", str(tmp_path / "logs"), "--run-name", name,
                    "--cmd", "echo hi from $MULTIHOST_TEST_HOST"])  # fmt: skip

    res = run(h0.alias, "pj")
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "pj") == {"slice_0000_worker_0000": "hi from h1\n"}
    broken = run("nowhere", "pj2")
    assert broken.returncode == 1
    assert "behind" in broken.stderr
