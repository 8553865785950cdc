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
        (0, 0, 0),
        (0, 1, 1),
        (0, 2, 2),
        (0, 3, 3),
    ]
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
        ("[[slices]]\nhosts = [{ address = 'a', remote_dir = '~u/x' }]", "~USER"),
    ],
)
def test_malformed_inventory(tmp_path: Path, text: str, match: str) -> None:
    inv = tmp_path / "bad.toml"
    inv.write_text(text)
    with pytest.raises(InventoryError, match=match):
        resolve_hosts(str(inv))


def test_a_relative_remote_dir_is_under_the_remote_users_home(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.toml"
    inv.write_text(
        "[[slices]]\nhosts = [{ address = 'a', remote_dir = 'work' }, "
        "{ address = 'b', remote_dir = '/srv/mh' }]"
    )
    assert [h.remote_dir for h in resolve_hosts(str(inv))] == ["~/work", "/srv/mh"]


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


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("h[0-3]", ["h0", "h1", "h2", "h3"]),
        ("10.0.0.[2-4]", ["10.0.0.2", "10.0.0.3", "10.0.0.4"]),
        ("h[01-03,7],x", ["h01", "h02", "h03", "h7", "x"]),
        ("r[1-2]n[0-1]", ["r1n0", "r1n1", "r2n0", "r2n1"]),
        ("u@g[8-10]:2200", ["u@g8:2200", "u@g9:2200", "u@g10:2200"]),
    ],
)
def test_host_ranges_expand_in_order(spec: str, names: list[str]) -> None:
    assert [h.target for h in parse_host_list(spec)] == names


@pytest.mark.parametrize("bad", ["h[3-1]", "h[1-]", "h[0,2-1]"])
def test_bad_ranges(bad: str) -> None:
    with pytest.raises(InventoryError, match="range"):
        parse_host_list(bad)


def test_ipv6_targets_are_shown_in_brackets() -> None:
    fleet = parse_host_list("[::1]:22,root@[fe80::1],[::2]")
    assert [h.target for h in fleet] == ["[::1]:22", "root@[fe80::1]", "[::2]"]
    assert fleet.hosts[0].address == "::1"


@pytest.mark.parametrize("spec", ["a,,b", "a,b,", ",a"])
def test_empty_entries_are_refused(spec: str) -> None:
    with pytest.raises(InventoryError, match="empty entry"):
        parse_host_list(spec)


def test_duplicates_are_refused_naming_both_positions(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="host h1 appears twice: s0/w1 and s0/w3"):
        parse_host_list("h0,h1,h2,h1")
    with pytest.raises(InventoryError, match=r"u@h\[1\]|u@h1 appears twice"):
        parse_host_list("u@h1,h[0-2],u@h1")
    inv = tmp_path / "dup.toml"
    inv.write_text(
        '[defaults]\nuser = "ml"\n[[slices]]\nhosts = ["a", "b"]\n'
        '[[slices]]\nhosts = ["c", "ml@a"]\n'
    )
    with pytest.raises(InventoryError, match="host ml@a appears twice: s0/w0 and s1/w1"):
        resolve_hosts(str(inv))


def test_plain_hosts_file(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("# the fleet\nh0\n\nalice@h1:2200  # gpu box\nn[1-2]\n[::1]:22\n")
    fleet = resolve_hosts(str(f))
    assert [h.target for h in fleet] == ["h0", "alice@h1:2200", "n1", "n2", "[::1]:22"]
    assert [h.process_id for h in fleet] == [0, 1, 2, 3, 4]
    bad = tmp_path / "bad.toml"
    bad.write_text("h0\n")
    with pytest.raises(InventoryError, match="not valid TOML"):
        resolve_hosts(str(bad))


def test_local_state_honours_xdg_cache_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/srv/cache")
    assert local_fleet(2).hosts[1].remote_dir == "/srv/cache/multihost/local/w1"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert local_fleet(1).hosts[0].remote_dir == "~/.cache/multihost/local/w0"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert local_fleet(1).hosts[0].remote_dir == "~/.cache/multihost/local/w0"


def test_inventory_port_range(tmp_path: Path) -> None:
    inv = tmp_path / "p.toml"
    inv.write_text('[[slices]]\nhosts = [{ address = "a", port = 70000 }]\n')
    with pytest.raises(InventoryError, match="port must be 1-65535"):
        resolve_hosts(str(inv))


@pytest.mark.parametrize(
    ("text", "first_line"),
    [
        ("h[0-3],h[4-7", "unbalanced bracket in the host list: 'h[4-7' has a '[' without its ']'"),
        ("h[0-", "unbalanced bracket in the host list: 'h[0-' has a '[' without its ']'"),
        ("h[0-3]],g", "unbalanced bracket in the host list: 'h[0-3]]' has a ']' without its '['"),
        ("h[0-99999999]", "'h[0-99999999]' expands to 100000000 hosts: more than 100000 in all"),
        ("h[0-60000],g[0-60000]", "'g[0-60000]' expands to 60001 hosts: more than 100000 in all"),
        ("h[a-b]", "bad range in 'h[a-b]' (e.g. h[0-3] or h[01-03,7])"),
    ],
)
def test_a_bad_host_list_is_refused_naming_the_item(text: str, first_line: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_host_list(text)
    assert str(caught.value) == first_line
