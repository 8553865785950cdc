"""IAP tunnels and proxy commands, as command lines (pure: nothing is connected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multihost.cloud.tpus import iap_tunnel_argv as tunnel_argv
from multihost.errors import UsageError
from multihost.model import Host
from multihost.sources import FleetSpec, resolve
from multihost.sources.tpu import INTERNAL_ONLY, build_fleet
from multihost.transport import SSHOptions
from multihost.transport.ssh import _proxy_argv
from tests.gcloud_fixtures import make_node


def test_tunnel_is_gclouds_own_proxy_command() -> None:
    """As ``gcloud alpha compute tpus tpu-vm ssh --tunnel-through-iap`` builds it."""
    assert tunnel_argv("gcloud", "t1v-n-abc-w-0", "p", "z") == (
        "gcloud",
        "alpha",
        "compute",
        "start-iap-tunnel",
        "t1v-n-abc-w-0",
        "%p",
        "--listen-on-stdin",
        "--project=p",
        "--zone=z",
        "--verbosity=warning",
    )


def test_proxy_commands_expanded_with_their_stderr_kept_apart(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host a\n  HostName 10.9.8.7\n  Port 2200\n  User u\n"
        "  ProxyCommand nc -q0 %h %p # %r@%n %%\n"
        "Host b\n  Port 2201\n"
    )
    options = SSHOptions(config=(config,))
    wrapper = ["sh", "-c", 'exec 3>&2; exec "$@" 2>"$0"']
    configured = _proxy_argv(Host("a"), options, {}, "10.9.8.7")
    assert configured is not None
    assert configured[:3] == wrapper
    assert configured[4:] == ["sh", "-c", "exec nc -q0 10.9.8.7 2200 # u@a %"]
    own = Host("b", proxy_command=tunnel_argv("gcloud", "inst", "p", "z"))
    argv = _proxy_argv(own, options, {}, "b")
    assert argv is not None
    assert argv[4:10] == [
        "gcloud",
        "alpha",
        "compute",
        "start-iap-tunnel",
        "inst",
        "2201",
    ]
    assert _proxy_argv(Host("b"), options, {}, "b") is None  # no proxy: connect directly


def test_internal_only_workers_say_how_to_reach_them() -> None:
    internal = build_fleet([make_node("q", "v4-16", ["10.0.0.2", "10.0.0.3"])])
    assert {h.reach_hint for h in internal} == {INTERNAL_ONLY}
    assert "--tunnel-through-iap" in INTERNAL_ONLY
    external = build_fleet([make_node("q", "v4-8", ["10.0.0.2"], ["34.1.2.3"])])
    assert [h.reach_hint for h in external] == [None]


def test_iap_goes_with_prefix_only() -> None:
    with pytest.raises(UsageError, match="--tunnel-through-iap goes with --prefix"):
        resolve(FleetSpec(hosts="a,b", tunnel_through_iap=True))


def test_wait_flag_bare_or_with_seconds() -> None:
    from multihost.cli import parse

    assert parse(["hosts", "--prefix", "q", "--wait"]).wait == float("inf")
    assert parse(["hosts", "--prefix", "q", "--wait", "90"]).wait == 90.0
    assert parse(["hosts", "--prefix", "q"]).wait is None
    with pytest.raises(UsageError):
        parse(["hosts", "--prefix", "q", "--wait", "-1"])
