"""Hosts reached over SSH with asyncssh (its only user, with ``quickauth`` for the auth where
it is armed)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shlex
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import (
    ConnectError,
    ConnectTimeout,
    HostError,
    HostKeyError,
    HostLost,
    RemoteError,
)
from multihost.model import Host
from multihost.transport import hops, quickauth, sshconfig
from multihost.transport.base import (
    CHUNK,
    SHELL,
    Completed,
    Progress,
    SSHOptions,
    offered,
)
from multihost.transport.oqs import no_search_when_absent

with no_search_when_absent():  # its import would otherwise start 7 processes (transport.oqs)
    import asyncssh


class SSHConnection:
    """A host reached over SSH with asyncssh (its connection maybe shared: see ``hops``)."""

    def __init__(self, host: Host, lease: hops.Lease[asyncssh.SSHClientConnection]) -> None:
        self.host = host
        self._lease = lease
        self._conn = conn = lease.conn
        peer = conn.get_extra_info("peername")  # ('', 0) through a hop
        # where the socket cannot tell: the config's HostName for the host
        reached = conn.get_extra_info("multihost_reached") or ""
        self.peer_address: str = (peer[0] if peer else "") or reached or host.address
        self.bytes_out = 0
        self._sftp: asyncssh.SFTPClient | None = None  # opened on the first fetch

    @property
    def tunnel(self) -> asyncssh.SSHClientConnection:
        """The connection, for other hosts to be reached through (``tunnel=``)."""
        return self._conn

    def _lost(self, exc: BaseException) -> HostLost:
        return _lost(self.host, self._conn, exc)

    async def run(self, command: str, stdin: bytes | None = None) -> Completed:
        self.bytes_out += len(stdin or b"")
        try:
            res = await self._conn.run(command, input=stdin, encoding=None, check=False)
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc
        return Completed(res.exit_status, _as_bytes(res.stdout), _as_bytes(res.stderr))

    async def stream(self, command: str, stderr: bytearray | None = None) -> AsyncIterator[bytes]:
        try:
            proc = await self._conn.create_process(command, encoding=None, stdin=asyncssh.DEVNULL)
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc
        async for chunk in _output(self.host, self._conn, proc, stderr):
            yield chunk

    async def offer(
        self,
        command: str,
        want: bytes,
        data: bytes,
        progress: Progress | None = None,
        *,
        ahead: Sequence[tuple[bytes, bytes]] = (),
    ) -> tuple[Completed, bool]:
        said, written = b"", -1
        try:
            proc = await self._conn.create_process(command, encoding=None)
            # The host may stop reading early (tar: disk full): its exit status and stderr say
            # why, below, rather than a broken pipe here.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                said, written = await offered(proc.stdout, proc.stdin, want, data, progress, ahead)
                proc.stdin.write_eof()
            res = await proc.wait(check=False)
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc
        self.bytes_out += written if written >= 0 else -1 - written
        out = said + _as_bytes(res.stdout)
        return Completed(res.exit_status, out, _as_bytes(res.stderr)), written >= 0

    def hold_writes(self, held: bool) -> None:
        sock = self._conn.get_extra_info("socket")  # None through a tunnel or a proxy command
        cork = getattr(socket, "TCP_CORK", None)  # Linux's
        if sock is None or cork is None:
            return
        with contextlib.suppress(OSError):  # not TCP after all
            sock.setsockopt(socket.IPPROTO_TCP, cork, int(held))

    async def shell(self) -> SSHShell:
        try:
            proc = await self._conn.create_process(SHELL, encoding=None)
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc
        return SSHShell(self.host, self._conn, proc)

    async def fetch(self, path: str, write: Callable[[bytes], object]) -> int:
        size = 0
        with self._reading(path):
            if self._sftp is None:
                self._sftp = await self._conn.start_sftp_client()
            f = await self._sftp.open(path, "rb", encoding=None)
        try:
            while True:
                with self._reading(path):
                    chunk = _as_bytes(await f.read(CHUNK))
                if not chunk:
                    return size
                write(chunk)  # a local error here is the caller's, never "connection lost"
                size += len(chunk)
        finally:
            with contextlib.suppress(asyncssh.Error, OSError):
                await f.close()

    @contextlib.contextmanager
    def _reading(self, path: str) -> Iterator[None]:
        """SFTP errors as this host's: the file's own (RemoteError) or the connection's."""
        try:
            yield
        except asyncssh.SFTPError as exc:
            raise RemoteError(self.host, f"{path}: {exc.reason.lower()}") from None
        except (asyncssh.Error, OSError) as exc:
            raise self._lost(exc) from exc

    async def close(self) -> None:
        if self._sftp is not None:
            self._sftp.exit()
            self._sftp = None
        await self._lease.release()


