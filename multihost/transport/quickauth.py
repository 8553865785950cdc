"""Public-key auth in one round trip after the key exchange, where asyncssh's client takes
four: it waits for the server to accept the ``ssh-userauth`` service before asking anything,
asks with method ``none`` to learn the methods, offers the key unsigned, and signs only once
the server said it would take it.

The protocol allows all of it at once. The server reads packets in order, so a
USERAUTH_REQUEST sent right behind the SERVICE_REQUEST is read after the service is accepted;
and a request may carry its signature without an offer first (RFC 4252; OpenSSH's ``ssh``
does so for a key file without its ``.pub``). So here the first request leaves with the
service request, as soon as the server's extension info (its ``server-sig-algs``, which an
RSA key's signature needs) is in, which OpenSSH sends behind its NEWKEYS: it is the signed
public-key request when asyncssh would try public keys first, and the key costs only CPU to
sign (a key file: an agent's, a token's, or one still to be decrypted is offered unsigned
first, as asyncssh does, so nothing asks for a touch or a confirmation the server would not
use). Without extension info, auth starts when the service is accepted, as asyncssh's does.

Nothing is weakened: the host key was checked before any of this, the server decides as
always, and a refused first try hands over to asyncssh's own course with the methods the
server names, which ends a refused key with the same words.

It reaches into asyncssh's client (its auth state, two packet handlers of one connection, a
subclass of its public-key auth), so it is armed only where that code is the code that was
read: the source of every asyncssh function it copies or relies on (``UPSTREAM``) is hashed
once per process and must be one of ``VERIFIED``'s. Another asyncssh, a name gone, or any
error while it is built or armed disarms it, said once on the ``multihost.transport`` logger
(``--verbose``); every connection then goes asyncssh's own course: more round trips, the same
result. Nothing of asyncssh is touched when this module is imported. Off switch:
``MULTIHOST_QUICK_AUTH=0``, or the setting ``quick-auth = false`` (``--no-quick-auth``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import linecache
import logging
import os
from collections.abc import Callable
from types import CodeType
from typing import Any

log = logging.getLogger("multihost.transport")

ENV = "MULTIHOST_QUICK_AUTH"  # 0, no, false or off: asyncssh's own course, whatever the settings

# asyncssh's code that this copies or relies on, as MODULE:QUALNAME, and why.
UPSTREAM: tuple[str, ...] = (
    # armed from the client's connection_made, which runs before anything is sent
    "asyncssh.connection:SSHConnection.connection_made",
    # the extension info and the service request go out behind NEWKEYS
    "asyncssh.connection:SSHConnection.send_newkeys",
    "asyncssh.connection:SSHConnection.send_service_request",
    # an auth request sent before the service is accepted goes out at once, signed over the
    # session id
    "asyncssh.connection:SSHConnection.send_packet",
    "asyncssh.connection:SSHConnection.send_userauth_packet",
    "asyncssh.connection:SSHConnection.send_userauth_request",
    # packets reach the connection's own handlers, and auth replies its auth object
    "asyncssh.connection:SSHConnection._recv_packet",
    "asyncssh.packet:SSHPacketHandler.process_packet",
    # the two handlers replaced: extension info run first, the service accept's checks copied
    "asyncssh.connection:SSHConnection._process_ext_info",
    "asyncssh.connection:SSHConnection._process_service_accept",
    # after the first request: asyncssh's own course
    "asyncssh.connection:SSHConnection._process_userauth_failure",
    "asyncssh.connection:SSHConnection._process_userauth_success",
    "asyncssh.connection:SSHClientConnection.try_next_auth",
    "asyncssh.connection:SSHClientConnection.public_key_auth_requested",
    # the auth state read and set, where it is made
    "asyncssh.connection:SSHConnection.__init__",
    "asyncssh.connection:SSHClientConnection.__init__",
    "asyncssh.connection:SSHClientConnection._connection_made",
    # when asyncssh passes over GSS and host-based auth (what _keys_first follows)
    "asyncssh.connection:SSHClientConnection.gss_kex_auth_requested",
    "asyncssh.connection:SSHClientConnection.gss_mic_auth_requested",
    "asyncssh.connection:SSHClientConnection.host_based_auth_requested",
    "asyncssh.auth:_ClientGSSKexAuth._start",
    "asyncssh.auth:_ClientGSSMICAuth._start",
    "asyncssh.auth:_ClientHostBasedAuth._start",
    # the public-key auth subclassed (its _start copied)
    "asyncssh.auth:Auth.__init__",
    "asyncssh.auth:ClientAuth.__init__",
    "asyncssh.auth:ClientAuth.send_request",
    "asyncssh.auth:_ClientPublicKeyAuth._start",
    "asyncssh.auth:_ClientPublicKeyAuth._send_signed_request",
    "asyncssh.auth:_ClientPublicKeyAuth._process_public_key_ok",
    # what makes a key one that costs only CPU to sign (_sign_unasked)
    "asyncssh.public_key:SSHKeyPair.__init__",
    "asyncssh.public_key:SSHLocalKeyPair.__init__",
    "asyncssh.public_key:SSHLocalKeyPair.sign",
)

# The asyncssh releases whose UPSTREAM code was read against this module, and its digest
# (``digest()``) in each. Another release whose code has one of these digests is armed too:
# its code is the code read.
VERIFIED: dict[str, str] = {
    "2.24.0": "be858e7ec2b7bce1564593911cec7174752c52a57abedde42b7af1ce9e54ef91",
    "2.24.1": "40bf56e04a7d4839613e73526a5a755075950dc0422e7bbd845a4b55e643dc0a",
}

_USERAUTH = b"ssh-userauth"
_PUBLICKEY = b"publickey"
_NONE = b"none"
# asyncssh's client state read or set here (instance attributes: set in its __init__)
_STATE = (
    "_auth",
    "_auth_methods",
    "_auth_complete",
    "_auth_in_progress",
    "_next_service",
    "_recv_encryption",
    "_preferred_auth",
    "_public_key_auth",
    "_host_based_auth",
    "_client_host_keys",
    "_gss",
    "_owner",
    "_username",
)
Armer = Callable[[Any], None]


class Disarmed(Exception):
    """Why the fast path is not armed in this process."""


def arm(conn: Any, wanted: bool = True) -> bool:
    """Makes ``conn`` (an ``asyncssh.SSHClientConnection``, from its client's
    ``connection_made``, before anything was sent) start its auth early; False, and ``conn``
    untouched, where the fast path is off (``wanted``: the setting) or disarmed. Never
    raises: whatever goes wrong leaves the connection to asyncssh's own course."""
    if not wanted or os.environ.get(ENV, "").strip().lower() in ("0", "no", "false", "off"):
        why = f"{ENV}={os.environ[ENV]}" if wanted else "quick-auth is false"
        _say(f"ssh auth: asyncssh's own course (the fast path is off: {why})")
        return False
    armer = _armer()
    if armer is None:
        return False
    try:
        armer(conn)
    except Exception as exc:  # anything at all: this process goes asyncssh's way from now on
        _disarm(f"arming a connection failed ({type(exc).__name__}: {exc})")
        return False
    _say(f"ssh auth: the fast path, public-key auth in one round trip ({_built_for()})")
    return True


