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

This reaches into asyncssh's client (its auth state and two packet handlers of one
connection), so it is armed only for the asyncssh versions whose code was read (``READ``) and
only when everything it touches is there; otherwise a connection goes as asyncssh does it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from multihost.transport.oqs import no_search_when_absent

with no_search_when_absent():
    import asyncssh
    from asyncssh import auth as _auth
    from asyncssh.constants import MSG_EXT_INFO, MSG_SERVICE_ACCEPT
    from asyncssh.misc import ProtocolError, ServiceNotAvailable
    from asyncssh.packet import Boolean, SSHPacket, String
    from asyncssh.public_key import SSHLocalKeyPair

READ = ((2, 24),)  # the asyncssh versions (major, minor) whose client auth this follows
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
_Handler = Callable[[Any, int, int, SSHPacket], Any]


def _version() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in asyncssh.__version__.split(".")[:2])
    except ValueError:
        return ()


def _fits() -> bool:
    """Whether the installed asyncssh is one this was written against, with what it uses."""
    handlers = getattr(asyncssh.SSHClientConnection, "_packet_handlers", None)
    return (
        _version() in READ
        and isinstance(handlers, Mapping)
        and MSG_EXT_INFO in handlers
        and MSG_SERVICE_ACCEPT in handlers
        and callable(getattr(asyncssh.SSHClientConnection, "try_next_auth", None))
        and callable(getattr(_auth, "_ClientPublicKeyAuth", None))
        and callable(getattr(_auth._ClientPublicKeyAuth, "_send_signed_request", None))
    )


SUPPORTED = _fits()


def arm(conn: asyncssh.SSHClientConnection) -> bool:
    """Makes ``conn`` start its auth early (from its client's ``connection_made``, before
    anything was sent); False, and ``conn`` untouched, where this asyncssh is not one read."""
    if not SUPPORTED or not all(hasattr(conn, name) for name in _STATE):
        return False
    stock: Mapping[int, _Handler] = type(conn)._packet_handlers
    early = _Early(stock)
    conn._packet_handlers = {  # this connection's own: the class's stay as they are
        **stock,
        MSG_EXT_INFO: early.ext_info,
        MSG_SERVICE_ACCEPT: early.service_accept,
    }
    return True


class _Early:
    """One connection's auth, started as soon as the request can carry all it needs."""

    def __init__(self, stock: Mapping[int, _Handler]) -> None:
        self._stock = stock
        self.started = False

    def ext_info(self, conn: Any, pkttype: int, pktid: int, packet: SSHPacket) -> None:
        """The server's extension info (asyncssh's handling), then the auth if the service
        request is out and the server's answer to it not yet in."""
        self._stock[MSG_EXT_INFO](conn, pkttype, pktid, packet)
        if not self.started and conn._next_service == _USERAUTH and not conn._auth_complete:
            self._start(conn)

    def service_accept(self, conn: Any, _pkttype: int, _pktid: int, packet: SSHPacket) -> None:
        """asyncssh's checks and bookkeeping of the accept; the auth starts here only if it has
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
                self._start(conn)

    def _start(self, conn: Any) -> None:
        self.started = True
        conn.logger.info("Beginning auth for user %s", conn._username)
        conn._owner.begin_auth(conn._username)
        if not _keys_first(conn):
            conn.try_next_auth()  # asyncssh's own course: "none" first
            return
        conn._auth_methods = [_PUBLICKEY, _NONE]  # no key after all: asyncssh's course
        conn._auth = _SignedFirst(conn, _PUBLICKEY)


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


def _sign_unasked(keypair: object) -> bool:
    """A key whose signature costs only CPU: read from a file and decrypted already, no token
    to touch (an agent's or a PKCS#11 key is offered first)."""
    return (
        isinstance(keypair, SSHLocalKeyPair)
        and not keypair.use_executor
        and not keypair.use_webauthn
        and not keypair.algorithm.startswith(b"sk-")
    )


class _SignedFirst(_auth._ClientPublicKeyAuth):
    """asyncssh's public-key auth, its first key's request signed at once when that costs
    nothing but CPU."""

    async def _start(self) -> None:
        self._keypair = await self._conn.public_key_auth_requested()
        if self._keypair is None:
            self._conn.try_next_auth(next_method=True)
        elif _sign_unasked(self._keypair):
            await self._send_signed_request()
        else:  # offered first, as asyncssh does (the server's PK_OK then asks for the signature)
            self.logger.debug1("Trying public key auth with %s key", self._keypair.algorithm)
            await self.send_request(
                Boolean(False), String(self._keypair.algorithm), String(self._keypair.public_data)
            )