class SSHShell:
    """``sh -s`` on a host, waiting for its script on stdin (see ``Shell``)."""

    def __init__(
        self,
        host: Host,
        conn: asyncssh.SSHClientConnection,
        proc: asyncssh.SSHClientProcess[bytes],
    ) -> None:
        self.host = host
        self._conn = conn
        self._proc = proc

    async def stream(
        self, script: str, stderr: bytearray | None = None, *, hold: bool = False
    ) -> AsyncIterator[bytes]:
        try:
            self._proc.stdin.write(script.encode())
            if not hold:
                self._proc.stdin.write_eof()
        except (asyncssh.Error, OSError) as exc:
            self._proc.close()
            raise _lost(self.host, self._conn, exc) from exc
        async for chunk in _output(self.host, self._conn, self._proc, stderr):
            yield chunk

    def send(self, data: bytes) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            self._proc.stdin.write(data)
            self._proc.stdin.write_eof()

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()

    async def close(self) -> None:
        self._proc.close()


def _lost(
    host: Host, conn: asyncssh.connection.SSHConnection, why: BaseException | None
) -> HostLost:
    """A connection's loss (``why``: the error, None: no exit status), naming the hop it went
    through when the hop went first."""
    text = "while streaming" if why is None else _describe(why)
    via, hop = conn.get_extra_info("multihost_hop") or ("", None)
    if hop is not None and hop.tunnel.is_closed():
        return HostLost(host, f"connection lost: {via} is lost ({text})")
    return HostLost(host, f"connection lost{' ' if why is None else ': '}{text}")


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    return str(data or "").encode()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
        return f"{os.strerror(exc.errno).lower()} ({exc.strerror or exc})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class _Client(asyncssh.SSHClient):
    """Starts each connection's auth with fewer round trips (``transport.quickauth``) unless
    ``quick`` is off."""

    def __init__(self, quick: bool) -> None:
        self._quick = quick

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        quickauth.arm(conn, self._quick)


class _TrustOnFirstUse(_Client):
    """Records an unknown host key; refuses a key that differs from one already recorded."""

    def __init__(self, files: Sequence[str], trust_file: Path, alias: str, quick: bool) -> None:
        super().__init__(quick)
        self._files = files
        self._trust_file = trust_file
        self._alias = alias  # the name the user gave (an ssh alias): forget finds it by that
        self.changed_in: str | None = None  # the file that holds a different key, if any
        self.names: tuple[str, ...] = ()  # the names that key may be recorded under

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        for name in (*self._files, str(self._trust_file)):
            try:
                known = asyncssh.read_known_hosts(name)
            except (OSError, ValueError):
                continue
            if known.match(host, addr, port)[0]:
                self.changed_in = name
                self.names = tuple(
                    dict.fromkeys(n if port == 22 else f"[{n}]:{port}" for n in (host, addr) if n)
                )
                return False
        self._trust_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Recorded under the name and the address, so that forgetting either finds it.
        names = dict.fromkeys(
            n if port == 22 else f"[{n}]:{port}" for n in (self._alias, host, addr) if n
        )
        line = f"{','.join(names)} {key.export_public_key().decode().strip()}\n"
        with self._trust_file.open("a") as f:
            f.write(line)
        return True


class _Pinned(_Client):
    """Refuses any key but the pinned ones (those are in ``known_hosts``), noting the key
    the host presented so that the refusal can show both fingerprints."""

    def __init__(self, quick: bool) -> None:
        super().__init__(quick)
        self.presented: str | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.presented = key.get_fingerprint()
        return False


def _fingerprints(keys: Sequence[str]) -> str:
    out = []
    for k in keys:
        try:
            out.append(asyncssh.import_public_key(k).get_fingerprint())
        except (asyncssh.KeyImportError, ValueError):
            continue
    return " or ".join(out) or "none readable"


