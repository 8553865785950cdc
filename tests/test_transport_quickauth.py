"""Public-key auth in one round trip (transport.quickauth), on real sshds: counted through
benchmarks/netdelay.py's relay, a connect takes 4 round trips (TCP, version, key exchange,
auth) where asyncssh's own course takes 7 (an agent's key, offered before it is signed: 5); a
refused key, an RSA key and a server that takes no keys at all end as they do with asyncssh's
course, in the same words, without hanging."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks.netdelay import round_trips
from multihost.errors import ConnectError
from multihost.model import Host
from multihost.sources.inventory import parse_host_list
from multihost.transport import SSHOptions, quickauth
from multihost.transport.ssh import connect_ssh
from tests import fleet as loopback
from tests.helpers import free_port, wait_for

DELAY = 0.05  # s each way: a turn the relay can tell from traffic already on its way
NETDELAY = Path(__file__).resolve().parent.parent / "benchmarks" / "netdelay.py"
ADDRESS = "127.0.0.1"  # the relay's and the private sshds' (the fleet's use 127.0.0.2...)


def _stock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quickauth, "SUPPORTED", False)


@contextmanager
def _sshd(fleet: loopback.Fleet, tmp_path: Path, **settings: str) -> Iterator[int]:
    """A private sshd for host 0's user, with host 0's key and config but ``settings``
    (keyword: value) changed; yields its port."""
    port = free_port()
    text = (loopback._host_dir(fleet.dir, 0) / "sshd_config").read_text()
    settings = {"ListenAddress": f"{ADDRESS}:{port}", "PidFile": str(tmp_path / "pid"), **settings}
    for keyword, value in settings.items():
        text, n = re.subn(rf"(?m)^{keyword} .*$", f"{keyword} {value}", text)
        text += "" if n else f"{keyword} {value}\n"
    (tmp_path / "sshd_config").write_text(text)
    log = tmp_path / "sshd.log"
    argv = [loopback.SSHD, "-D", "-f", str(tmp_path / "sshd_config"), "-E", str(log)]
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL) as proc:
        try:
            wait_for(lambda: log.exists() and "listening on" in log.read_text(errors="replace"))
            yield port
        finally:
            proc.terminate()


def _options(fleet: loopback.Fleet, tmp_path: Path, key: Path) -> tuple[SSHOptions, int]:
    """An ssh config naming a relay as host ``near`` (logging in with ``key``, host 0's host
    key known), and the relay's port."""
    port = free_port()
    host_key = (loopback._host_dir(fleet.dir, 0) / "host_key.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{ADDRESS}]:{port} {' '.join(host_key)}\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host near\n  HostName {ADDRESS}\n  Port {port}\n  User {fleet.hosts[0].user}\n"
        f"  UserKnownHostsFile {known}\n\n" + loopback._defaults_block(key)
    )
    return SSHOptions(config=(config,), connect_timeout=20), port


def _connect(target: tuple[str, int], reach: tuple[SSHOptions, int]) -> tuple[str | None, int]:
    """Connects to host ``near`` through its relay, to the sshd at ``target``: the error (None:
    connected) and the round trips the connection took."""
    options, relay = reach
    out = options.config[0].parent / "links.json"
    argv = [sys.executable, str(NETDELAY), "--delay-ms", str(DELAY * 1000), "--out", str(out)]
    argv.append(f"{ADDRESS}:{relay}={target[0]}:{target[1]}")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            error = asyncio.run(_connect_once(options))
        finally:
            proc.terminate()
    (link,) = json.loads(out.read_text())
    return error, round_trips(link["chunks"], DELAY)


async def _connect_once(options: SSHOptions) -> str | None:
    """The error connecting to host ``near`` (None: connected, and closed again)."""
    try:
        conn = await asyncio.wait_for(connect_ssh(_near(), options), 60)
    except ConnectError as exc:
        return exc.message
    await conn.close()
    return None


def _host0(fleet: loopback.Fleet) -> tuple[str, int]:
    return fleet.hosts[0].address, fleet.hosts[0].port


