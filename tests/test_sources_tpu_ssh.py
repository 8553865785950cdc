"""``--prefix`` end to end: a fake gcloud whose TPU workers are the loopback OpenSSH fleet."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests import fleet as loopback
from tests.clitools import REPO, cli, host_logs, manifest
from tests.gcloud_fixtures import make_nodes
from tests.helpers import free_port, wait_for

FAKE_GCLOUD_DIR = REPO / "tests" / "fake_gcloud"


pytestmark = pytest.mark.usefixtures("fresh_runs")


def _setup(ssh_fleet, tmp_path: Path, nodes: list[dict[str, Any]], known: Path | None = None):  # type: ignore[no-untyped-def]
    """ssh config for the fleet's addresses, the nodes file, and the env that uses them."""
    lines = []
    for h in ssh_fleet.hosts:
        lines += [
            f"Host {h.address}",
            f"  User {h.user}",
            f"  Port {h.port}",
            f"  IdentityFile {ssh_fleet.key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {known or ssh_fleet.known_hosts}",
        ]
    config = tmp_path / "ssh_config"
    config.write_text("\n".join(lines) + "\n")
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps(nodes))
    env = {
        "PATH": f"{FAKE_GCLOUD_DIR}:{os.environ['PATH']}",
        "FAKE_GCLOUD_NODES": str(nodes_file),
        "FAKE_GCLOUD_LOG": str(tmp_path / "gcloud.log"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    return config, env


def _run_args(config: Path, tmp_path: Path, run: str, cmd: str) -> list[str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "x.txt").write_text("x\n")
    # --no-add-key: the fake gcloud only lists (first contact: test_sources_tpukeys_ssh)
    return [
        "run",
        "--prefix",
        "myqr",
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--run-name",
        run,
        "--no-add-key",
        "--cmd",
        cmd,
    ]


ENV_CMD = (
    'echo "$JAX_PROCESS_ID $JAX_PROCESS_COUNT $JAX_COORDINATOR_ADDRESS '
    "${MEGASCALE_COORDINATOR_ADDRESS:-none} ${MEGASCALE_PORT:-none} "
    '${MEGASCALE_NUM_SLICES:-none} ${MEGASCALE_SLICE_ID:-none} $MULTIHOST_TEST_HOST"'
)


def test_multislice_env_over_ssh(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes = make_nodes("myqr", 2, 2, "v4-16", internal_ips=[f"127.0.0.{k}" for k in (2, 3, 4, 5)])
    nodes += make_nodes("myqr-old", None, 1, "v4-8", internal_ips=["127.0.0.9"])
    config, env = _setup(ssh_fleet, tmp_path, nodes)
    res = cli([*_run_args(config, tmp_path, "ms", ENV_CMD), "--host-keys", "strict"], **env)
    assert res.returncode == 0, res.stderr
    logs = host_logs(tmp_path / "logs", "ms")
    expected = {
        "slice_0000_worker_0000": "0 4 127.0.0.2:8476 127.0.0.2:8081 8081 2 0 h0\n",
        "slice_0000_worker_0001": "1 4 127.0.0.2:8476 127.0.0.2:8081 8081 2 0 h1\n",
        "slice_0001_worker_0000": "2 4 127.0.0.2:8476 127.0.0.2:8081 8081 2 1 h2\n",
        "slice_0001_worker_0001": "3 4 127.0.0.2:8476 127.0.0.2:8081 8081 2 1 h3\n",
    }
    assert logs == expected
    calls = [json.loads(x) for x in (tmp_path / "gcloud.log").read_text().splitlines()]
    assert len(calls) == 1
    assert calls[0][:5] == ["compute", "tpus", "tpu-vm", "list", "--format=json"]


def test_external_ip_keeps_internal_coordinator(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Connect via the external address; workers are still told each other's internal ones."""
    internal = ["10.130.0.2", "10.130.0.3", "10.130.0.4", "10.130.0.5"]  # never contacted
    external = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    nodes = make_nodes("myqr", 2, 2, "v4-16", internal_ips=internal, external_ips=external)
    config, env = _setup(ssh_fleet, tmp_path, nodes)
    args = [
        *_run_args(config, tmp_path, "ext", ENV_CMD),
        "--ip",
        "external",
        "--megascale-port",
        "9999",
    ]
    res = cli(args, **env)
    assert res.returncode == 0, res.stderr
    logs = host_logs(tmp_path / "logs", "ext")
    assert logs["slice_0001_worker_0001"] == "3 4 10.130.0.2:8476 10.130.0.2:9999 9999 2 1 h3\n"
    hosts = manifest(tmp_path / "logs", "ext")["hosts"]
    assert [h["host"]["address"] for h in hosts] == external
    assert [h["host"]["internal_address"] for h in hosts] == internal


def test_single_slice_has_no_megascale(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes = make_nodes("myqr", None, 2, "v4-16", internal_ips=["127.0.0.2", "127.0.0.3"])
    config, env = _setup(ssh_fleet, tmp_path, nodes)
    res = cli([*_run_args(config, tmp_path, "one", ENV_CMD), "--host-keys", "strict"], **env)
    assert res.returncode == 0, res.stderr
    logs = host_logs(tmp_path / "logs", "one")
    assert logs["slice_0000_worker_0001"] == "1 2 127.0.0.2:8476 none none none none h1\n"


def test_prefix_trusts_on_first_use_then_forget(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty_known_hosts"
    nodes = make_nodes("myqr", 2, 2, "v4-16", internal_ips=[f"127.0.0.{k}" for k in (2, 3, 4, 5)])
    config, env = _setup(ssh_fleet, tmp_path, nodes, known=empty)
    res = cli(_run_args(config, tmp_path, "t1", "true"), **env)
    assert res.returncode == 0, res.stderr
    trust = tmp_path / "state" / "multihost" / "known_hosts"
    assert sorted(line.split()[0] for line in trust.read_text().splitlines()) == [
        f"[127.0.0.{k}]:{loopback.PORT}" for k in (2, 3, 4, 5)
    ]
    strict = cli([*_run_args(config, tmp_path, "t2", "true"), "--host-keys", "strict"], **env)
    assert strict.returncode == 1
    # a changed key for a recorded address is refused, with the way out in the message
    wrong = " ".join((ssh_fleet.dir / "wrong_key.pub").read_text().split()[:2])
    trust.write_text(
        trust.read_text().replace(trust.read_text().splitlines()[0].split(" ", 1)[1], wrong, 1)
    )
    changed = cli(_run_args(config, tmp_path, "t3", "true"), **env)
    assert changed.returncode == 1
    assert "multihost forget" in changed.stderr
    forgot = cli(["forget", "--prefix", "myqr"], **env)
    assert forgot.returncode == 0, forgot.stderr
    assert "forgot 4 key(s)" in forgot.stdout
    assert trust.read_text() == ""
    again = cli(_run_args(config, tmp_path, "t4", "true"), **env)
    assert again.returncode == 0, again.stderr


def test_hosts_table_json_and_check(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes = make_nodes("myqr", 2, 2, "v4-16", internal_ips=[f"127.0.0.{k}" for k in (2, 3, 4, 5)])
    config, env = _setup(ssh_fleet, tmp_path, nodes)
    res = cli(["hosts", "--prefix", "myqr", "--json"], **env)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [(r["slice"], r["worker"], r["process"]) for r in rows] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 3),
    ]
    assert rows[2]["accelerator_type"] == "v4-16"
    assert rows[2]["state"] == "READY"
    table = cli(["hosts", "--prefix", "myqr"], **env)
    assert "127.0.0.4" in table.stdout
    port = free_port()
    check = [
        "hosts",
        "--prefix",
        "myqr",
        "--check",
        "--json",
        "--ssh-config",
        str(config),
        "--host-keys",
        "strict",
        "--coordinator-port",
        str(port),
        "--no-add-key",
    ]
    checked = cli(check, **env)
    assert checked.returncode == 0, checked.stderr
    facts = json.loads(checked.stdout)
    assert all(f["python"].count(".") == 2 for f in facts)
    assert facts[0]["coordinator_port"] == "free"
    assert "coordinator_port" not in facts[1]
    assert all(f["disk_free"].endswith("GiB") for f in facts)
    with socket.create_server(("127.0.0.2", port)):  # someone listening on host 0
        busy = json.loads(cli(check, **env).stdout)
    assert busy[0]["coordinator_port"].startswith("in use")


def test_gcloud_failures_exit_2(tmp_path: Path) -> None:
    nodes_file = tmp_path / "n.json"
    nodes_file.write_text("[]")
    env = {"PATH": f"{FAKE_GCLOUD_DIR}:{os.environ['PATH']}", "FAKE_GCLOUD_NODES": str(nodes_file)}
    res = cli(["run", "--prefix", "myqr", "--cmd", "true"], FAKE_GCLOUD_ERROR="auth", **env)
    assert res.returncode == 2
    assert "active account" in res.stderr
    assert "gcloud compute tpus tpu-vm list" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = cli(["hosts", "--prefix", "myqr"], **env)
    assert res.returncode == 2
    assert "myqr" in res.stderr
    res = cli(["hosts", "--prefix", "myqr"], MULTIHOST_GCLOUD=str(tmp_path / "no-gcloud"))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def _start_holder(ssh_fleet, i: int, device: Path) -> int:  # type: ignore[no-untyped-def]
    """A process of host i's user holding the fake device open; returns its pid."""
    out = subprocess.run(
        [
            "ssh",
            "-F",
            str(ssh_fleet.ssh_config),
            ssh_fleet.hosts[i].alias,
            f"setsid sleep 300 < {device} > /dev/null 2>&1 & echo $!",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout
    return int(out.strip())


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_kill_stale_holders(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    device = Path(f"/tmp/mh-fake-accel-{time.time_ns()}")
    device.write_text("")
    device.chmod(0o666)
    nodes = make_nodes("myqr", None, 2, "v4-16", internal_ips=["127.0.0.2", "127.0.0.3"])
    config, env = _setup(ssh_fleet, tmp_path, nodes)
    env["MULTIHOST_DEVICE_GLOB"] = str(device)
    pid = _start_holder(ssh_fleet, 1, device)
    try:
        wait_for(lambda: _alive(pid), 10, "the fake holder")
        warned = cli([*_run_args(config, tmp_path, "w", "true"), "--host-keys", "strict"], **env)
        assert warned.returncode == 0, warned.stderr
        assert f"s0/w1: pid {pid} (sleep)" in warned.stderr
        assert "--kill-stale" in warned.stderr
        assert _alive(pid)
        killed = cli(
            [*_run_args(config, tmp_path, "k", "true"), "--host-keys", "strict", "--kill-stale"],
            **env,
        )
        assert killed.returncode == 0, killed.stderr
        assert f"pid {pid}" in killed.stderr
        wait_for(lambda: not _alive(pid), 10, "the holder to be stopped")
        pid2 = _start_holder(ssh_fleet, 0, device)
        wait_for(lambda: _alive(pid2), 10, "the second fake holder")
        res = cli(
            [
                "kill-stale",
                "--prefix",
                "myqr",
                "--ssh-config",
                str(config),
                "--host-keys",
                "strict",
            ],
            **env,
        )
        assert res.returncode == 0, res.stderr
        assert f"s0/w0 (127.0.0.2): pid {pid2} (sleep)" in res.stdout
        wait_for(lambda: not _alive(pid2), 10, "the holder to be stopped")
    finally:
        subprocess.run(["pkill", "-u", ssh_fleet.hosts[0].user, "sleep"], check=False)
        subprocess.run(["pkill", "-u", ssh_fleet.hosts[1].user, "sleep"], check=False)
        device.unlink()