# AES-GCM costs asyncssh far less CPU per packet than chacha20-poly1305 (its default first
# choice); the same set of ciphers, only the preference changes, and a configured Ciphers wins.
_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)


_DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

# Config keywords that connect_ssh applies itself, or that an option it always passes
# overrides (timeouts, keepalives, host-key checking): a host whose config says nothing else
# is reached without asyncssh parsing the config and loading its key once per connection.
_APPLIED = frozenset(
    {
        "host",
        "hostname",
        "port",
        "user",
        "identityfile",
        "identitiesonly",
        "userknownhostsfile",
        "globalknownhostsfile",
        "stricthostkeychecking",
        "batchmode",
        "connecttimeout",
        "loglevel",
        "serveraliveinterval",
        "serveralivecountmax",
    }
)


@functools.lru_cache(maxsize=64)
def _keypairs(path: str, mtime_ns: int) -> tuple[asyncssh.SSHKeyPair, ...] | None:
    """A private key (and its ``-cert.pub``) read once per run; None if it needs a passphrase
    or cannot be read (asyncssh then reads the config itself, and says why)."""
    del mtime_ns  # part of the cache key only
    try:
        return tuple(asyncssh.load_keypairs([path]))
    except (OSError, ValueError, asyncssh.KeyImportError):
        return None


def _direct(options: SSHOptions, host: Host, identity: str | None) -> dict[str, object] | None:
    """``asyncssh.connect`` arguments that stand for the whole config of ``host`` (with
    ``config=[]``), or None when asyncssh must read the config itself."""
    found = sshconfig.entries(options.config, host.address)
    if found is None or any(k not in _APPLIED for k, _ in found):
        return None
    first: dict[str, str] = {}
    for keyword, value in found:
        first.setdefault(keyword, value)
    if sum(k == "identityfile" for k, _ in found) > 1 or any(
        "%" in first.get(k, "") for k in ("hostname", "user", "port")
    ):
        return None
    if os.environ.get("SSH_AUTH_SOCK") and first.get("identitiesonly", "").lower() != "yes":
        return None  # agent keys come first in OpenSSH's order: leave that to asyncssh
    path = identity or (
        sshconfig.expand_path(first["identityfile"]) if "identityfile" in first else None
    )
    if not path or not first.get("port", "22").isdigit():
        return None
    try:
        keys = _keypairs(path, os.stat(path).st_mtime_ns)
    except OSError:
        return None
    if keys is None:
        return None
    out: dict[str, object] = {"config": [], "client_keys": list(keys)}
    out["port"] = host.port or int(first.get("port", "22"))
    if user := host.user or first.get("user"):
        out["username"] = user
    return out


@dataclass(frozen=True)
class _HostConfig:
    """What the ssh config says about one host that the connect decisions need."""

    known_hosts: list[str]  # files to trust, existing or not
    identity_configured: bool
    ciphers_configured: bool
    hostname: str  # what the alias stands for: HostName, else the alias itself
    jump: str | None = None  # ProxyJump, unless none


def _host_config(options: SSHOptions, host: Host, kwargs: dict[str, object]) -> _HostConfig:
    """Read cheaply from the (filtered) config text; asyncssh's own parse where that can't be."""
    found = sshconfig.settings(options.config, host.address)
    if found is not None:
        files = _known_files(found.get("userknownhostsfile"), found.get("globalknownhostsfile"))
        if files is not None:
            name = found.get("hostname", host.address).replace("%h", host.address)
            return _HostConfig(files, "identityfile" in found, "ciphers" in found, name)
    config = sshconfig.config_for(options.config, host.address)
    prepared = asyncssh.SSHClientConnectionOptions(host=host.address, **kwargs, config=config)
    configured = prepared.known_hosts
    if configured is None:  # UserKnownHostsFile none
        files = []
    elif isinstance(configured, list) and configured:
        files = [os.path.expanduser(str(f)) for f in configured]
    else:
        files = [os.path.expanduser(_DEFAULT_KNOWN_HOSTS)]
    jump = prepared.tunnel if isinstance(prepared.tunnel, str) else None
    return _HostConfig(
        files,
        prepared.config.get("IdentityFile") is not None,
        prepared.config.get("Ciphers") is not None,
        str(prepared.host or host.address),
        None if jump is None or jump.lower() == "none" else jump,
    )


