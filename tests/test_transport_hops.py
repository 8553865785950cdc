"""Shared connections (``transport.hops``) and hop hosts as data (pure: nothing is connected)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from multihost.errors import ConnectError
from multihost.model import Fleet, Host
from multihost.runs.record import _host_json
from multihost.sources.iap import through_iap
from multihost.transport import SSHOptions
from multihost.transport.hops import Pool, jump_host
from multihost.transport.ssh import connect_ssh


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None

    def is_closed(self) -> bool:
        return self.closed


def test_one_connection_for_everyone_who_asks_while_it_opens() -> None:
    async def go() -> None:
        pool: Pool[FakeConn] = Pool()
        gate = asyncio.Event()
        released: list[str] = []

        async def opener() -> tuple[FakeConn, object]:
            await gate.wait()

            async def after() -> None:
                released.append("hop")

            return FakeConn(), after

        tasks = [asyncio.create_task(pool.lease("k", opener)) for _ in range(5)]
        await asyncio.sleep(0)
        gate.set()
        leases = await asyncio.gather(*tasks)
        assert pool.opened == 1
        assert len({id(lease.conn) for lease in leases}) == 1
        for lease in leases[:-1]:
            await lease.release()
        assert not leases[0].conn.closed
        assert released == []
        await leases[-1].release()
        await leases[-1].release()  # again: nothing more
        assert leases[0].conn.closed
        assert released == ["hop"]

    asyncio.run(go())


def test_a_failed_or_lost_connection_is_not_handed_out_again() -> None:
    async def go() -> None:
        pool: Pool[FakeConn] = Pool()
        tries = 0

        async def failing() -> tuple[FakeConn, object]:
            nonlocal tries
            tries += 1
            await asyncio.sleep(0)
            raise OSError("hop unreachable")

        results = await asyncio.gather(
            *(pool.lease("k", failing) for _ in range(3)), return_exceptions=True
        )
        assert tries == 1  # all three got the one attempt's cause
        assert all(isinstance(r, OSError) and "hop unreachable" in str(r) for r in results)

        async def opener() -> tuple[FakeConn, object]:
            async def after() -> None:
                return None

            return FakeConn(), after

        first = await pool.lease("k", opener)  # a new attempt after the failure
        first.conn.close()  # lost under its user
        second = await pool.lease("k", opener)
        assert second.conn is not first.conn
        assert pool.opened == 2

    asyncio.run(go())


def test_proxy_jump_values() -> None:
    assert jump_host("bastion") == Host("bastion")
    assert jump_host("me@b:2200") == Host("b", user="me", port=2200)
    assert jump_host("ssh://me@[::1]:22") == Host("::1", user="me", port=22)
    assert jump_host("a,u@b") == Host("b", user="u", jump=Host("a"))


def test_iap_hops_per_slice_and_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = Fleet.from_slices(
        [[Host(f"s{s}w{w}", internal_address=f"10.0.{s}.{w}") for w in range(3)] for s in range(2)]
    )
    names = {0: "i0", 1: "i1", 2: "i2"}
    monkeypatch.setattr("multihost.sources.iap.hostnames", lambda *a, **k: names)
    hopped = through_iap(fleet, ["q-0", "q-1"], "p", "z")
    each = through_iap(fleet, ["q-0", "q-1"], "p", "z", per_host=True)
    tunnelled = [h for h in hopped if h.proxy_command]
    assert [h.name for h in tunnelled] == ["s0/w0", "s1/w0"]
    assert all(h.jump == tunnelled[h.slice_id] for h in hopped if h.worker_id)
    assert [h.address for h in hopped] == [h.internal_address for h in fleet]
    assert all(h.proxy_command and h.jump is None for h in each)
    # a record keeps the hop, and reads it back
    h = hopped.hosts[2]
    data = json.loads(json.dumps(_host_json(h)))
    assert Host(**data) == h
    assert h.with_user("u").jump == tunnelled[0].with_user("u")


def test_a_hop_is_logged_in_to_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker's own login name (the ssh config's User per address, first contact's):
    a hop gets its own, never the name of the host behind it, so it stays the very Host of its
    slice's first worker (one connection for both); ``--user`` names every host's, the hops'
    too. With the first workers left out (``--workers``), the hops are still reached."""
    fleet = Fleet.from_slices(
        [[Host(f"s{s}w{w}", internal_address=f"10.0.{s}.{w}") for w in range(3)] for s in range(2)]
    )
    monkeypatch.setattr("multihost.sources.iap.hostnames", lambda *a, **k: {0: "i0"})
    hopped = through_iap(fleet, ["q-0", "q-1"], "p", "z")
    own = Fleet(tuple(h.with_login(lambda x: f"u-{x.address}") for h in hopped))
    first = {h.slice_id: h for h in own if h.worker_id == 0}
    for h in own:
        assert h.user == f"u-{h.address}"
        assert h.jump == (first[h.slice_id] if h.worker_id else None)
        assert h.hops == ((first[h.slice_id],) if h.worker_id else ())
    everyone = Fleet(tuple(h.with_user("me") for h in hopped))
    for h in everyone:
        assert h.user == "me"
        assert h.jump == (everyone.hosts[3 * h.slice_id] if h.worker_id else None)
    behind = Fleet(tuple(h for h in own if h.worker_id))
    assert behind.reached() == (*behind.hosts, first[0], first[1])
    assert own.reached() == own.hosts


def test_a_proxy_jump_loop_is_an_error_not_a_hang(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")

    async def go() -> None:
        await connect_ssh(Host("a"), SSHOptions(config=(config,), connect_timeout=2))

    with pytest.raises(ConnectError, match="loop in the ssh config"):
        asyncio.run(asyncio.wait_for(go(), 10))
