"""Cloud TPU discovery: strict matching and validation on fixtures, and through a fake gcloud."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from multihost.errors import DiscoveryError, UsageError
from multihost.sources.tpu import (
    build_fleet,
    check_slices,
    discover,
    discover_from_nodes,
    fleet_rows,
    gcloud_command,
    node_name,
    select_slices,
)
from tests.gcloud_fixtures import (
    FAKE_GCLOUD_DIR,
    FIXTURE_DIR,
    FIXTURES,
    dump,
    load,
    loopback_nodes,
    make_node,
    make_nodes,
)


def names(nodes: list[Any]) -> list[str]:
    return [node_name(n) for n in nodes]


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_fixture_files_match_generator(fixture: str) -> None:
    assert (FIXTURE_DIR / f"{fixture}.json").read_text() == dump(FIXTURES[fixture])


# -- matching ---------------------------------------------------------------------------------


def test_exact_name_is_one_slice() -> None:
    assert names(select_slices(load("mixed"), "myv4")) == ["myv4"]


def test_numbered_slices_in_order_ignoring_lookalikes() -> None:
    # mixed lists myqr-1 before myqr-0, plus myqr-old, myqrx-0 and other-0.
    assert names(select_slices(load("mixed"), "myqr")) == ["myqr-0", "myqr-1"]


@pytest.mark.parametrize("prefix", ["myq", "myqr-", "qr", "myqr-0-", "MYQR"])
def test_partial_names_do_not_match(prefix: str) -> None:
    with pytest.raises(DiscoveryError, match="nodes seen: myqr-0, myqr-1, myqr-old"):
        select_slices(load("mixed"), prefix)


def test_prefix_with_regex_characters_is_literal() -> None:
    nodes = make_nodes("a.b", 1, 1, "v4-8", ["10.0.0.1"]) + make_nodes("axb", 1, 1, "v4-8", ["1"])
    assert names(select_slices(nodes, "a.b")) == ["a.b-0"]


def test_no_match_lists_every_node_seen() -> None:
    with pytest.raises(DiscoveryError) as info:
        select_slices(load("mixed"), "nope")
    message = str(info.value)
    assert "'nope'" in message
    for name in ("myqr-0", "myqr-1", "myqr-old", "myqrx-0", "other-0", "myv4"):
        assert name in message
    assert isinstance(info.value, UsageError)


def test_no_match_caps_the_list_of_names() -> None:
    nodes = [make_node(f"n{k:03d}", "v4-8", ["10.0.0.1"]) for k in range(45)]
    with pytest.raises(DiscoveryError, match=r"n028, n029 and 15 more\)$"):
        select_slices(nodes, "x")


def test_no_nodes_at_all() -> None:
    with pytest.raises(DiscoveryError, match=r"nodes seen: none"):
        select_slices([], "myqr")


def test_numbering_gap() -> None:
    with pytest.raises(DiscoveryError, match=r"found gap-0, gap-2; missing gap-1"):
        select_slices(load("gap"), "gap")


def test_numbering_must_start_at_zero() -> None:
    nodes = make_nodes("q", 3, 1, "v4-8", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])[1:]
    with pytest.raises(DiscoveryError, match=r"found q-1, q-2; missing q-0"):
        select_slices(nodes, "q")


def test_repeated_slice_number() -> None:
    nodes = [*make_nodes("q", 2, 1, "v4-8", ["10.0.0.1", "10.0.0.2"])]
    nodes.append(make_node("q-01", "v4-8", ["10.0.0.3"]))
    with pytest.raises(DiscoveryError, match=r"repeat \[1\]"):
        select_slices(nodes, "q")


def test_same_exact_name_twice() -> None:
    nodes = make_nodes("t", None, 1, "v4-8", ["10.0.0.1"])
    nodes += make_nodes("t", None, 1, "v4-8", ["10.0.0.2"], zone="us-east1-d")
    with pytest.raises(DiscoveryError, match=r"2 TPU nodes are named 't'.*us-east1-d"):
        select_slices(nodes, "t")


def test_exact_name_wins_over_numbered_with_warning() -> None:
    nodes = make_nodes("x", None, 1, "v4-8", ["10.0.0.1"])
    nodes += make_nodes("x", 2, 1, "v4-8", ["10.0.0.2", "10.0.0.3"])
    found = discover_from_nodes(nodes, "x")
    assert found.slice_names == ("x",)
    assert found.warnings == ("using the node named 'x'; ignoring x-0, x-1",)


# -- validation -------------------------------------------------------------------------------


def test_not_ready_lists_every_state() -> None:
    with pytest.raises(DiscoveryError, match=r"READY: new-0 READY, new-1 CREATING"):
        discover_from_nodes(load("creating"), "new")


def test_mixed_accelerator_types() -> None:
    nodes = make_nodes("m", 1, 2, "v4-16", ["10.0.0.1", "10.0.0.2"])
    nodes.append(make_node("m-1", "v4-32", ["10.0.0.3", "10.0.0.4"]))
    with pytest.raises(DiscoveryError, match=r"accelerator type: m-0 v4-16, m-1 v4-32"):
        discover_from_nodes(nodes, "m")


def test_mixed_worker_counts() -> None:
    nodes = make_nodes("m", 1, 2, "v4-16", ["10.0.0.1", "10.0.0.2"])
    nodes.append(make_node("m-1", "v4-16", ["10.0.0.3"]))
    with pytest.raises(DiscoveryError, match=r"worker count: m-0 2, m-1 1"):
        discover_from_nodes(nodes, "m")


def test_ready_node_without_endpoints() -> None:
    nodes = [make_node("e", "v4-8", [])]
    with pytest.raises(DiscoveryError, match=r"no network endpoints .* for e"):
        discover_from_nodes(nodes, "e")


def test_unhealthy_is_a_warning() -> None:
    found = discover_from_nodes(load("unhealthy"), "sick")
    assert len(found.fleet) == 4
    assert found.warnings == (
        "sick-1 health is UNHEALTHY_MAINTENANCE: "
        "The TPU had a maintenance event at 2025-01-15T10:00:00Z",
    )


def test_health_absent_or_healthy_gives_no_warning() -> None:
    nodes = make_nodes("h", 2, 1, "v4-8", ["10.0.0.1", "10.0.0.2"])
    del nodes[0]["health"]
    assert check_slices(nodes) == ()


# -- fleet ------------------------------------------------------------------------------------


def test_two_slice_fleet_is_numbered_slice_major() -> None:
    found = discover_from_nodes(load("mixed"), "myqr", ip="internal")
    fleet = found.fleet
    assert (fleet.num_slices, fleet.workers_per_slice, len(fleet)) == (2, 2, 4)
    assert [(h.slice_id, h.worker_id, h.process_id) for h in fleet] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 3),
    ]
    assert [h.address for h in fleet] == [
        "10.130.0.10",
        "10.130.0.11",
        "10.130.0.12",
        "10.130.0.13",
    ]
    assert {h.accelerator_type for h in fleet} == {"v4-16"}
    assert {h.cloud_state for h in fleet} == {"READY"}
    assert found.slice_names == ("myqr-0", "myqr-1")
    assert (found.project, found.zone, found.queued_resource) == (
        "my-project",
        "us-central2-b",
        "myqr",
    )


def test_workers_follow_network_endpoint_order() -> None:
    node = make_node("w", "v5litepod-16", ["10.0.0.9", "10.0.0.3", "10.0.0.7", "10.0.0.1"])
    assert [h.address for h in build_fleet([node], "internal")] == [
        "10.0.0.9",
        "10.0.0.3",
        "10.0.0.7",
        "10.0.0.1",
    ]


def test_single_v4_8_and_v5e() -> None:
    v4 = discover_from_nodes(load("myv4"), "myv4").fleet
    assert [(h.address, h.internal_address, h.accelerator_type) for h in v4] == [
        ("34.66.10.5", "10.130.0.5", "v4-8")
    ]
    v5e = discover_from_nodes(load("v5e"), "myv5e")
    assert len(v5e.fleet) == 4
    assert v5e.fleet.num_slices == 1
    assert v5e.zone == "us-west4-a"
    assert v5e.queued_resource is None
    assert [h.address for h in v5e.fleet] == [
        "10.164.0.20",
        "10.164.0.21",
        "10.164.0.22",
        "10.164.0.23",
    ]


@pytest.mark.parametrize(
    ("ip", "expected"),
    [
        ("internal", ["10.0.0.1", "10.0.0.2"]),
        ("auto", ["34.0.0.1", "10.0.0.2"]),
    ],
)
def test_ip_modes(ip: str, expected: list[str]) -> None:
    nodes = make_nodes("ip", None, 2, "v4-16", ["10.0.0.1", "10.0.0.2"], ["34.0.0.1", None])
    fleet = build_fleet(nodes, ip)
    assert [h.address for h in fleet] == expected
    assert [h.internal_address for h in fleet] == ["10.0.0.1", "10.0.0.2"]


def test_external_mode() -> None:
    assert [h.address for h in discover_from_nodes(load("myqr"), "myqr", ip="external").fleet] == [
        "35.202.7.10",
        "35.202.7.11",
        "35.202.7.12",
        "35.202.7.13",
    ]


def test_external_mode_without_external_ip_names_the_node() -> None:
    nodes = make_nodes("ip", None, 2, "v4-16", ["10.0.0.1", "10.0.0.2"], ["34.0.0.1", None])
    with pytest.raises(DiscoveryError, match=r"ip worker 1 has no external IP"):
        build_fleet(nodes, "external")
    with pytest.raises(DiscoveryError, match=r"myv5e worker 0 has no external IP"):
        discover_from_nodes(load("v5e"), "myv5e", ip="external")


def test_empty_access_config_counts_as_no_external_ip() -> None:
    node = make_node("ac", "v4-8", ["10.0.0.1"])
    node["networkEndpoints"][0]["accessConfig"] = {}
    assert build_fleet([node], "auto").hosts[0].address == "10.0.0.1"


def test_bad_ip_mode() -> None:
    with pytest.raises(DiscoveryError, match="internal, external, auto"):
        build_fleet(load("myv4"), "public")


def test_fleet_rows() -> None:
    rows = fleet_rows(discover_from_nodes(load("myqr"), "myqr").fleet)
    assert rows[3] == {
        "slice": 1,
        "worker": 1,
        "process": 3,
        "address": "35.202.7.13",
        "internal_address": "10.130.0.13",
        "accelerator_type": "v4-16",
        "state": "READY",
    }
    assert json.loads(json.dumps(rows)) == rows


def test_loopback_nodes_for_the_test_fleet() -> None:
    fleet = discover_from_nodes(loopback_nodes("lb", 2, 3), "lb").fleet
    assert [h.address for h in fleet] == [f"127.0.0.{k}" for k in range(2, 8)]
    assert [h.internal_address for h in fleet] == [h.address for h in fleet]


# -- through the fake gcloud ------------------------------------------------------------------


@pytest.fixture
def fake_gcloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Put the fake gcloud first on PATH; return the log file of its calls."""
    monkeypatch.setenv("PATH", f"{FAKE_GCLOUD_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
    log = tmp_path / "gcloud.log"
    monkeypatch.setenv("FAKE_GCLOUD_LOG", str(log))
    monkeypatch.setenv("FAKE_GCLOUD_NODES", str(FIXTURE_DIR / "mixed.json"))
    for name in ("FAKE_GCLOUD_ERROR", "FAKE_GCLOUD_SLEEP"):
        monkeypatch.delenv(name, raising=False)
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_one_call_for_a_multislice_fleet(fake_gcloud: Path) -> None:
    found = discover("myqr")
    assert len(found.fleet) == 4
    assert calls(fake_gcloud) == [["compute", "tpus", "tpu-vm", "list", "--format=json"]]
    assert found.command == ("gcloud", "compute", "tpus", "tpu-vm", "list", "--format=json")
    assert (found.project, found.zone) == ("my-project", "us-central2-b")


def test_project_and_zone_passed_through(fake_gcloud: Path) -> None:
    found = discover("myv4", project="p-1", zone="europe-west4-a", ip="internal")
    assert calls(fake_gcloud) == [
        [
            "compute",
            "tpus",
            "tpu-vm",
            "list",
            "--format=json",
            "--project",
            "p-1",
            "--zone",
            "europe-west4-a",
        ]
    ]
    assert (found.project, found.zone) == ("p-1", "europe-west4-a")
    assert found.fleet.hosts[0].address == "10.130.0.5"


def test_gcloud_command_shape() -> None:
    assert gcloud_command(gcloud="/opt/gcloud", zone="z") == [
        "/opt/gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "list",
        "--format=json",
        "--zone",
        "z",
    ]


def test_not_logged_in(fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_ERROR", "auth")
    with pytest.raises(DiscoveryError) as info:
        discover("myqr", zone="us-central2-b")
    message = str(info.value)
    assert "exit 1" in message
    assert "You do not currently have an active account selected." in message
    assert "gcloud auth login" in message
    assert "gcloud compute tpus tpu-vm list --format=json --zone us-central2-b" in message
    assert "\n" not in message


def test_project_not_set(fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_ERROR", "project")
    with pytest.raises(DiscoveryError, match=r"required property \[project\] is not currently set"):
        discover("myqr")


def test_gcloud_missing(fake_gcloud: Path) -> None:
    with pytest.raises(DiscoveryError, match=r"'gcloud-nope' not found"):
        discover("myqr", gcloud="gcloud-nope")


def test_gcloud_by_path(fake_gcloud: Path) -> None:
    found = discover("myqr", gcloud=str(FAKE_GCLOUD_DIR / "gcloud"))
    assert found.command[0].endswith("fake_gcloud/gcloud")
    assert len(calls(fake_gcloud)) == 1


def test_unparsable_json(
    fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("Listed 0 items.\n")
    monkeypatch.setenv("FAKE_GCLOUD_NODES", str(bad))
    with pytest.raises(
        DiscoveryError, match=r"cannot parse the JSON gcloud printed.*\[ran: gcloud"
    ):
        discover("myqr")


def test_json_that_is_not_a_node_list(
    fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "obj.json"
    bad.write_text('{"nodes": []}')
    monkeypatch.setenv("FAKE_GCLOUD_NODES", str(bad))
    with pytest.raises(DiscoveryError, match="not a list of TPU nodes"):
        discover("myqr")


def test_gcloud_timeout(fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_SLEEP", "5")
    with pytest.raises(DiscoveryError, match=r"more than 0.3s"):
        discover("myqr", timeout=0.3)


def test_no_match_through_gcloud(fake_gcloud: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GCLOUD_NODES", str(FIXTURE_DIR / "empty.json"))
    where = r"in project \(gcloud default\), zone us-east5-a \(nodes seen: none\)"
    with pytest.raises(DiscoveryError, match=where):
        discover("myqr", zone="us-east5-a")


def test_fake_gcloud_rejects_unknown_commands(fake_gcloud: Path) -> None:
    proc = subprocess.run(
        ["gcloud", "compute", "tpus", "tpu-vm", "describe", "x"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "ERROR: (gcloud.compute.tpus.tpu-vm) Invalid choice: 'describe'." in proc.stderr