def _known_files(user: str | None, system: str | None) -> list[str] | None:
    """The known-hosts files to read, as OpenSSH picks them: the user's (``~/.ssh/known_hosts``
    unless configured; ``none``: no file) and any global ones; None when a name uses tokens only
    asyncssh can expand (then the caller asks asyncssh)."""
    names = [_DEFAULT_KNOWN_HOSTS] if user is None else _split_files(user)
    names += [] if system is None else _split_files(system)
    out = [sshconfig.expand_path(n) for n in names]
    return None if None in out else [n for n in out if n is not None]


def _split_files(value: str) -> list[str]:
    return [] if value.lower() == "none" else list(_shlex_split(value))


@functools.lru_cache(maxsize=64)
def _shlex_split(value: str) -> tuple[str, ...]:
    return tuple(shlex.split(value))  # the same few values for every host of a run


@functools.lru_cache(maxsize=64)
def _read_known(files: tuple[str, ...], stamps: tuple[int, ...]) -> asyncssh.SSHKnownHosts:
    """Parsed once per run (per change of the files), not once per connection."""
    del stamps  # part of the cache key only
    return asyncssh.read_known_hosts(list(files)) if files else asyncssh.import_known_hosts("")


def _trusted(files: Sequence[str]) -> asyncssh.SSHKnownHosts:
    present = tuple(f for f in files if os.path.exists(f))
    return _read_known(present, tuple(os.stat(f).st_mtime_ns for f in present))


def _forget_advice(host: Host, tofu: _TrustOnFirstUse, options: SSHOptions) -> str:
    """A command that really drops the recorded key, wherever it was recorded."""
    file = str(tofu.changed_in)
    if Path(file) == options.trust_file:
        return f"forget it with: multihost forget --hosts {shlex.quote(host.target)}"
    return "remove it with: " + "; ".join(
        f"ssh-keygen -R {shlex.quote(n)} -f {shlex.quote(file)}" for n in tofu.names
    )


def login_name(host: Host, options: SSHOptions) -> str | None:
    """The user a connection to ``host`` logs in as: the host's own (``--user``, an
    inventory's), else the ssh config's ``User`` for it; None when neither names one (the local
    user then, as OpenSSH does)."""
    if host.user:
        return host.user
    found = sshconfig.settings(options.config, host.address)
    if found is not None and "%" not in found.get("user", ""):
        return found.get("user")
    config = sshconfig.config_for(options.config, host.address)
    prepared = asyncssh.SSHClientConnectionOptions(host=host.address, config=config)
    user = prepared.config.get("User")
    return str(user) if user else None


async def connect_ssh(
    host: Host, options: SSHOptions, through: tuple[Hashable, ...] = ()
) -> SSHConnection:
    """A connection to ``host``, verifying its host key per the policy: the one already open
    to the same place if there is one (a hop's own steps share the connection its hosts go
    through), else a new one."""
    try:
        key = _reach(host, options)
        if key in through:  # waiting for itself would never end
            raise ConnectError(
                host, "its ProxyJump chain comes back to itself (a loop in the ssh config)"
            )
        lease = await hops.pool().lease(key, lambda: _open(host, options, (*through, key)))
    except HostError as exc:
        if exc.host is host:
            raise
        raise type(exc)(host, exc.message) from None  # opened for another user of the key
    return SSHConnection(host, lease)


def _reach(host: Host, options: SSHOptions) -> Hashable:
    """What makes two hosts the same connection: where and as whom, not who they are in the
    job."""
    jump = None if host.jump is None else _reach(host.jump, options)
    return (host.address, host.user, host.port, host.identity, host.proxy_command, jump, options)


MAX_HOPS = 8  # a ProxyJump chain deeper than this is a loop in the ssh config


