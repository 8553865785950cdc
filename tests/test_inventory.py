"""Host lists, inventory files and local fleets: pure parsing, no SSH."""

from __future__ import annotations

from pathlib import Path

import pytest

from multihost.errors import InventoryError
from multihost.sources.inventory import local_fleet, parse_host_list, parse_target, resolve_hosts


def test_parse_target_forms() -> None:
    assert parse_target("h0").address == "h0"
    h = parse_target("alice@10.0.0.5:2200")
    assert (h.user, h.address, h.port) == ("alice", "10.0.0.5", 2200)
    assert parse_target("[::1]:22").address == "::1"
    assert parse_target("bob@[fe80::1]").user == "bob"


@pytest.mark.parametrize("bad", ["", "a b", "u@", "h:0", "h:99999", "h:x", "@h"])
def test_parse_target_rejects(bad: str) -> None:
    with pytest.raises(InventoryError):
        parse_target(bad)


def test_host_list_numbering() -> None:
    fleet = parse_host_list("h0, h1,h2,h3")
    assert [h.address for h in fleet] == ["h0", "h1", "h2", "h3"]
    assert [(h.slice_id, h.worker_id, h.process_id) for h in fleet] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 3),
    ]  # fmt: skip
    assert fleet.num_slices == 1
    assert fleet.hosts[3].name == "s0/w3"


def test_empty_host_list() -> None:
    with pytest.raises(InventoryError, match="empty"):
        parse_host_list(" , ")


def test_inventory_slices_and_defaults(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.toml"
    inv.write_text(
        """
[defaults]
user = "ml"
identity = "~/.ssh/id_tpu"

[[slices]]
hosts = ["a0", "a1"]

[[slices]]
hosts = [{ address = "b0", port = 2200, internal_address = "10.1.0.2" }, "root@b1"]
"""
    )
    fleet = resolve_hosts(str(inv))
    assert fleet.num_slices == 2
    assert fleet.workers_per_slice == 2
    assert [h.process_id for h in fleet] == [0, 1, 2, 3]
    b0, b1 = fleet.hosts[2], fleet.hosts[3]
    assert (b0.slice_id, b0.worker_id, b0.port, b0.user) == (1, 0, 2200, "ml")
    assert b0.internal_address == "10.1.0.2"
    assert b1.user == "root"
    assert b0.identity == "~/.ssh/id_tpu"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("slices = 3", "slices"),
        ("[[slices]]\nhosts = []", "non-empty"),
        ("[[slices]]\nhosts = [{ port = 22 }]", "address"),
        ("[[slices]]\nhosts = [{ address = 'a', colour = 'red' }]", "unknown key"),
        ("[[slices]]\nhosts = [{ address = 'a', port = 'x' }]", "wrong type"),
        ("[[slices]\nhosts = ['a']", "not valid TOML"),
        ("[[racks]]\nhosts = ['a']", "unknown top-level"),
        ("[[slices]]\nhosts = [{ address = 'a', remote_dir = '/' }]", "remote_dir"),
    ],
)
def test_malformed_inventory(tmp_path: Path, text: str, match: str) -> None:
    inv = tmp_path / "bad.toml"
    inv.write_text(text)
    with pytest.raises(InventoryError, match=match):
        resolve_hosts(str(inv))


def test_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        resolve_hosts(str(tmp_path / "nope.toml"))


def test_local_fleet_dirs() -> None:
    fleet = local_fleet(3, "/tmp/x")
    assert all(h.local for h in fleet)
    assert [h.remote_dir for h in fleet] == ["/tmp/x/w0", "/tmp/x/w1", "/tmp/x/w2"]
    with pytest.raises(InventoryError):
        local_fleet(0)


def test_long_host_list_is_not_a_path() -> None:
    spec = ",".join(f"host-number-{i}.example.internal" for i in range(128))
    assert len(resolve_hosts(spec)) == 128
    assert len(resolve_hosts("x" * 300)) == 1