def state() -> str:
    """The fast path in this process, in words: armed (for which asyncssh) or why not."""
    armer = _armer()
    return f"armed ({_built_for()})" if armer is not None else f"disarmed: {_DISARMED[0]}"


def digest() -> str:
    """sha256 of the installed asyncssh's UPSTREAM code: each name and its source lines, in
    order. Raises what finding a name or its source raises (a name gone, no source file)."""
    h = hashlib.sha256()
    for name in UPSTREAM:
        module, _, qualname = name.partition(":")
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        h.update(f"{name}\n{_source(found.__code__)}\n".encode())
    return h.hexdigest()


def _source(code: CodeType) -> str:
    """A function's source lines, from its ``def`` to its last line of code: what
    ``inspect.getsource`` gives without tokenizing (that cost ~60 ms of a run's start)."""
    lines = linecache.getlines(code.co_filename)
    last = _last_line(code)
    if not lines or last > len(lines):
        raise Disarmed(f"no source for {code.co_qualname} in {code.co_filename}")
    return "".join(lines[code.co_firstlineno - 1 : last])


def _last_line(code: CodeType) -> int:
    """The last line of ``code``, its nested functions' included."""
    lines = [line for _, _, line in code.co_lines() if line is not None]
    nested = [_last_line(c) for c in code.co_consts if isinstance(c, CodeType)]
    return max([code.co_firstlineno, *lines, *nested])


_SAID: set[str] = set()
_DISARMED: list[str] = []  # why, once disarmed


def _say(text: str) -> None:
    """``text`` on the transport's logger, once per process."""
    if text not in _SAID:
        _SAID.add(text)
        log.info("%s", text)


def _disarm(why: str) -> None:
    if not _DISARMED:
        _DISARMED.append(why)
    _say(f"ssh auth: asyncssh's own course (the fast path is disarmed: {_DISARMED[0]})")


def _armer() -> Armer | None:
    """What arms one connection, built once per process; None once disarmed."""
    if _DISARMED:
        return None
    try:
        return _built()
    except Exception as exc:  # a mismatch (Disarmed) or anything unforeseen
        _disarm(str(exc) if isinstance(exc, Disarmed) else f"{type(exc).__name__}: {exc}")
        return None


def _built_for() -> str:
    import asyncssh

    version = str(getattr(asyncssh, "__version__", "?"))
    same = [v for v, d in VERIFIED.items() if d == _digest()]
    if version in same:
        return f"asyncssh {version}, its code verified"
    return f"asyncssh {version}, its code verified as {same[-1]}'s"