async def _open(
    host: Host, options: SSHOptions, through: tuple[Hashable, ...]
) -> tuple[asyncssh.SSHClientConnection, Callable[[], Awaitable[None]]]:
    """Opens one SSH connection (through its hop, if any); returns it and what lets go of the
    hop once it is closed."""
    kwargs: dict[str, object] = {
        "connect_timeout": options.connect_timeout,
        "keepalive_interval": options.keepalive_interval,
        "keepalive_count_max": options.keepalive_count_max,
    }
    if host.user:
        kwargs["username"] = host.user
    if host.port:
        kwargs["port"] = host.port
    if host.identity:
        kwargs["client_keys"] = [str(Path(host.identity).expanduser())]
    cfg = _host_config(options, host, kwargs)
    if not cfg.ciphers_configured:
        kwargs["encryption_algs"] = list(_CIPHERS)
    fallback = os.path.expanduser(options.fallback_identity or "")
    identity = str(Path(host.identity).expanduser()) if host.identity else None
    if fallback and os.path.isfile(fallback) and not (host.identity or cfg.identity_configured):
        kwargs["client_keys"] = [fallback]
        identity = fallback
    target = host.address
    if (direct := _direct(options, host, identity)) is not None:
        kwargs.update(direct)
        target = cfg.hostname
    else:  # asyncssh reads the config: only the blocks that can apply ([] means none)
        kwargs["config"] = sshconfig.config_for(options.config, host.address)
    hop: SSHConnection | None = None
    jump, via = host.jump, ""
    if jump is not None:
        via = f"its hop {jump.name} ({jump.target})"
    elif cfg.jump:
        jump = hops.jump_host(cfg.jump)
        via = f"its ProxyJump {jump.target}"
    proxy = None
    if jump is not None:  # a direct-tcpip channel of the hop's own connection, shared
        if len(through) > MAX_HOPS:
            raise ConnectError(host, f"more than {MAX_HOPS} ProxyJump hops: a loop in the config?")
        try:
            hop = await connect_ssh(jump, options, through)
        except HostError as exc:
            raise ConnectError(host, f"cannot connect through {via}: {exc.message}") from None
        kwargs["tunnel"] = hop.tunnel
    else:
        proxy = _proxy_argv(host, options, kwargs, cfg.hostname)
    if proxy is not None:  # e.g. an IAP tunnel: one local process per connection
        kwargs["proxy_command"] = proxy
    try:
        conn = await _handshake(host, options, kwargs, cfg, target, proxy is not None, via)
    except BaseException:
        if hop is not None:
            await hop.close()
        raise
    conn.set_extra_info(multihost_reached=cfg.hostname, multihost_hop=(via, hop))

    async def after() -> None:
        if hop is not None:
            await hop.close()

    return conn, after


async def _handshake(
    host: Host,
    options: SSHOptions,
    kwargs: dict[str, object],
    cfg: _HostConfig,
    target: str,
    proxied: bool,
    via: str,
) -> asyncssh.SSHClientConnection:
    default_file = os.path.expanduser(_DEFAULT_KNOWN_HOSTS)
    files = cfg.known_hosts
    tofu: _TrustOnFirstUse | None = None
    pinned = dict(options.pinned).get(host.address)
    pin: _Pinned | None = None
    quick = options.quick_auth
    if pinned:  # the keys the cloud publishes for this host, and no other
        pin = _Pinned(quick)
        kwargs["client_factory"] = lambda: pin
        keys = []
        for k in pinned:
            try:
                keys.append(asyncssh.import_public_key(k))
            except (asyncssh.KeyImportError, ValueError):
                continue
        kwargs["known_hosts"] = (keys, [], [])
    elif options.host_keys == "accept-new":
        tofu = _TrustOnFirstUse(
            [f for f in files if os.path.isfile(f)], options.trust_file, host.address, quick
        )
        kwargs["client_factory"] = lambda: tofu
        files = [*files, str(options.trust_file)]
    elif missing := [f for f in files if f != default_file and not os.path.exists(f)]:
        raise HostKeyError(
            host,
            f"host key not verified: known_hosts file {missing[0]} does not exist; create it, "
            "or use --host-keys accept-new to trust keys on first use",
        )
    else:
        kwargs["client_factory"] = lambda: _Client(quick)
    # Never None: to asyncssh that would mean "check nothing" (``UserKnownHostsFile none``).
    if pin is None:
        kwargs["known_hosts"] = _trusted(files)
    try:
        conn = await asyncssh.connect(target, **kwargs)
    except asyncssh.HostKeyNotVerifiable as exc:
        if pin is not None and pinned:
            raise HostKeyError(
                host,
                f"host key differs from the one its TPU node publishes (guest attributes "
                f"hostkeys/*): expected {_fingerprints(pinned)}, presented "
                f"{pin.presented or 'an unreadable key'}; refused",
            ) from None
        if tofu is not None and tofu.changed_in is not None:
            raise HostKeyError(
                host,
                f"host key CHANGED since it was recorded in {tofu.changed_in} ({exc}); "
                f"if the VM was re-created, {_forget_advice(host, tofu, options)}",
            ) from None
        raise HostKeyError(
            host,
            f"host key not verified ({exc}); add it to known_hosts, "
            "or use --host-keys accept-new to trust it on first use",
        ) from None
    except asyncssh.PermissionDenied as exc:
        raise ConnectError(host, f"authentication failed: {exc.reason}") from None
    except TimeoutError:
        raise ConnectTimeout(
            host, f"connect timed out after {options.connect_timeout:g} s" + _hint(host)
        ) from None
    except (asyncssh.Error, OSError) as exc:
        where = f"{host.address}:{host.port}" if host.port else host.address
        how = f" through {via}" if via else ""
        how += f" through its proxy command{_proxy_said(host)}" if proxied else ""
        raise ConnectError(
            host, f"cannot connect to {where}{how}: {_describe(exc)}" + _hint(host)
        ) from None
    return conn


