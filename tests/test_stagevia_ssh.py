"""``--stage-via`` on real OpenSSH hosts: a seed per slice, a seed that cannot serve, and a
bucket (fake-gcs-server, pulled by the real gcloud CLI on each host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import multihost
from multihost.sandbox.standin.gcs import FakeGcs
from multihost.staging.archive import pack
from multihost.sweep.results import NO_RESULT
from tests import fleet as loopback
from tests.clitools import cli, manifest, no_processes
from tests.cloud.fixture import bucket_for_hosts
from tests.helpers import wait_for
from tests.test_stagevia import Sh, fetch, serving, stop

pytestmark = pytest.mark.usefixtures("fresh_runs")
BUCKET = "mh-stage"


@pytest.fixture
def code(code: Path) -> Path:
    """The shared code dir plus a package, a script and a blob (a new content hash every
    test)."""
    (code / "pkg").mkdir()
    (code / "pkg" / "m.py").write_text("X = 1\n")
    (code / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (code / "run.sh").chmod(0o755)
    (code / "blob").write_bytes(os.urandom(200_000))
    return code


def _tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), bool(p.stat().st_mode & 0o100))
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".multihost-complete"
    }


def _inventory(tmp_path: Path, slices: list[list[str]]) -> Path:
    inv = tmp_path / "fleet.toml"
    inv.write_text("".join(f"[[slices]]\nhosts = [{', '.join(s)}]\n" for s in slices))
    return inv


def _staged(fleet: loopback.Fleet, i: int, short: str) -> Path:
    return fleet.hosts[i].home / ".multihost" / "code" / short


def test_peer_one_upload_per_seed(ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path) -> None:
    inv = _inventory(tmp_path, [['"h0"', '"h1"', '"h2"'], ['"h3"', '"h4"', '"h5"']])
    seeds = [ssh_fleet.hosts[i].home / ".multihost" / "seed" for i in (0, 3)]
    before = [set(d.iterdir()) if d.is_dir() else set() for d in seeds]
    res = multihost.run(
        "test -x run.sh && cat pkg/m.py",
        hosts=str(inv),
        ssh_config=ssh_fleet.ssh_config,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stage_via="peer",
        stream="none",
    )
    assert res.ok, res
    archive = pack(code)
    size = len(archive.data)
    assert res.staging is not None
    # the runner's transport counter: the archive once per seed, and a token line per host
    assert res.staging.runner_bytes == 2 * size + 6 * 44
    assert (res.staging.uploads, res.staging.fetched, res.staging.fallbacks) == (2, 4, ())
    assert [h.bytes_sent for h in res.hosts] == [size, 0, 0, size, 0, 0]
    want = _tree(code)
    for i in range(6):
        assert _tree(_staged(ssh_fleet, i, archive.short)) == want, f"h{i}"
    # no server left on a seed, nothing of this run left in its seed dir
    wait_for(lambda: no_processes(ssh_fleet, 6), 10, "host processes to end")
    for d, had in zip(seeds, before, strict=True):
        assert set(d.iterdir()) <= had


def test_sweep_stages_through_the_seeds(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path
) -> None:
    """A sweep with ``stage_via="peer"`` on 2 slices × 2: the runner sends the archive once per
    slice, each slice's other host fetches it from the seed, and both points run on it."""
    inv = _inventory(tmp_path, [['"h0"', '"h1"'], ['"h2"', '"h3"']])
    res = multihost.run_sweep(
        "test -x run.sh && cat pkg/m.py #{n}",
        {"n": [1, 2]},
        hosts=str(inv),
        ssh_config=ssh_fleet.ssh_config,
        script_dir=code,
        log_dir=tmp_path / "logs",
        stage_via="peer",
        on_record=lambda _r: None,
    )
    assert [r.status for r in res.records] == [NO_RESULT] * 2  # both ran (no result line)
    size = len(pack(code).data)
    assert res.staging is not None
    assert res.staging.runner_bytes == 2 * size + 4 * 44  # once per seed, a token line each
    assert (res.staging.via, res.staging.uploads, res.staging.fetched) == ("peer", 2, 2)
    assert res.staging.fallbacks == ()
    wait_for(lambda: no_processes(ssh_fleet, 4), 10, "host processes to end")


def test_seed_that_cannot_serve_falls_back(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path
) -> None:
    """The seed's internal address is not this machine's: its server cannot bind, so its
    slice's hosts get the code from the runner, and the summary says so."""
    inv = _inventory(
        tmp_path, [['{ address = "h0", internal_address = "192.0.2.1" }', '"h1"', '"h2"']]
    )
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--hosts",
            str(inv),
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "fb",
            "--stage-via",
            "peer",
            "--cmd",
            "cat pkg/m.py",
        ]
    )
    assert res.returncode == 0, res.stderr
    assert "2 fell back to direct upload" in res.stderr
    assert "could not serve" in res.stderr
    size = len(pack(code).data)
    assert [h["bytes_sent"] for h in manifest(logs, "fb")["hosts"]] == [size] * 3
    for i in range(3):
        assert _tree(_staged(ssh_fleet, i, pack(code).short)) == _tree(code)
    wait_for(lambda: no_processes(ssh_fleet, 3), 10, "host processes to end")