def _near() -> Host:
    return parse_host_list("near").hosts[0]


def test_armed_for_the_installed_asyncssh() -> None:
    """A new asyncssh falls back to its own (slower) course: read its client auth
    (connection.py, auth.py) and add its version to quickauth.READ."""
    assert quickauth.SUPPORTED, quickauth._version()


@pytest.mark.parametrize(("stock", "trips"), [(False, 4), (True, 7)])
def test_connect_round_trips(
    ssh_fleet: loopback.Fleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stock: bool,
    trips: int,
) -> None:
    if stock:
        _stock(monkeypatch)
    reach = _options(ssh_fleet, tmp_path, ssh_fleet.key)
    error, took = _connect(_host0(ssh_fleet), reach)
    assert error is None
    assert took == trips


def test_a_refused_key_fails_in_the_same_words(
    ssh_fleet: loopback.Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key the host does not take (another key of ours): the same error either way."""
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
    reach = _options(ssh_fleet, tmp_path, other)
    quick, _ = _connect(_host0(ssh_fleet), reach)
    _stock(monkeypatch)
    stock, _ = _connect(_host0(ssh_fleet), reach)
    assert quick == stock
    assert quick is not None
    assert quick.startswith("authentication failed: Permission denied for user"), quick


def test_an_rsa_key_signs_what_the_server_takes(ssh_fleet: loopback.Fleet, tmp_path: Path) -> None:
    """An RSA key's signature is chosen from the server's server-sig-algs, known by the time
    the request goes out (still with the service request): without them asyncssh signs with
    SHA-1 (``ssh-rsa``), which OpenSSH refuses since 8.8."""
    rsa = tmp_path / "rsa_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", rsa], check=True)
    readable = Path(tempfile.mkdtemp(prefix="quickauth-"))  # sshd reads it as the user
    try:
        readable.chmod(0o755)
        keys = readable / "authorized_keys"
        keys.write_text(Path(f"{rsa}.pub").read_text())
        keys.chmod(0o644)
        with _sshd(ssh_fleet, tmp_path, AuthorizedKeysFile=str(keys)) as port:
            error, took = _connect((ADDRESS, port), _options(ssh_fleet, tmp_path, rsa))
    finally:
        shutil.rmtree(readable)
    assert error is None
    assert took == 4


def test_a_server_without_key_auth_fails_alike_without_hanging(
    ssh_fleet: loopback.Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passwords only (not our case): refused at once, in asyncssh's words, both ways."""
    with _sshd(
        ssh_fleet,
        tmp_path,
        PubkeyAuthentication="no",
        PasswordAuthentication="yes",
        KbdInteractiveAuthentication="yes",
    ) as port:
        reach = _options(ssh_fleet, tmp_path, ssh_fleet.key)
        quick, _ = _connect((ADDRESS, port), reach)
        _stock(monkeypatch)
        stock, _ = _connect((ADDRESS, port), reach)
    assert quick == stock
    assert quick is not None
    assert quick.startswith("authentication failed: Permission denied for user"), quick


def test_an_agent_key_is_offered_before_it_is_signed(
    ssh_fleet: loopback.Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key held by an agent is offered first (nothing is signed that the server would not
    take: a confirmation or a touch could be asked for it), in the service request's flight:
    one round trip more than a key file, two fewer than asyncssh's course."""
    sock = tmp_path / "agent.sock"
    with subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL) as agent:
        try:
            wait_for(sock.exists, what="the agent's socket")
            env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
            subprocess.run(["ssh-add", "-q", str(ssh_fleet.key)], check=True, env=env)
            monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
            options, port = _options(ssh_fleet, tmp_path, ssh_fleet.key)
            config = options.config[0]  # the agent's key only: no key file, no IdentitiesOnly
            text = config.read_text().split("Host *")[0]
            config.write_text(text + "Host *\n  StrictHostKeyChecking yes\n  BatchMode yes\n")
            monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* beside the agent's
            error, took = _connect(_host0(ssh_fleet), (options, port))
        finally:
            agent.terminate()
    assert error is None
    assert took == 5