def _hint(host: Host) -> str:
    return f"; {host.reach_hint}" if host.reach_hint else ""


_TOKEN = re.compile("%[hprn%]")  # what OpenSSH expands in a ProxyCommand, as _proxy_argv does


def _proxy_argv(
    host: Host, options: SSHOptions, kwargs: dict[str, object], hostname: str
) -> list[str] | None:
    """The command to reach ``host`` through, if any: the host's own (an IAP tunnel), else the
    ssh config's ProxyCommand; ``%h``, ``%p``, ``%r``, ``%n`` and ``%%`` expanded as OpenSSH
    expands them. None: connect directly (or the config is asyncssh's to read)."""
    found = sshconfig.settings(options.config, host.address) or {}
    configured = found.get("proxycommand", "none")
    if not host.proxy_command and configured.lower() == "none":
        return None
    port = kwargs.get("port") or host.port or found.get("port", "22")
    user = kwargs.get("username") or host.user or found.get("user", "")
    tokens = {"%h": hostname, "%p": str(port), "%r": str(user), "%n": host.address, "%%": "%"}

    def expand(text: str) -> str:
        return _TOKEN.sub(lambda m: tokens[m[0]], text)

    if host.proxy_command:
        argv = [expand(arg) for arg in host.proxy_command]
    else:
        argv = ["sh", "-c", "exec " + expand(configured)]  # OpenSSH: exec $SHELL -c "..."
    # Its stderr into a file of ours: asyncssh reads the command's stderr pipe as part of the
    # SSH stream (a warning after the banner would break it), and one warning per tunnel would
    # flood the terminal. What it says comes back in the error when the connection fails. The
    # pipe itself stays open (fd 3): asyncssh takes its end as the end of the connection.
    return ["sh", "-c", 'exec 3>&2; exec "$@" 2>"$0"', str(_proxy_log(host)), *argv]


def _reaped_twice(record: logging.LogRecord) -> bool:
    """asyncio's child watcher warns when a proxy command that exited at once (a tunnel that
    failed) was already reaped by the transport's close: its exit is ours to report, once."""
    return not str(record.msg).startswith("Unknown child process pid")


logging.getLogger("asyncio").addFilter(_reaped_twice)


def _proxy_log(host: Host) -> Path:
    return sshconfig.scratch() / f"proxy-{host.process_id}-{host.address}.err"


def _proxy_said(host: Host) -> str:
    """The last error line the host's proxy command wrote, if any."""
    try:
        lines = _proxy_log(host).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if line.strip().startswith("ERROR:")]
    return f" ({errors[-1][:300]})" if errors else ""


async def _output(
    host: Host,
    conn: asyncssh.SSHClientConnection,
    proc: asyncssh.SSHClientProcess[bytes],
    stderr: bytearray | None,
) -> AsyncIterator[bytes]:
    """A started process's stdout as it comes, then its stderr into ``stderr``; a lost
    connection (or no exit status) is HostLost; the process is closed however it ends."""
    try:
        while chunk := await proc.stdout.read(65536):
            yield chunk
        done = await proc.wait()
        if proc.exit_status is None:
            raise _lost(host, conn, None)
        if stderr is not None:
            stderr += _as_bytes(done.stderr)
    except (asyncssh.Error, OSError) as exc:
        raise _lost(host, conn, exc) from exc
    finally:
        proc.close()