def test_a_seed_never_serves_on_a_public_address(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path
) -> None:
    """Forced ``--stage-via peer``: slice 0's seed has a shared (not private) internal address,
    so no seed is started there and its slice gets the code from the runner (the run says so);
    slice 1's seed, on a private address, serves as usual. 100.64.0.1 is never connected to."""
    inv = _inventory(
        tmp_path,
        [['{ address = "h0", internal_address = "100.64.0.1" }', '"h1"'], ['"h2"', '"h3"']],
    )
    seed_dir = ssh_fleet.hosts[0].home / ".multihost" / "seed"
    touched = seed_dir.stat().st_mtime_ns if seed_dir.is_dir() else None
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--hosts",
            str(inv),
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "pub",
            "--stage-via",
            "peer",
            "--cmd",
            "cat pkg/m.py",
        ]
    )
    assert res.returncode == 0, res.stderr
    assert (
        "slice 0: its seed s0/w0's internal address 100.64.0.1 is not private, so no seed "
        "serves there: the runner sends the slice its code"
    ) in res.stderr
    assert "slice 1" not in res.stderr
    archive = pack(code)
    size = len(archive.data)
    record = manifest(logs, "pub")
    assert [h["bytes_sent"] for h in record["hosts"]] == [size, size, size, 0]  # h3 fetched
    assert (record["staging"]["fetched"], record["staging"]["fallbacks"]) == (1, [])
    for i in range(4):
        assert _tree(_staged(ssh_fleet, i, archive.short)) == _tree(code), f"h{i}"
    wait_for(lambda: no_processes(ssh_fleet, 4), 10, "host processes to end")
    # nothing was ever made (or removed) in h0's seed dir: no seed started there
    assert (seed_dir.stat().st_mtime_ns if seed_dir.is_dir() else None) == touched


@pytest.fixture
def bucket(ssh_fleet: loopback.Fleet, tmp_path: Path) -> Iterator[tuple[FakeGcs, dict[str, str]]]:
    """fake-gcs-server with a bucket that h0 and h1's own gcloud and the runner's reach."""
    with bucket_for_hosts(ssh_fleet.hosts[:2], tmp_path, BUCKET) as found:
        yield found


def test_gs_uploads_once_and_hosts_pull(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path, bucket: tuple[FakeGcs, dict[str, str]]
) -> None:
    gcs, env = bucket
    archive = pack(code)
    logs = tmp_path / "logs"
    args = [
        "run",
        "--hosts",
        "h0,h1",
        "--ssh-config",
        str(ssh_fleet.ssh_config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--stage-via",
        f"gs://{BUCKET}",
        "--cmd",
        "cat pkg/m.py",
    ]
    res = cli([*args, "--run-name", "g1"], **env)
    assert res.returncode == 0, res.stderr
    name = f"multihost/code/{archive.digest}.tar.gz"
    assert gcs.read(BUCKET, name) == archive.data  # the layout `multihost job` uses
    assert "2 host(s) fetched it" in res.stderr
    assert "(1.0× the" in res.stderr  # the bucket upload, once
    assert [h["bytes_sent"] for h in manifest(logs, "g1")["hosts"]] == [0, 0]
    for i in range(2):
        assert _tree(_staged(ssh_fleet, i, archive.short)) == _tree(code)
    # the same code again, to hosts that lack it: the object is there, nothing is uploaded
    try:
        again = [*args, "--run-name", "g2", "--remote-dir", "~/.multihost-g2"]
        again[again.index("h0,h1")] = "h0"
        res = cli(again, **env)
        assert res.returncode == 0, res.stderr
        assert "is already in" in res.stderr
        assert "the runner sent 0 B" in res.stderr
        assert "1 host(s) fetched it" in res.stderr
    finally:
        for h in ssh_fleet.hosts[:2]:
            shutil.rmtree(h.home / ".multihost-g2", ignore_errors=True)


def _ssh(fleet: loopback.Fleet, alias: str) -> Sh:
    def run(command: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        argv = ["ssh", "-F", str(fleet.ssh_config), alias, command]
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=60)

    return run


def test_corrupted_archive_is_refused_across_hosts(ssh_fleet: loopback.Fleet, code: Path) -> None:
    """h6 serves on its address, h7 fetches over loopback: bytes that are not the archive
    the runner packed are refused and nothing is unpacked; the server is gone afterwards."""
    archive = pack(code)
    seed, host = ssh_fleet.hosts[6], ssh_fleet.hosts[7]
    url, pid, folder = serving(
        _ssh(ssh_fleet, seed.alias), "~/.multihost", archive.data, fetches=1, addr=seed.address
    )
    try:
        (Path(folder) / "archive").write_bytes(archive.data[:-10] + b"corrupted!")
        code_dir = f"~/.multihost/code/{archive.short}"
        bad = fetch(_ssh(ssh_fleet, host.alias), code_dir, url, archive.digest)
        assert bad.returncode == 3, bad.stderr
        assert b"sha256 mismatch" in bad.stderr
        assert not (host.home / ".multihost" / "code" / archive.short).exists()
        assert not list((host.home / ".multihost" / "code").glob(".incoming.*"))
    finally:
        assert stop(_ssh(ssh_fleet, seed.alias), pid, folder) in (b"gone\n", b"stopped\n")
    wait_for(lambda: not ssh_fleet.user_processes(6), 10, "the seed's server to be gone")
    assert not Path(folder).exists()