@functools.cache
def _digest() -> str:
    return digest()


@functools.cache
def _built() -> Armer:
    """Checks that the installed asyncssh is one read, then builds the fast path on it."""
    import asyncssh
    from asyncssh import auth, connection
    from asyncssh.constants import MSG_EXT_INFO, MSG_SERVICE_ACCEPT
    from asyncssh.misc import ProtocolError, ServiceNotAvailable
    from asyncssh.packet import Boolean, SSHPacket, String
    from asyncssh.public_key import SSHLocalKeyPair

    version = getattr(asyncssh, "__version__", "?")
    if _digest() not in VERIFIED.values():
        raise Disarmed(
            f"asyncssh {version}'s code that it copies or relies on is not the code verified "
            f"(asyncssh {', '.join(VERIFIED)})"
        )
    stock = asyncssh.SSHClientConnection._packet_handlers
    if (
        stock.get(MSG_EXT_INFO) is not connection.SSHConnection._process_ext_info
        or stock.get(MSG_SERVICE_ACCEPT) is not connection.SSHConnection._process_service_accept
    ):
        raise Disarmed(f"asyncssh {version}'s client does not handle the packets it hashed")

    def sign_unasked(keypair: object) -> bool:
        """A key whose signature costs only CPU: read from a file and decrypted already, no
        token to touch (an agent's or a PKCS#11 key is offered first)."""
        return (
            isinstance(keypair, SSHLocalKeyPair)
            and not keypair.use_executor
            and not keypair.use_webauthn
            and not keypair.algorithm.startswith(b"sk-")
        )

    class SignedFirst(auth._ClientPublicKeyAuth):
        """asyncssh's public-key auth, its first key's request signed at once when that
        costs nothing but CPU."""

        async def _start(self) -> None:
            self._keypair = await self._conn.public_key_auth_requested()
            if self._keypair is None:
                self._conn.try_next_auth(next_method=True)
            elif sign_unasked(self._keypair):
                await self._send_signed_request()
            else:  # offered first, as asyncssh does (the server's PK_OK asks for the signature)
                self.logger.debug1("Trying public key auth with %s key", self._keypair.algorithm)
                await self.send_request(
                    Boolean(False),
                    String(self._keypair.algorithm),
                    String(self._keypair.public_data),
                )

    class Early:
        """One connection's auth, started as soon as the request can carry all it needs."""

        def __init__(self) -> None:
            self.started = False

        def ext_info(self, conn: Any, pkttype: int, pktid: int, packet: SSHPacket) -> None:
            """The server's extension info (asyncssh's handling), then the auth if the
            service request is out and the server's answer to it not yet in."""
            stock[MSG_EXT_INFO](conn, pkttype, pktid, packet)
            if not self.started and conn._next_service == _USERAUTH and not conn._auth_complete:
                self.start(conn)

        def service_accept(self, conn: Any, _pkttype: int, _pktid: int, packet: SSHPacket) -> None:
            """asyncssh's checks and bookkeeping of the accept (its
            ``_process_service_accept``, a client's part); the auth starts here only if it has
            not already."""
            service = packet.get_string()
            packet.check_end()
            if not conn._recv_encryption:
                raise ProtocolError("Service accept received before kex complete")
            if service != conn._next_service:
                raise ServiceNotAvailable("Unexpected service in service accept")
            conn._next_service = None
            if service == _USERAUTH:
                conn._auth_in_progress = True
                if not self.started:
                    self.start(conn)

        def start(self, conn: Any) -> None:
            self.started = True
            conn.logger.info("Beginning auth for user %s", conn._username)
            conn._owner.begin_auth(conn._username)
            if not _keys_first(conn):
                conn.try_next_auth()  # asyncssh's own course: "none" first
                return
            conn._auth_methods = [_PUBLICKEY, _NONE]  # no key after all: asyncssh's course
            conn._auth = SignedFirst(conn, _PUBLICKEY)

    def arm_one(conn: Any) -> None:
        missing = [name for name in _STATE if not hasattr(conn, name)]
        if missing:
            raise Disarmed(f"asyncssh {version}'s client has no {', '.join(missing)}")
        early = Early()
        conn._packet_handlers = {  # this connection's own: the class's stay as they are
            **stock,
            MSG_EXT_INFO: early.ext_info,
            MSG_SERVICE_ACCEPT: early.service_accept,
        }

    return arm_one


def _keys_first(conn: Any) -> bool:
    """Whether asyncssh would try public keys before anything else it can do (told that the
    server takes them): no GSS, no host-based keys, public keys preferred over passwords."""
    prefs = list(conn._preferred_auth)
    if not conn._public_key_auth or _PUBLICKEY not in prefs:
        return False
    for method in prefs[: prefs.index(_PUBLICKEY)]:
        if method.startswith(b"gssapi-") and conn._gss is None:
            continue
        if method == b"hostbased" and not (conn._host_based_auth and conn._client_host_keys):
            continue
        return False
    return True
