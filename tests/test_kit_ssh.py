"""The kit (the hook and the run's scripts) on real OpenSSH hosts: staged by content like the
code, checked on every run, and what a run writes to each host's socket, counted by a TCP relay
(``tests/relay.py``): a warm re-run stays under 8 KiB per host, SSH handshake included."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from multihost.remote.commands import hook_text, kit
from tests import fleet as loopback
from tests.clitools import cli, manifest, no_processes
from tests.helpers import wait_for
from tests.relay import Relay, relayed_client

N = 4
WARM_MAX = 8 * 1024  # bytes a warm re-run of a trivial command writes to a host, in all

pytestmark = pytest.mark.usefixtures("fresh_runs")


@pytest.fixture
def relay(ssh_fleet: loopback.Fleet) -> Iterator[Relay]:
    r = Relay([(h.address, h.port) for h in ssh_fleet.hosts[:N]])
    r.start()
    yield r
    r.stop()


def _run(config: Path, code: Path, logs: Path, remote: str, name: str) -> None:
    hosts = ",".join(loopback.alias(i) for i in range(N))
    res = cli(
        [
            "run",
            "--hosts",
            hosts,
            "--ssh-config",
            str(config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--remote-dir",
            remote,
            "--run-name",
            name,
            "--cmd",
            "true",
        ]
    )
    assert res.returncode == 0, res.stderr


def _sent(relay: Relay, run: object) -> list[int]:
    relay.reset()
    run()  # type: ignore[operator]
    wait_for(lambda: relay.open == 0, 30, "the relayed connections to end")
    return [c.up for c in relay.counters]


def test_cold_then_warm_bytes_and_a_stale_or_altered_kit_is_replaced(
    ssh_fleet: loopback.Fleet, relay: Relay, code: Path, tmp_path: Path
) -> None:
    config = relayed_client(ssh_fleet.head(N), relay, tmp_path / "client")
    logs = tmp_path / "logs"
    folder = f".mh-kit-{secrets.token_hex(3)}"  # nothing of multihost there yet
    remote = f"~/{folder}"
    the_kit = kit()
    cold = _sent(relay, lambda: _run(config, code, logs, remote, "cold"))
    kits = [h.home / folder / "kit" / the_kit.short for h in ssh_fleet.hosts[:N]]
    for k in kits:
        assert (k / "sitecustomize.py").read_text() == hook_text()
    warm = _sent(relay, lambda: _run(config, code, logs, remote, "warm"))
    assert max(warm) <= WARM_MAX, (cold, warm)
    assert all(c - w >= len(the_kit.archive) for c, w in zip(cold, warm, strict=True))  # once
    assert [h["bytes_sent"] for h in manifest(logs, "warm")["hosts"]] == [0] * N
    # host 1's kit altered, host 2's gone (another version's beside it): each gets it again
    (kits[1] / "sitecustomize.py").write_text("raise SystemExit('not the hook')\n")
    stale = kits[2].parent / "0123456789abcdef"
    kits[2].rename(stale)
    again = _sent(relay, lambda: _run(config, code, logs, remote, "again"))
    for i in (1, 2):
        assert again[i] >= len(the_kit.archive) > again[0], again
        run_dir = ssh_fleet.hosts[i].home / folder / "runs" / "again"
        assert (run_dir / "hook" / "sitecustomize.py").read_text() == hook_text()
    assert stale.is_dir()
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")
    for h in ssh_fleet.hosts[:N]:
        shutil.rmtree(h.home / folder)
