"""Workers with internal addresses only, reached through IAP with the REAL gcloud.

The workers live in a VPC of their own (``tests/cloud/vpc.py``: a network namespace whose
sshds listen on internal addresses that this machine's namespace, the runner's, cannot
reach); the only way in is ``gcloud alpha compute start-iap-tunnel`` (the real CLI, through
``tests/cloud/gcloud_iap``) to the relay in ``tests/cloud/iap.py``, which reaches into the
VPC. One tunnel per slice: the slice's other workers are hopped to from its first worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests.clitools import cli, host_logs, manifest, no_processes, wait_for
from tests.cloud import vpc as vpcs
from tests.cloud.fixture import ZONE, Cloud
from tests.cloud.iap import WRAPPER, IapRelay
from tests.helpers import free_port
from tests.test_sources_queued_ssh import run_args, ssh_config

NETDELAY = Path(__file__).resolve().parent.parent / "benchmarks" / "netdelay.py"

pytestmark = pytest.mark.usefixtures("fresh_runs")


@pytest.fixture(scope="session")
def vpc(ssh_fleet: loopback.Fleet) -> Iterator[vpcs.Vpc]:
    reason = vpcs.usable()
    if reason is not None:
        pytest.skip(reason)
    with vpcs.vpc(ssh_fleet) as v:
        yield v


@pytest.fixture
def relay(cloud: Cloud, vpc: vpcs.Vpc) -> Iterator[IapRelay]:
    def resolve(instance: str) -> str | None:
        worker = cloud.tpu.worker_by_instance(instance)
        return None if worker is None else vpcs.address(worker.host)

    cloud.tpu.internal_address = vpcs.address
    vpc.connects.clear()
    r = IapRelay(resolve, vpc.connect)
    yield r
    r.stop()
    for h in cloud.fleet.hosts:  # a test that stopped a worker's sshd
        if not vpc.running(h.index):
            vpc.start_host(h.index)


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


def internal_config(cloud: Cloud, tmp_path: Path, n: int) -> Path:
    """Host blocks for the first ``n`` workers' internal addresses (sshd on port 22 there)."""
    path = ssh_config(cloud.fleet, tmp_path, {i: vpcs.address(i) for i in range(n)})
    path.write_text(path.read_text().replace(f"Port {loopback.PORT}\n", "Port 22\n"))
    return path


