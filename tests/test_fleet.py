"""The loopback OpenSSH fleet itself: reachable, isolated, and able to fail on purpose."""

from __future__ import annotations

import subprocess
import time

import asyncssh
import pytest

from tests.fleet import Fleet
from tests.helpers import wait_for


def _ssh(fleet: Fleet, host: str, cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config), host, cmd],
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )


def test_every_host_is_its_own_user_and_home(ssh_fleet: Fleet) -> None:
    cmd = "echo $MULTIHOST_TEST_HOST $(id -un) $HOME $(pwd)"
    procs = [
        subprocess.Popen(
            ["ssh", "-F", str(ssh_fleet.ssh_config), h.alias, cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for h in ssh_fleet.hosts
    ]
    for h, p in zip(ssh_fleet.hosts, procs, strict=True):
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert out.split() == [h.alias, h.user, str(h.home), str(h.home)]


def test_dead_host_is_refused_fast(ssh_fleet: Fleet) -> None:
    t0 = time.monotonic()
    r = _ssh(ssh_fleet, "dead", "true")
    assert r.returncode == 255
    assert "Connection refused" in r.stderr
    assert time.monotonic() - t0 < 5


def test_badkey_fails_host_key_verification(ssh_fleet: Fleet) -> None:
    r = _ssh(ssh_fleet, "badkey", "true")
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


async def test_asyncssh_reads_the_ssh_config(ssh_fleet: Fleet) -> None:
    host = ssh_fleet.hosts[-1]
    config = [str(ssh_fleet.ssh_config)]
    async with asyncssh.connect(host.alias, config=config) as conn:
        r = await conn.run("echo $MULTIHOST_TEST_HOST; id -un", check=True)
        assert r.stdout == f"{host.alias}\n{host.user}\n"
        assert conn.get_extra_info("peername")[:2] == (host.address, host.port)
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await asyncssh.connect("badkey", config=config)


def test_stop_and_start_host_keeps_jobs(ssh_fleet: Fleet) -> None:
    i = 1 if len(ssh_fleet.hosts) > 1 else 0
    h = ssh_fleet.hosts[i]
    ssh_fleet.kill_user_processes([i])
    job = "setsid sleep 123 </dev/null >/dev/null 2>&1 & echo started"
    assert _ssh(ssh_fleet, h.alias, job).stdout == "started\n"
    session = subprocess.Popen(
        ["ssh", "-F", str(ssh_fleet.ssh_config), h.alias, "sleep 60"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(  # the session is up once its command runs on the host
            lambda: any("sleep 60" in cmd for _, cmd in ssh_fleet.user_processes(i)),
            10,
            "the ssh session's command",
        )
        ssh_fleet.stop_host(i)
        assert session.wait(timeout=10) == 255
        assert "Connection refused" in _ssh(ssh_fleet, h.alias, "true").stderr
        assert any("sleep 123" in cmd for _, cmd in ssh_fleet.user_processes(i))
    finally:
        session.kill()
        ssh_fleet.start_host(i)
    assert _ssh(ssh_fleet, h.alias, "echo $MULTIHOST_TEST_HOST").stdout == f"{h.alias}\n"
    ssh_fleet.kill_user_processes([i])
    assert ssh_fleet.user_processes(i) == []
