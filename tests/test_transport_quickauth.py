"""Public-key auth in one round trip (transport.quickauth), on real sshds: counted through
benchmarks/netdelay.py's relay, a connect takes 4 round trips (TCP, version, key exchange,
auth) where asyncssh's own course takes 7 (an agent's key, offered before it is signed: 5); a
refused key, an RSA key and a server that takes no keys at all end as they do with asyncssh's
course, in the same words, without hanging. Armed only where the installed asyncssh's code is
the code verified; off (the setting, the environment) or disarmed (another asyncssh), a
connection goes asyncssh's own course, and ``--verbose`` says which, once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import asyncssh
import pytest

from benchmarks.netdelay import round_trips
from multihost.errors import ConnectError
from multihost.model import Host
from multihost.sources.inventory import parse_host_list
from multihost.transport import SSHOptions, quickauth, verbose
from multihost.transport.ssh import connect_ssh
from tests import fleet as loopback
from tests.clitools import REPO, cli, fleet_run_args, host_logs
from tests.helpers import free_port, wait_for

DELAY = 0.05  # s each way: a turn the relay can tell from traffic already on its way
NETDELAY = Path(__file__).resolve().parent.parent / "benchmarks" / "netdelay.py"
ADDRESS = "127.0.0.1"  # the relay's and the private sshds' (the fleet's use 127.0.0.2...)


def _stock(reach: tuple[SSHOptions, int]) -> tuple[SSHOptions, int]:
    """The same, with the fast path off (``--no-quick-auth``)."""
    return replace(reach[0], quick_auth=False), reach[1]


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


def _armed() -> None:
    """Skips a test of the fast path's round trips where it is disarmed (an asyncssh whose
    code was not verified: test_armed_where_the_code_is_the_code_verified says which)."""
    if not quickauth.state().startswith("armed"):
        pytest.skip(f"the fast path is {quickauth.state()}")


def _host0(fleet: loopback.Fleet) -> tuple[str, int]:
    return fleet.hosts[0].address, fleet.hosts[0].port


def _near() -> Host:
    return parse_host_list("near").hosts[0]


def test_armed_where_the_code_is_the_code_verified() -> None:
    """The installed asyncssh's code that the fast path copies or relies on, hashed: a release
    in VERIFIED must have its recorded digest (CI installs those: .ci/constraints.txt) and is
    armed; any other is armed only with the code of one of them, else disarmed, saying why,
    never an error. A new asyncssh: read its code (quickauth.UPSTREAM), record its digest, then
    widen the constraint."""
    version = asyncssh.__version__
    if version in quickauth.VERIFIED:
        assert quickauth.digest() == quickauth.VERIFIED[version]
    if quickauth.digest() in quickauth.VERIFIED.values():
        assert quickauth.state().startswith("armed (asyncssh"), quickauth.state()
    else:
        assert "is not the code verified" in quickauth.state()


def test_ci_installs_the_releases_verified() -> None:
    """CI's constraint on asyncssh (``pip install -c .ci/constraints.txt``, as the README's
    test install) allows the releases whose code was verified and nothing newer."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    lines = (REPO / ".ci" / "constraints.txt").read_text().splitlines()
    (line,) = [x for x in lines if x.startswith("asyncssh")]
    allowed = Requirement(line).specifier
    assert all(v in allowed for v in quickauth.VERIFIED)
    newest = Version(max(quickauth.VERIFIED, key=Version))
    assert f"{newest.major}.{newest.minor}.{newest.micro + 1}" not in allowed
    assert f"{newest.major}.{newest.minor + 1}.0" not in allowed
    assert "-c .ci/constraints.txt" in (REPO / ".ci" / "run").read_text()
    assert "-c .ci/constraints.txt" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(("quick", "trips"), [(True, 4), (False, 7)])
def test_connect_round_trips(
    ssh_fleet: loopback.Fleet, tmp_path: Path, quick: bool, trips: int
) -> None:
    if quick:
        _armed()
    reach = _options(ssh_fleet, tmp_path, ssh_fleet.key)
    error, took = _connect(_host0(ssh_fleet), reach if quick else _stock(reach))
    assert error is None
    assert took == trips


def test_a_refused_key_fails_in_the_same_words(ssh_fleet: loopback.Fleet, tmp_path: Path) -> None:
    """A key the host does not take (another key of ours): the same error either way."""
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
    reach = _options(ssh_fleet, tmp_path, other)
    quick, _ = _connect(_host0(ssh_fleet), reach)
    stock, _ = _connect(_host0(ssh_fleet), _stock(reach))
    assert quick == stock
    assert quick is not None
    assert quick.startswith("authentication failed: Permission denied for user"), quick


def test_an_rsa_key_signs_what_the_server_takes(ssh_fleet: loopback.Fleet, tmp_path: Path) -> None:
    """An RSA key's signature is chosen from the server's server-sig-algs, known by the time
    the request goes out (still with the service request): without them asyncssh signs with
    SHA-1 (``ssh-rsa``), which OpenSSH refuses since 8.8."""
    _armed()
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
    ssh_fleet: loopback.Fleet, tmp_path: Path
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
        stock, _ = _connect((ADDRESS, port), _stock(reach))
    assert quick == stock
    assert quick is not None
    assert quick.startswith("authentication failed: Permission denied for user"), quick