def test_one_tunnel_per_slice(cloud: Cloud, relay: IapRelay, tmp_path: Path) -> None:
    """2 slices x 4 workers: 2 tunnels; every other worker through its slice's first, its host
    key pinned end to end; connecting straight to an internal address fails."""
    cloud.tpu.add("myqr", "v4-32", 2, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = internal_config(cloud, tmp_path, 8)
    env = iap_env(cloud, relay, tmp_path)
    direct = cli(run_args(config, tmp_path, "direct"), **env)
    assert direct.returncode == 1
    assert f"cannot connect to {vpcs.address(0)}" in direct.stderr
    assert "--tunnel-through-iap" in direct.stderr
    res = cli(run_args(config, tmp_path, "iap", "--tunnel-through-iap"), **env)
    assert res.returncode == 0, res.stderr
    assert "NumPy" not in res.stderr  # each tunnel's own warnings stay out of the terminal
    assert host_logs(tmp_path / "logs", "iap") == {
        f"slice_{i // 4:04d}_worker_{i % 4:04d}": f"hi from h{i}\n" for i in range(8)
    }
    assert sorted(relay.tunnels) == [("t1v-n-myqr-w-0-0", 22), ("t1v-n-myqr-w-1-0", 22)]
    assert sorted(relay.tunnels) == sorted(set(relay.tunnels))  # one each, for the whole run
    wait_for(
        lambda: not tunnels_left(relay) and relay.open == 0, timeout=10, what="every tunnel closed"
    )
    assert no_processes(cloud.fleet, 8)


def test_each_address_with_its_own_user_and_the_key_added(
    cloud: Cloud, relay: IapRelay, tmp_path: Path
) -> None:
    """An ssh config with a User per worker address (one Unix user per host, each sshd
    admitting only its own) and first contact's key added as gcloud does it: a slice's hop is
    its first worker logged in as that worker's user, never as the user of the host behind it,
    so every worker runs; one tunnel per slice (the hop is the first worker's own connection,
    its own steps included). ``--workers`` without the first workers: the hops are still
    reached as themselves, their keys added and pinned."""
    cloud.tpu.add("myqr", "v4-32", 2, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = internal_config(cloud, tmp_path, 8)
    home = tmp_path / "home"
    home.mkdir()
    env = iap_env(cloud, relay, tmp_path) | {
        "HOME": str(home),
        "CLOUDSDK_CORE_ACCOUNT": "me@example.com",
    }

    def run(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        args = run_args(config, tmp_path, name, "--tunnel-through-iap", *extra)
        return cli([a for a in args if a != "--no-add-key"], **env)

    res = run("users")
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "users") == {
        f"slice_{i // 4:04d}_worker_{i % 4:04d}": f"hi from h{i}\n" for i in range(8)
    }
    users = [cloud.fleet.hosts[i].user for i in range(8)]
    hosts = [h["host"] for h in manifest(tmp_path / "logs", "users")["hosts"]]
    assert [h["user"] for h in hosts] == users
    hop_users = [h["jump"] and h["jump"]["user"] for h in hosts]
    assert hop_users == [None, *[users[0]] * 3, None, *[users[4]] * 3]
    wait_for(lambda: not tunnels_left(relay), timeout=10, what="every tunnel closed")
    # the key in place: no wait for it, so a tunnel per slice for the whole run
    for name, workers, ran in (
        ("again", "all", range(8)),
        ("rest", "s0/w1-3,s1/w1-3", (1, 2, 3, 5, 6, 7)),
    ):
        relay.tunnels.clear()
        res = run(name, "--workers", workers)
        assert res.returncode == 0, res.stderr
        assert sorted(host_logs(tmp_path / "logs", name).values()) == [
            f"hi from h{i}\n" for i in ran
        ]
        assert sorted(relay.tunnels) == [("t1v-n-myqr-w-0-0", 22), ("t1v-n-myqr-w-1-0", 22)]
        wait_for(
            lambda: not tunnels_left(relay) and relay.open == 0,
            timeout=10,
            what="every tunnel closed",
        )
    assert no_processes(cloud.fleet, 8)


def test_wrong_host_key_behind_a_hop_is_refused(
    cloud: Cloud, relay: IapRelay, tmp_path: Path
) -> None:
    cloud.tpu.add("myqr", "v4-32", 1, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    cloud.tpu.wrong_host_keys.add(2)
    res = cli(
        run_args(internal_config(cloud, tmp_path, 4), tmp_path, "bad", "--tunnel-through-iap"),
        **iap_env(cloud, relay, tmp_path),
    )
    assert res.returncode == 1
    assert "s0/w2" in res.stderr
    assert "host key differs from the one its TPU node publishes" in res.stderr
    assert [h["state"] for h in manifest(tmp_path / "logs", "bad")["hosts"]] == ["error"] * 4
    assert relay.tunnels == [("t1v-n-myqr-w-0-0", 22)]
    assert no_processes(cloud.fleet, 4)


def test_lost_hop_fails_its_slice_with_that_cause(
    cloud: Cloud, vpc: vpcs.Vpc, relay: IapRelay, tmp_path: Path
) -> None:
    """Slice 1's first worker gone: before the run, its slice's workers fail naming it; in the
    middle of one, they are lost naming it, and ``kill`` finds everything once it is back."""
    cloud.tpu.add("myqr", "v4-32", 2, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = internal_config(cloud, tmp_path, 8)
    env = iap_env(cloud, relay, tmp_path)
    logs = tmp_path / "logs"
    vpc.stop_host(4)
    res = cli(run_args(config, tmp_path, "gone", "--tunnel-through-iap"), **env)
    assert res.returncode == 1
    hosts = manifest(logs, "gone")["hosts"]
    assert [h["state"] for h in hosts] == ["error"] * 8
    assert "through its proxy command" in hosts[4]["error"]
    hop = f"through its hop s1/w0 ({vpcs.address(4)})"
    for h in hosts[5:]:
        assert hop in h["error"], h["error"]
    assert no_processes(cloud.fleet, 8)
    vpc.start_host(4)
    args = [
        a if a != "echo hi from $MULTIHOST_TEST_HOST" else "echo up; sleep 120"
        for a in run_args(
            config, tmp_path, "mid", "--tunnel-through-iap", "--reconnect-timeout", "3"
        )
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "multihost", *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env | {"COLUMNS": "200"},
    )
    try:
        wait_for(
            lambda: (
                len(host_logs(logs, "mid")) == 8
                and all("up" in t for t in host_logs(logs, "mid").values())
            ),
            timeout=90,
            what="every worker to start",
        )
        vpc.stop_host(4)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    hosts = manifest(logs, "mid")["hosts"]
    assert [h["state"] for h in hosts[4:]] == ["lost"] * 4, err
    for h in hosts[5:]:
        assert "s1/w0" in h["error"], h["error"]
    vpc.start_host(4)
    cli(["kill", "mid", "--log-dir", str(logs), "--grace", "2"], **env)
    wait_for(lambda: no_processes(cloud.fleet, 8), 15, "every host's processes to be gone")
    wait_for(lambda: not tunnels_left(relay), timeout=10, what="every tunnel closed")


def test_iap_per_host_gives_every_worker_its_tunnel(
    cloud: Cloud, relay: IapRelay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud.tpu.add("myqr", "v4-32", 1, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = internal_config(cloud, tmp_path, 4)
    env = iap_env(cloud, relay, tmp_path)
    res = cli(run_args(config, tmp_path, "each", "--tunnel-through-iap", "--iap-per-host"), **env)
    assert res.returncode == 0, res.stderr
    assert sorted(relay.tunnels) == [(f"t1v-n-myqr-w-0-{w}", 22) for w in range(4)]
    wait_for(
        lambda: not tunnels_left(relay) and relay.open == 0, timeout=10, what="every tunnel closed"
    )
    # a worker the relay does not know: the tunnel's own error comes back, named
    monkeypatch.setattr(cloud.tpu, "worker_by_instance", lambda instance: None)
    gone = cli(run_args(config, tmp_path, "gone", "--tunnel-through-iap", "--iap-per-host"), **env)
    assert gone.returncode == 1
    assert f"cannot connect to {vpcs.address(0)} through its proxy command" in gone.stderr
    assert "ERROR:" in gone.stderr
    assert "Unknown child process" not in gone.stderr


def tunnel(instance: str) -> str:
    return (
        f"{WRAPPER} alpha compute start-iap-tunnel {instance} %p --listen-on-stdin "
        f"--project=p --zone={ZONE} --verbosity=warning"
    )


def vpc_known_hosts(cloud: Cloud, tmp_path: Path) -> Path:
    known = tmp_path / "known_hosts"
    keys = cloud.fleet.dir / "hosts"
    known.write_text(
        "".join(
            f"{vpcs.address(h.index)} {(keys / h.alias / 'host_key.pub').read_text().strip()}\n"
            for h in cloud.fleet.hosts
        )
    )
    return known


def test_ssh_config_proxy_command_is_honoured(
    cloud: Cloud, relay: IapRelay, tmp_path: Path
) -> None:
    """Any host: a ProxyCommand in the user's ssh config (here the same IAP tunnel)."""
    cloud.tpu.add("myqr", "v4-8", 1, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    h = cloud.fleet.hosts[0]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host tpu0\n  HostName {vpcs.address(0)}\n  User {h.user}\n"
        f"  IdentityFile {cloud.fleet.key}\n  IdentitiesOnly yes\n"
        f"  ProxyCommand {tunnel('t1v-n-myqr-w-0-0')}\n"
    )
    code = tmp_path / "code"
    code.mkdir()
    res = cli(
        [
            "run",
            "--hosts",
            "tpu0",
            "--ssh-config",
            str(config),
            "--host-keys",
            "accept-new",
            "--script-dir",
            str(code),
            "--log-dir",
            str(tmp_path / "logs"),
            "--run-name",
            "pc",
            "--cmd",
            "echo hi from $MULTIHOST_TEST_HOST",
        ],
        **iap_env(cloud, relay, tmp_path),
    )
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "pc") == {"slice_0000_worker_0000": "hi from h0\n"}
    assert relay.tunnels == [("t1v-n-myqr-w-0-0", 22)]
    wait_for(lambda: not tunnels_left(relay), timeout=10, what="the tunnel closed")


def test_proxy_jump_bastion_is_one_connection(
    cloud: Cloud, relay: IapRelay, tmp_path: Path
) -> None:
    """``ProxyJump bastion`` for many hosts: one connection to the bastion (here itself behind
    IAP: one tunnel), every host behind it checked against known_hosts end to end."""
    cloud.tpu.add("myqr", "v4-32", 1, internal_only=True)
    cloud.tpu.wait_state("myqr", "ACTIVE")
    known = vpc_known_hosts(cloud, tmp_path)
    lines = [
        f"Host bastion\n  HostName {vpcs.address(0)}\n  User {cloud.fleet.hosts[0].user}\n"
        f"  ProxyCommand {tunnel('t1v-n-myqr-w-0-0')}\n"
    ]
    lines += [
        f"Host w{i}\n  HostName {vpcs.address(i)}\n  User {cloud.fleet.hosts[i].user}\n"
        "  ProxyJump bastion\n"
        for i in (1, 2, 3)
    ]
    lines.append(
        f"Host *\n  IdentityFile {cloud.fleet.key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text("".join(lines))
    code = tmp_path / "code"
    code.mkdir()

    def run(name: str, hosts: str) -> subprocess.CompletedProcess[str]:
        return cli(
            [
                "run",
                "--hosts",
                hosts,
                "--ssh-config",
                str(config),
                "--script-dir",
                str(code),
                "--log-dir",
                str(tmp_path / "logs"),
                "--run-name",
                name,
                "--cmd",
                "echo hi from $MULTIHOST_TEST_HOST",
            ],
            **iap_env(cloud, relay, tmp_path),
        )

    res = run("pj", "w1,w2,w3")
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "pj") == {
        f"slice_0000_worker_{i:04d}": f"hi from h{i + 1}\n" for i in range(3)
    }
    assert relay.tunnels == [("t1v-n-myqr-w-0-0", 22)]
    # a wrong key behind the bastion is refused, the others run
    known.write_text(known.read_text().replace(vpcs.address(2) + " ", vpcs.address(5) + " "))
    bad = run("pj2", "w1,w2,w3")
    assert bad.returncode == 1
    assert "s0/w1" in bad.stderr
    assert "host key not verified" in bad.stderr
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
        return cli(
            [
                "run",
                "--hosts",
                "behind",
                "--ssh-config",
                str(config),
                "--script-dir",
                str(code),
                "--log-dir",
                str(tmp_path / "logs"),
                "--run-name",
                name,
                "--cmd",
                "echo hi from $MULTIHOST_TEST_HOST",
            ]
        )

    res = run(h0.alias, "pj")
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "pj") == {"slice_0000_worker_0000": "hi from h1\n"}
    broken = run("nowhere", "pj2")
    assert broken.returncode == 1
    assert "behind" in broken.stderr


@contextmanager
def relay_to(address: str, port: int, out: Path) -> Iterator[int]:
    """A TCP relay (benchmarks/netdelay.py, no delay) on a port of its own to ``address:port``;
    yields that port. ``out``: the connections it carried, written when it stops."""
    listen = free_port()
    argv = [sys.executable, str(NETDELAY), "--delay-ms", "0", "--out", str(out)]
    argv.append(f"127.0.0.1:{listen}={address}:{port}")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            yield listen
        finally:
            proc.terminate()


def test_a_proxy_jump_host_is_reached_with_its_own_settings(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """OpenSSH's rule: a ProxyJump host is reached with its own Host block (its HostName, Port,
    User, IdentityFile, known hosts), whatever names the destination's user and port: its own
    block, ``--user``, or an inventory's ``user@host:port`` (``ssh -l`` and ``-p`` do not reach
    the jump host either). Here the jump host admits only its own user, on a port of its own (a
    relay), with a key that the host behind it does not need; the host behind takes a key that
    the jump host refuses."""
    h0, h1 = ssh_fleet.hosts[0], ssh_fleet.hosts[1]
    own = tmp_path / "own_key"  # taken by h1's user only
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", own], check=True)
    admitted = ssh_fleet.dir / "guest_keys" / h1.user
    before = admitted.read_text() if admitted.exists() else None
    admitted.parent.mkdir(exist_ok=True)
    admitted.write_text((before or "") + Path(f"{own}.pub").read_text())
    code = tmp_path / "code"
    code.mkdir()
    links = tmp_path / "links.json"
    try:
        with relay_to(h0.address, h0.port, links) as port:
            host_key = (ssh_fleet.dir / "hosts" / h0.alias / "host_key.pub").read_text()
            jump_known = tmp_path / "jump_known_hosts"
            jump_known.write_text(f"[127.0.0.1]:{port} {' '.join(host_key.split()[:2])}\n")
            config = tmp_path / "ssh_config"
            config.write_text(
                f"Host jump\n  HostName 127.0.0.1\n  Port {port}\n  User {h0.user}\n"
                f"  IdentityFile {ssh_fleet.key}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {jump_known}\n\n"
                f"Host behind\n  HostName {h1.address}\n  Port {h1.port}\n  User {h1.user}\n"
                f"  IdentityFile {own}\n  IdentitiesOnly yes\n  ProxyJump jump\n"
                f"  UserKnownHostsFile {ssh_fleet.known_hosts}\n\n"
                "Host *\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
            )
            for name, hosts, extra in (
                ("own", "behind", ()),
                ("user", "behind", ("--user", h1.user)),
                ("inventory", f"{h1.user}@behind:{h1.port}", ()),
            ):
                res = cli(
                    [
                        "run",
                        "--hosts",
                        hosts,
                        *extra,
                        "--ssh-config",
                        str(config),
                        "--script-dir",
                        str(code),
                        "--log-dir",
                        str(tmp_path / "logs"),
                        "--run-name",
                        name,
                        "--cmd",
                        "echo hi from $MULTIHOST_TEST_HOST as $(id -un)",
                    ],
                    SSH_AUTH_SOCK="",
                )
                assert res.returncode == 0, f"{name}: {res.stderr}"
                assert host_logs(tmp_path / "logs", name) == {
                    "slice_0000_worker_0000": f"hi from h1 as {h1.user}\n"
                }
    finally:
        if before is None:
            admitted.unlink()
        else:
            admitted.write_text(before)
    assert len(json.loads(links.read_text())) == 3  # one jump connection per run, by the relay