def test_an_agent_key_is_offered_before_it_is_signed(
    ssh_fleet: loopback.Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key held by an agent is offered first (nothing is signed that the server would not
    take: a confirmation or a touch could be asked for it), in the service request's flight:
    one round trip more than a key file, two fewer than asyncssh's course."""
    _armed()
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


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's fast path as if never used (nothing said, not built, not disarmed);
    afterwards forgotten again, and ``--verbose``'s handler gone."""
    monkeypatch.setattr(quickauth, "_SAID", set())
    monkeypatch.setattr(quickauth, "_DISARMED", [])
    quickauth._built.cache_clear()
    quickauth._digest.cache_clear()
    log = logging.getLogger("multihost.transport")
    handlers, level = list(log.handlers), log.level
    yield
    quickauth._built.cache_clear()
    quickauth._digest.cache_clear()
    log.handlers[:], log.level = handlers, level


def _changed(self: object, _pkttype: int, _pktid: int, packet: object) -> None:
    """asyncssh's service-accept handler as a new release might have it (a fix): other code."""
    raise AssertionError("never called: the class's handler table keeps the function it had")


def test_another_asyncssh_disarms_it_said_once_and_connects(
    ssh_fleet: loopback.Fleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fresh: None,
) -> None:
    """asyncssh's code changed under the fast path (here its service-accept handler): it
    disarms itself, says so once with --verbose, and every connection goes asyncssh's own
    course (7 round trips), connected; no error, no second word."""
    monkeypatch.setattr(asyncssh.connection.SSHConnection, "_process_service_accept", _changed)
    verbose()
    reach = _options(ssh_fleet, tmp_path, ssh_fleet.key)
    for _ in range(2):
        error, took = _connect(_host0(ssh_fleet), reach)
        assert error is None
        assert took == 7
    said = [line for line in capsys.readouterr().err.splitlines() if "ssh auth" in line]
    assert said == [
        f"multihost: ssh auth: asyncssh's own course (the fast path is disarmed: asyncssh "
        f"{asyncssh.__version__}'s code that it copies or relies on is not the code verified "
        f"(asyncssh {', '.join(quickauth.VERIFIED)}))"
    ]
    assert quickauth.state().startswith("disarmed: asyncssh")


def test_an_error_while_arming_disarms_it_and_connects(
    ssh_fleet: loopback.Fleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fresh: None,
) -> None:
    """Whatever goes wrong while a connection is armed (here a state attribute gone) leaves it
    to asyncssh's course and disarms the rest of the process, said once."""
    _armed()
    monkeypatch.setattr(quickauth, "_STATE", (*quickauth._STATE, "_no_such_state"))
    verbose()
    reach = _options(ssh_fleet, tmp_path, ssh_fleet.key)
    for _ in range(2):
        error, took = _connect(_host0(ssh_fleet), reach)
        assert error is None
        assert took == 7
    said = [line for line in capsys.readouterr().err.splitlines() if "ssh auth" in line]
    assert len(said) == 1
    assert "the fast path is disarmed: arming a connection failed (Disarmed:" in said[0]
    assert "has no _no_such_state" in said[0]


@pytest.mark.usefixtures("fresh_runs")
def test_verbose_says_which_path_ran_once(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path
) -> None:
    """``run --verbose`` over 3 hosts: the path said once: the fast path; off by the setting or
    the environment; disarmed by an asyncssh whose code is not the code verified (a run whose
    VERIFIED table knows no release, as a newer asyncssh meets it). Every run succeeds."""
    logs = tmp_path / "logs"
    unknown = (
        "from multihost.transport import quickauth; quickauth.VERIFIED = {'9.9.9': '0' * 64}; "
        "from multihost.cli import main; main()"
    )
    armed = quickauth.state().startswith("armed")
    on = "the fast path, public-key auth in one round trip (asyncssh "
    for name, extra, env, runner, said in (
        ("on", (), {}, None, on if armed else "the fast path is disarmed: "),
        ("flag", ("--no-quick-auth",), {}, None, "the fast path is off: quick-auth is false"),
        ("env", (), {"MULTIHOST_QUICK_AUTH": "0"}, None, "off: MULTIHOST_QUICK_AUTH=0"),
        ("new", (), {}, unknown, "the fast path is disarmed: asyncssh "),
    ):
        args = fleet_run_args(ssh_fleet, code, logs, name, "echo hi", 3, "--verbose", *extra)
        if runner is None:
            res = cli(args, **env)
        else:
            res = subprocess.run(
                [sys.executable, "-c", runner, *args],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
            )
        assert res.returncode == 0, f"{name}: {res.stderr}"
        lines = [line for line in res.stderr.splitlines() if "ssh auth" in line]
        assert len(lines) == 1, f"{name}: {res.stderr}"
        assert said in lines[0], f"{name}: {lines[0]}"
        assert len(host_logs(logs, name)) == 3
    quiet = cli(fleet_run_args(ssh_fleet, code, logs, "quiet", "echo hi", 3))
    assert quiet.returncode == 0, quiet.stderr
    assert "ssh auth" not in quiet.stderr
