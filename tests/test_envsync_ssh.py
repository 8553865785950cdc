"""The locked environment on real OpenSSH hosts: real uv against a package index
served here on 127.0.0.1, wheels built in the test (one of 3 MB), hosts with /usr/bin/python3
and no uv of their own (the runner's is shipped to the builder); zstd where this machine has
it, taken from some hosts for a test by an ACL on the program (:func:`_without_zstd`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import multihost
from multihost.envsync.uvbin import uv_binary
from multihost.errors import UsageError
from multihost.events import Note
from multihost.remote import script
from multihost.remote.envsync import PROBE
from multihost.results.records import RunResult
from tests import fleet as loopback
from tests.clitools import cli, manifest, no_processes, spawn
from tests.cloud.fixture import bucket_for_hosts
from tests.helpers import wait_for
from tests.pyindex import Index, tinyab, uv_project

pytestmark = pytest.mark.usefixtures("fresh_runs")
HOSTS = "h0,h1,h2,h3"
N = 4
CHECK = (
    'python -c "import os, sys, tinya, tinyb; '
    "print(sys.prefix == os.environ['VIRTUAL_ENV'], tinya.X + tinyb.Y)\""
)


@pytest.fixture(autouse=True)
def _no_envs_left(ssh_fleet: loopback.Fleet) -> Iterator[None]:
    """Each test's environments (a new key per test: a new index port) go afterwards."""
    before = [set(_envs(ssh_fleet, i).glob("*")) for i in range(N)]
    yield
    for i in range(N):
        for p in set(_envs(ssh_fleet, i).glob("*")) - before[i]:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    idx = tinyab(tmp_path / "index", blob=3_000_000)
    with idx.serving():
        yield idx


def _project(root: Path, index: Index, requires: str = ">=3.9") -> Path:
    uv_project(root, index.url, requires=requires)
    index.hits.clear()
    return root


def _envs(fleet: loopback.Fleet, i: int) -> Path:
    return fleet.hosts[i].home / ".multihost" / "envs"


ZSTD = shutil.which("zstd")
FMT = "zst" if ZSTD else "gz"  # the pack's format when every host has what this machine has
_ACL = "system.posix_acl_access"


def _packs(envs: Path, key: str) -> list[str]:
    """The packs of ``key`` kept in ``envs`` (each with its sha256 beside it)."""
    names = {p.name for p in envs.glob(f"{key}.tar.*")}
    packs = sorted(n for n in names if not n.endswith(".sha256"))
    assert names == {*packs, *(f"{n}.sha256" for n in packs)}, names
    return packs


@contextlib.contextmanager
def _without_zstd(fleet: loopback.Fleet, *indices: int) -> Iterator[None]:
    """The hosts ``indices`` have no zstd they can run: their users (who share this machine's
    programs) are denied it by an ACL on the program itself, restored afterwards."""
    if ZSTD is None:
        pytest.skip("no zstd on this machine")
    path = os.path.realpath(ZSTD)
    mode = os.stat(path).st_mode
    anyone = 0xFFFFFFFF
    uids = sorted(pwd.getpwnam(fleet.hosts[i].user).pw_uid for i in indices)
    entries = [
        (0x01, mode >> 6 & 7, anyone),
        *((0x02, 0, uid) for uid in uids),
        (0x04, mode >> 3 & 7, anyone),
        (0x10, mode >> 3 & 7, anyone),
        (0x20, mode & 7, anyone),
    ]
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        before: bytes | None = os.getxattr(path, _ACL)
    except OSError:
        before = None
    try:
        os.setxattr(path, _ACL, acl)
    except OSError as exc:
        pytest.skip(f"cannot deny zstd to a user here (an ACL on {path}): {exc}")
    try:
        yield
    finally:
        if before is None:
            os.removexattr(path, _ACL)
        else:
            os.setxattr(path, _ACL, before)


def _keys(fleet: loopback.Fleet, i: int) -> set[str]:
    d = _envs(fleet, i)
    return (
        {p.name for p in d.iterdir() if p.is_dir() and len(p.name) == 32} if d.is_dir() else set()
    )


def _run(
    fleet: loopback.Fleet, proj: Path, tmp_path: Path, cmd: str = CHECK, **kw: Any
) -> tuple[RunResult, list[str], list[str]]:
    lines: list[str] = []
    notes: list[str] = []
    res = multihost.run(
        cmd,
        hosts=HOSTS,
        ssh_config=fleet.ssh_config,
        script_dir=proj,
        log_dir=tmp_path / "logs",
        stream="all",
        on_output=lambda h, ln: lines.append(ln),
        on_event=lambda e: notes.append(e.text) if isinstance(e, Note) else None,
        **kw,
    )
    return res, lines, notes


def _warm_check(fleet: loopback.Fleet, i: int, key: str, probe: str) -> str:
    """Host ``i``'s PROBE over ssh, as the run of ``key`` asked it (its lock and the runner's
    uv, from the check's cache there) but with ``probe`` for env_probe.py: the key it says
    present (the check fails if it had to start ``probe``)."""
    caches = _envs(fleet, i).glob(".probe-*")
    (cache,) = [c for c in caches if f"key={key} " in c.read_text()]
    ruv = cache.read_text().splitlines()[1].split("|", 1)[0]
    kit = fleet.hosts[i].home / ".probe-kit"  # env_probe.py there is ``probe``
    kit.mkdir(exist_ok=True)
    (kit / "env_probe.py").write_text(probe)
    command = script(
        PROBE,
        paths={"b": "~/.multihost", "r": "~/.multihost/runs/none", "k": "~/.probe-kit"},
        lock=cache.name.removeprefix(".probe-"),
        ruv=ruv,
    )
    out = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config), fleet.hosts[i].alias, command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    shutil.rmtree(kit)
    assert out.returncode == 0, out
    words = dict(w.split("=", 1) for w in out.stdout.split())
    assert words["state"] == "present", words
    return words["key"]


def _repair(
    fleet: loopback.Fleet, i: int, key: str, proj: Path, tmp_path: Path, index: Index, **kw: Any
) -> list[str]:
    """Host ``i``'s environment damaged (its blob deleted), then a run: repaired in it from a
    host that has it, not from the index; the run's notes."""
    blob = next((_envs(fleet, i) / key).rglob("blob.bin"))
    blob.unlink()
    index.hits.clear()
    res, lines, notes = _run(fleet, proj, tmp_path, **kw)
    assert res.ok, res
    assert lines == ["True 3"] * N
    assert not index.hits
    assert "installed on 1 host(s) (1 repaired)" in _said(notes)
    assert blob.stat().st_size == 3_000_000
    return notes


def _said(notes: list[str]) -> str:
    return next(n for n in notes if n.startswith("environment from uv.lock"))


def test_cold_warm_damaged_no_sync(ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj", index)
    before = [_keys(ssh_fleet, i) for i in range(N)]
    res, lines, notes = _run(ssh_fleet, proj, tmp_path)
    assert res.ok, res
    assert lines == ["True 3"] * N
    # one host talked to the index: each file once in all
    downloads = {p: n for p, n in index.hits.items() if p.startswith("/files/")}
    assert downloads == dict.fromkeys(index.files(), 1)
    new = [_keys(ssh_fleet, i) - before[i] for i in range(N)]
    assert all(len(k) == 1 and k == new[0] for k in new), new
    key = next(iter(new[0]))
    assert "; built on s0/w0 (" in _said(notes)
    assert f"installed on {N - 1} host(s)" in _said(notes)
    assert "gzip" not in _said(notes)
    assert all(_packs(_envs(ssh_fleet, i), key) == [f"{key}.tar.{FMT}"] for i in range(N))

    # warm: nothing downloaded, nothing built, nothing sent
    index.hits.clear()
    res, lines, notes = _run(ssh_fleet, proj, tmp_path)
    assert res.ok
    assert lines == ["True 3"] * N
    assert not index.hits
    assert _said(notes).endswith(f"present on {N} host(s)")
    for i in range(N):  # the warm check there starts no Python: it answers with a failing one
        assert _warm_check(ssh_fleet, i, key, probe="import sys; sys.exit(7)") == key

    # damaged on one host (a file deleted): repaired from another host, not from the index
    _repair(ssh_fleet, 2, key, proj, tmp_path, index)

    # --no-sync: the host's own python3, no VIRTUAL_ENV
    res, lines, notes = _run(
        ssh_fleet, proj, tmp_path, cmd="echo ${VIRTUAL_ENV:-none}", no_sync=True
    )
    assert res.ok
    assert lines == ["none"] * N
    assert not any(n.startswith("environment") for n in notes)
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


def test_stale_lock_refused(ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj", index)
    text = (proj / "pyproject.toml").read_text()
    (proj / "pyproject.toml").write_text(text.replace('["tinya"]', '["tinya", "tinyb"]'))
    with pytest.raises(UsageError, match=r"out of date .* run `uv lock`"):
        _run(ssh_fleet, proj, tmp_path)
    assert not index.hits
    assert not (tmp_path / "logs").exists()


def test_python_too_old(ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path) -> None:
    host = subprocess.run(
        ["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mine = subprocess.run(
        ["python3", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if tuple(map(int, mine.split("."))) <= tuple(map(int, host.split("."))):
        pytest.skip("needs a runner Python newer than the hosts'")
    proj = _project(tmp_path / "proj", index, requires=f">={mine}")
    with pytest.raises(UsageError, match=rf"h0\): Python {host} .*requires-python >={mine}"):
        _run(ssh_fleet, proj, tmp_path)
    assert not index.hits
    for i in range(N):
        assert not (ssh_fleet.hosts[i].home / ".multihost" / "runs").exists() or not any(
            (ssh_fleet.hosts[i].home / ".multihost" / "runs").iterdir()
        )


def test_failing_build(ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj", index)
    index.down = True  # every file gone from the index: uv on the builder fails
    res, lines, _ = _run(ssh_fleet, proj, tmp_path, cmd="echo started")
    assert not res.ok
    assert lines == []
    errors = [h.error or "" for h in res.hosts]
    built = [e for e in errors if "environment build failed" in e]
    assert len(built) == 1
    assert "404" in built[0], built[0]
    assert all(h.exit_code is None for h in res.hosts)
    for i in range(N):
        runs = ssh_fleet.hosts[i].home / ".multihost" / "runs"
        assert not runs.exists() or not any(runs.iterdir())
        assert not list(_envs(ssh_fleet, i).glob(".build.*"))
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")
    shutil.rmtree(tmp_path / "logs", ignore_errors=True)


@pytest.mark.parametrize("via", ["direct", "peer"])
def test_a_host_lost_while_the_environment_is_built(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path, via: str
) -> None:
    """h2's sshd (and its sessions) stopped while the builder waits on the index: h2 is named
    lost (whether the runner or the builder was to send it the pack), the run exits 1, nothing
    started, nothing left on the others."""
    proj = _project(tmp_path / "proj", index)
    logs = tmp_path / "logs"
    index.hold = threading.Event()
    proc = spawn(
        [
            "run",
            "--hosts",
            HOSTS,
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(proj),
            "--log-dir",
            str(logs),
            "--run-name",
            "lost",
            "--stage-via",
            via,
            "--cmd",
            "echo started",
        ]
    )
    try:
        wait_for(lambda: index.downloads() > 0, 60, "the builder to ask the index for a wheel")
        ssh_fleet.stop_host(2)
    finally:
        index.hold.set()
        out, err = proc.communicate(timeout=120)
        ssh_fleet.start_host(2)
    assert proc.returncode == 1, err
    assert "started" not in out
    hosts = manifest(logs, "lost")["hosts"]
    assert [h["exit_code"] for h in hosts] == [None] * N
    assert "connection lost" in (hosts[2]["error"] or ""), hosts[2]  # as any lost host
    assert not any("connection lost" in (h["error"] or "") for i, h in enumerate(hosts) if i != 2)
    assert "s0/w2" in err
    for i in (0, 1, 3):
        runs = ssh_fleet.hosts[i].home / ".multihost" / "runs"
        assert not runs.exists() or not any(runs.iterdir()), f"h{i}"
    wait_for(
        lambda: not any(ssh_fleet.user_processes(i) for i in (0, 1, 3)),
        10,
        "the other hosts' processes to end",
    )


@pytest.mark.parametrize("fmt", [FMT, "gz"] if FMT == "zst" else ["gz"])
def test_an_altered_pack_is_not_handed_on(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path, fmt: str
) -> None:
    """h0 holds the environment and its pack; the pack is altered there (same size). The run
    that needs it on the others packs it again from the environment, says so naming h0, and
    no host gets the altered bytes. A zstd pack (every host has zstd), or gzip (h0 has none)."""
    proj = _project(tmp_path / "proj", index)
    before = _keys(ssh_fleet, 0)
    hidden = _without_zstd(ssh_fleet, 0) if fmt != FMT else contextlib.nullcontext()
    with hidden:
        first = multihost.run(
            "true",
            hosts="h0",
            ssh_config=ssh_fleet.ssh_config,
            script_dir=proj,
            log_dir=tmp_path / "logs",
            stream="none",
        )
        assert first.ok, first
        (key,) = _keys(ssh_fleet, 0) - before
        pack = _envs(ssh_fleet, 0) / f"{key}.tar.{fmt}"
        data = bytearray(pack.read_bytes())
        data[len(data) // 2] ^= 0xFF
        pack.write_bytes(bytes(data))
        index.hits.clear()
        res, lines, notes = _run(ssh_fleet, proj, tmp_path)
    assert res.ok, res
    assert lines == ["True 3"] * N
    assert not index.hits
    warned = [n for n in notes if n.startswith("s0/w0: its kept pack's sha256 is ")]
    assert len(warned) == 1, notes
    assert "the altered pack was not handed on" in warned[0]
    assert f"installed on {N - 1} host(s)" in _said(notes)
    for i in range(1, N):
        assert (_envs(ssh_fleet, i) / f"{key}.tar.{fmt}").read_bytes() == pack.read_bytes()
        assert _packs(_envs(ssh_fleet, i), key) == [pack.name]
    assert pack.read_bytes() != bytes(data)


@pytest.mark.parametrize("via", ["direct", "peer"])
def test_a_host_without_zstd_gets_gzip_then_zstd_replaces_it(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path, via: str
) -> None:
    """h2 cannot run zstd: the cold run packs with gzip and says why, every host keeps that
    pack and the environment works. h2 can again and its environment is damaged: h0 packs it
    with zstd now (its gzip pack goes) and h2 takes that; h1 and h3 keep theirs."""
    if ZSTD is None:
        pytest.skip("no zstd on this machine")
    proj = _project(tmp_path / "proj", index)
    before = _keys(ssh_fleet, 0)
    with _without_zstd(ssh_fleet, 2):
        res, lines, notes = _run(ssh_fleet, proj, tmp_path, stage_via=via)
    assert res.ok, res
    assert lines == ["True 3"] * N
    said = _said(notes)
    assert f"installed on {N - 1} host(s)" in said
    assert "; packed with gzip: no zstd on s0/w2" in said, said
    (key,) = _keys(ssh_fleet, 0) - before
    assert all(_packs(_envs(ssh_fleet, i), key) == [f"{key}.tar.gz"] for i in range(N))
    assert "gzip" not in _said(_repair(ssh_fleet, 2, key, proj, tmp_path, index, stage_via=via))
    packs = [_packs(_envs(ssh_fleet, i), key) for i in range(N)]
    assert packs == [[f"{key}.tar.zst"], [f"{key}.tar.gz"], [f"{key}.tar.zst"], [f"{key}.tar.gz"]]
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


def test_sweep_trials_share_one_build(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    proj = _project(tmp_path / "proj", index)
    (proj / "main.py").write_text(
        "import json, os, sys, tinya, tinyb\n"
        "print('MULTIHOST_RESULT ' + json.dumps({'x': int(sys.argv[1]) * tinyb.Y, "
        "'inside': sys.prefix == os.environ['VIRTUAL_ENV']}))\n"
    )
    notes: list[str] = []
    res = multihost.run_sweep(
        "python main.py {n}",
        {"n": [1, 2]},
        metric="x",
        hosts=HOSTS,
        ssh_config=ssh_fleet.ssh_config,
        script_dir=proj,
        log_dir=tmp_path / "logs",
        on_record=lambda _r: None,
        on_event=lambda e: notes.append(e.text) if isinstance(e, Note) else None,
    )
    assert res.ok, res
    assert [(r.result["x"], r.result["inside"]) for r in res.records] == [(2, True), (4, True)]
    downloads = {p: n for p, n in index.hits.items() if p.startswith("/files/")}
    assert downloads == dict.fromkeys(index.files(), 1)  # one build for the whole sweep
    said = [n for n in notes if n.startswith("environment from uv.lock")]
    assert "; built on s0/w0 (" in said[0]
    assert said[1].endswith(f"present on {N} host(s)")
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


# -- --setup CMD -------------------------------------------------------------------------------
def test_setup_runs_once_then_skips_then_reruns(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path
) -> None:
    mark = f"setup-{tmp_path.name}-{os.getpid()}"
    setup = f'echo "set up $MULTIHOST_TEST_HOST"; echo x >> "$HOME/{mark}"'

    def counts() -> list[int]:
        files = [ssh_fleet.hosts[i].home / mark for i in range(N)]
        return [len(f.read_text().splitlines()) if f.exists() else 0 for f in files]

    try:
        res, lines, notes = _run(ssh_fleet, code, tmp_path, cmd="cat x.txt", setup=setup)
        assert res.ok
        assert lines == ["staged"] * N
        assert counts() == [1] * N
        assert f"setup: ran on {N} host(s)" in notes
        log = next((tmp_path / "logs").glob(f"*/{res.hosts[1].host.file_stem}.setup.log"))
        assert log.read_text() == "set up h1\n"
        res, _, notes = _run(ssh_fleet, code, tmp_path, cmd="true", setup=setup)
        assert res.ok
        assert counts() == [1] * N
        assert any(n.startswith(f"setup: skipped on all {N} host(s)") for n in notes)
        res, _, _ = _run(ssh_fleet, code, tmp_path, cmd="true", setup=setup + " # changed")
        assert counts() == [2] * N
        (code / "setup.sh").write_text("echo new\n")  # new code: runs again
        res, _, _ = _run(ssh_fleet, code, tmp_path, cmd="true", setup=setup)
        assert res.ok
        assert counts() == [3] * N
    finally:
        for i in range(N):
            (ssh_fleet.hosts[i].home / mark).unlink(missing_ok=True)


def test_failing_setup_starts_nothing(
    ssh_fleet: loopback.Fleet, code: Path, tmp_path: Path
) -> None:
    setup = '[ "$MULTIHOST_TEST_HOST" != h2 ] || { echo step one; echo broken thing; exit 3; }'
    res, lines, _ = _run(ssh_fleet, code, tmp_path, cmd="echo started", setup=setup)
    assert not res.ok
    assert lines == []
    failed = [h for h in res.hosts if h.error and "setup failed" in h.error]
    assert [h.host.name for h in failed] == ["s0/w2"]
    assert "setup failed (exit 3): step one | broken thing" in (failed[0].error or "")
    assert all(h.exit_code is None for h in res.hosts)
    for i in range(N):
        runs = ssh_fleet.hosts[i].home / ".multihost" / "runs"
        assert not runs.exists() or not any(runs.iterdir())
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


def test_peer_the_builder_serves_the_others(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    proj = _project(tmp_path / "proj", index)
    before = _keys(ssh_fleet, 0)
    res, lines, notes = _run(ssh_fleet, proj, tmp_path, stage_via="peer")
    assert res.ok, res
    assert lines == ["True 3"] * N
    assert index.downloads() == len(index.files())
    said = _said(notes)
    assert f"installed on {N - 1} host(s)" in said
    # the pack went host to host: the runner sent at most uv (to a builder without one)
    uv = uv_binary()
    assert uv is not None
    shipped = f"the runner sent {os.path.getsize(uv) / (1 << 20):.1f} MiB"
    assert "the runner sent" not in said or said.endswith(shipped), said
    (key,) = _keys(ssh_fleet, 0) - before
    assert all(_packs(_envs(ssh_fleet, i), key) == [f"{key}.tar.{FMT}"] for i in range(N))
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end (the seed's server)")


def test_peer_never_serves_an_environment_on_a_public_address(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    """Forced peer, the builder's internal address shared (100.64.0.1, never connected to):
    it serves nothing, the runner carries the pack, and the run says why."""
    proj = _project(tmp_path / "proj", index)
    inv = tmp_path / "fleet.toml"
    inv.write_text(
        '[[slices]]\nhosts = [{ address = "h0", internal_address = "100.64.0.1" }, '
        '"h1", "h2", "h3"]\n'
    )
    seed_dir = ssh_fleet.hosts[0].home / ".multihost" / "seed"
    touched = seed_dir.stat().st_mtime_ns if seed_dir.is_dir() else None
    notes: list[tuple[str, str]] = []
    res = multihost.run(
        CHECK,
        hosts=str(inv),
        ssh_config=ssh_fleet.ssh_config,
        script_dir=proj,
        log_dir=tmp_path / "logs",
        stream="none",
        stage_via="peer",
        on_event=lambda e: notes.append((e.level, e.text)) if isinstance(e, Note) else None,
    )
    assert res.ok, res
    said = (
        "s0/w0: its internal address 100.64.0.1 is not private, so it serves no "
        "environment there: the runner sends it"
    )
    assert ("warning", said) in notes
    env = _said([t for _, t in notes])
    assert f"installed on {N - 1} host(s)" in env
    assert "the runner sent" in env  # the pack went through the runner
    assert (seed_dir.stat().st_mtime_ns if seed_dir.is_dir() else None) == touched
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


# -- --requirements FILE (a project without uv.lock) -------------------------------------------
def test_requirements_cold_once_then_warm(
    ssh_fleet: loopback.Fleet, index: Index, code: Path, tmp_path: Path
) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text(f"--index-url {index.url}\ntinya==1.0\ntinyb==2.0\n")
    before = [_keys(ssh_fleet, i) for i in range(N)]
    res, lines, notes = _run(ssh_fleet, code, tmp_path, requirements=req)
    assert res.ok, res
    assert lines == ["True 3"] * N
    downloads = {p: n for p, n in index.hits.items() if p.startswith("/files/")}
    assert downloads == dict.fromkeys(index.files(), 1)  # one host talked to the index
    said = next(n for n in notes if n.startswith("environment from requirements.txt"))
    assert "; built on s0/w0 (" in said
    assert f"installed on {N - 1} host(s)" in said
    new = [_keys(ssh_fleet, i) - before[i] for i in range(N)]
    assert all(len(k) == 1 and k == new[0] for k in new), new
    index.hits.clear()
    res, lines, notes = _run(ssh_fleet, code, tmp_path, requirements=req)
    assert res.ok
    assert lines == ["True 3"] * N
    assert not index.hits
    said = next(n for n in notes if n.startswith("environment from requirements.txt"))
    assert said.endswith(f"present on {N} host(s)")
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


# -- --stage-via gs://BUCKET (the bucket way) --------------------------------------------------
@pytest.mark.parametrize("how", ["forced", "auto"])
def test_bucket_the_builder_uploads_once_the_others_download(
    ssh_fleet: loopback.Fleet,
    index: Index,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The builder puts the pack in the bucket under its content name, once; every other host
    takes it from there (sha256-checked); the runner sends no pack bytes; one host talked to
    the index. Forced (``--stage-via gs://``) or chosen by auto (``--stage-bucket``, over the
    threshold)."""
    with bucket_for_hosts(ssh_fleet.hosts[:N], tmp_path, "mh-env") as (gcs, env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        proj = _project(tmp_path / "proj", index)
        if how == "forced":
            kw: dict[str, Any] = {"stage_via": "gs://mh-env/pre"}
        else:
            monkeypatch.setenv("MULTIHOST_STAGE_AUTO_THRESHOLD", "1")
            kw = {"stage_bucket": "gs://mh-env/pre"}
        before = _keys(ssh_fleet, 0)
        res, lines, notes = _run(ssh_fleet, proj, tmp_path, **kw)
        assert res.ok, res
        assert lines == ["True 3"] * N
        assert index.downloads() == len(index.files())  # each file once, from the builder
        said = _said(notes)
        assert "; built on s0/w0 (" in said
        assert f"installed on {N - 1} host(s)" in said
        assert "; uploaded once to gs://mh-env/pre" in said
        if ZSTD:  # every host has zstd, but a bucket's pack is gzip
            assert "; packed with gzip: the pack may go through a bucket" in said, said
        if how == "auto":
            assert "via gs://mh-env/pre (auto: 4 hosts ×" in said
        uv = uv_binary()
        assert uv is not None  # the runner sent at most uv (to a builder without one)
        shipped = f"the runner sent {os.path.getsize(uv) / (1 << 20):.1f} MiB"
        assert "the runner sent" not in said or said.endswith(shipped), said
        (key,) = _keys(ssh_fleet, 0) - before
        packs = gcs.objects("mh-env", f"pre/multihost/envs/{key}/")
        assert len(packs) == 1, packs
        (name,) = packs
        data = (_envs(ssh_fleet, 0) / f"{key}.tar.gz").read_bytes()
        assert name.endswith(f"/{hashlib.sha256(data).hexdigest()}.tar.gz")
        for i in range(1, N):  # each host has the very pack, unpacked
            assert (_envs(ssh_fleet, i) / f"{key}.tar.gz").read_bytes() == data
            assert (_envs(ssh_fleet, i) / key / ".multihost-complete").exists()
        # one host damaged: repaired from a host that has it, the object already there
        notes = _repair(ssh_fleet, 3, key, proj, tmp_path, index, **kw)
        assert "uploaded" not in _said(notes)
        assert any("is already in gs://mh-env/pre: nothing to upload" in n for n in notes)
        assert len(gcs.objects("mh-env", f"pre/multihost/envs/{key}/")) == 1
        if how == "forced":  # hosts that have nothing (another base): found in the bucket
            fresh = "~/.multihost-envjob"
            try:
                res, lines, notes = _run(ssh_fleet, proj, tmp_path, remote_dir=fresh, **kw)
                assert res.ok, res
                assert lines == ["True 3"] * N
                assert not index.hits
                said = _said(notes)
                assert "built on" not in said
                assert f"installed on {N} host(s)" in said
                assert any(f"environment {key[:12]} found in gs://mh-env/pre" in n for n in notes)
            finally:
                for h in ssh_fleet.hosts[:N]:
                    shutil.rmtree(h.home / ".multihost-envjob", ignore_errors=True)


# -- what hosts hold, and clean ----------------------------------------------------------------
def _on_disk(env: Path) -> int:
    return sum(f.stat().st_size for f in env.rglob("*") if f.is_file() and not f.is_symlink())


def test_envs_lists_and_clean_removes_the_unused_keeps_the_running(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    base = ".multihost-envtest"  # its own base on the hosts: clean touches nothing else there
    first = _project(tmp_path / "first", index)
    second = uv_project(tmp_path / "second", index.url, ["tinyb"])
    homes = [ssh_fleet.hosts[i].home / base for i in range(N)]

    def keys(i: int) -> set[str]:
        d = homes[i] / "envs"
        return {p.name for p in d.iterdir() if p.is_dir() and len(p.name) == 32}

    reach = [
        "--hosts",
        HOSTS,
        "--ssh-config",
        str(ssh_fleet.ssh_config),
        "--remote-dir",
        f"~/{base}",
    ]
    try:
        res, _, _ = _run(
            ssh_fleet, first, tmp_path, cmd="true", run_name="old", remote_dir=f"~/{base}"
        )
        assert res.ok, res
        (old_key,) = keys(0)
        started = cli(
            [
                "run",
                *reach,
                "--script-dir",
                str(second),
                "--log-dir",
                str(logs),
                "--run-name",
                "live",
                "--detach",
                "--cmd",
                "sleep 300",
            ]
        )
        assert started.returncode == 0, started.stderr
        (live_key,) = keys(0) - {old_key}
        listed = cli(["envs", *reach, "--json"])
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        for i in range(N):
            mine = {r["key"]: r for r in rows if r["host"] == f"s0/w{i}"}
            held = homes[i] / "envs"
            assert {old_key, live_key} <= set(mine)
            for key, run, running in ((old_key, "old", []), (live_key, "live", ["live"])):
                assert mine[key]["state"] == "complete"
                assert mine[key]["runs"] == [run]
                assert mine[key]["running"] == running
                assert mine[key]["size"] == _on_disk(held / key)
                (pack,) = _packs(held, key)
                assert mine[key]["packed"] == (held / pack).stat().st_size
        clean = ["clean", "--older-than", "0s", "--log-dir", str(tmp_path / "logs")]
        dry = cli([*clean, "--dry-run"])
        assert dry.returncode == 0, dry.stderr
        assert f"and environment {old_key[:12]} (" in dry.stdout, dry.stdout
        assert f"on {N} host(s): no remaining run uses it" in dry.stdout
        assert live_key[:12] not in dry.stdout
        assert all(old_key in keys(i) for i in range(N))
        done = cli(clean)
        assert done.returncode == 0, done.stderr
        assert "removed old" in done.stdout
        assert "and 1 environment(s) no remaining run on those hosts uses" in done.stdout
        for i in range(N):
            envs = homes[i] / "envs"
            assert not any(p.name.startswith(old_key) for p in envs.iterdir())
            assert (envs / live_key / ".multihost-complete").exists()
    finally:
        cli(["kill", "live", "--log-dir", str(logs)])
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


# -- a builder without uv whose platform the runner's uv does not fit --------------------------
def test_builder_fetches_uv_with_its_own_pip(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    """``--host-uv fetch`` (what auto does when the runner's uv does not fit the host): the
    builder fetches uv==the runner's version with its own pip from the index its pip.conf
    names (here the test index, serving a wheel of the real uv binary); the other hosts only
    unpack the pack and never get uv."""
    import platform

    uv = uv_binary()
    assert uv is not None
    version = subprocess.run(
        [uv, "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    real = Path(uv).read_bytes()
    tag = f"py3-none-manylinux_2_17_{platform.machine()}"
    wheel = index.add("uv", version, {f"uv-{version}.data/scripts/uv": real}, tag=tag)
    proj = _project(tmp_path / "proj", index)
    base = ".multihost-uvtest"  # a base of its own: no uv shipped there before
    homes = [ssh_fleet.hosts[i].home for i in range(N)]
    confs = [h / ".config" / "pip" / "pip.conf" for h in homes]
    made = [not (h / ".config").exists() for h in homes]
    try:
        for conf in confs:
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(f"[global]\nindex-url = {index.url}\n")
        res, lines, notes = _run(ssh_fleet, proj, tmp_path, host_uv="fetch", remote_dir=f"~/{base}")
        assert res.ok, res
        assert lines == ["True 3"] * N
        said = _said(notes)
        assert "; built on s0/w0 (" in said
        assert f"(uv {version} fetched there with pip)" in said, said
        # the builder's pip fetched uv once; the other hosts never asked for it
        assert index.hits[f"/files/{wheel.name}"] == 1
        downloads = {p: n for p, n in index.hits.items() if p.startswith("/files/")}
        assert downloads == dict.fromkeys(index.files(), 1)
        fetched = homes[0] / base / "bin" / "uv"
        assert fetched.read_bytes() == real
        assert all(not (h / base / "bin").exists() for h in homes[1:])
        # the runner shipped no uv: it sent the pack to the 3 others, nothing more
        sent = float(said.split("the runner sent ")[1].split(" MiB")[0]) * (1 << 20)
        assert sent < len(real)
    finally:
        for home, conf, mine in zip(homes, confs, made, strict=True):
            shutil.rmtree(home / ".config" if mine else conf.parent, ignore_errors=True)
            shutil.rmtree(home / base, ignore_errors=True)
    wait_for(lambda: no_processes(ssh_fleet, N), 10, "host processes to end")


def test_builder_without_uv_nor_a_pip_that_finds_it(
    ssh_fleet: loopback.Fleet, index: Index, tmp_path: Path
) -> None:
    """The builder's pip cannot fetch uv (its index has none): the builder's error under its
    name, nothing started anywhere, no uv left half-written."""
    proj = _project(tmp_path / "proj", index)
    base = ".multihost-uvtest"
    homes = [ssh_fleet.hosts[i].home for i in range(N)]
    conf = homes[0] / ".config" / "pip" / "pip.conf"
    made = not (homes[0] / ".config").exists()
    try:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(f"[global]\nindex-url = {index.url}\n")
        res, lines, _ = _run(
            ssh_fleet, proj, tmp_path, cmd="echo started", host_uv="fetch", remote_dir=f"~/{base}"
        )
        assert not res.ok
        assert lines == []
        error = res.hosts[0].error or ""
        assert "environment build failed: no uv on this host, and its pip could not fetch" in error
        assert not (homes[0] / base / "bin" / "uv").exists()
        assert not index.downloads()  # nothing built
    finally:
        shutil.rmtree(homes[0] / ".config" if made else conf.parent, ignore_errors=True)
        for home in homes:
            shutil.rmtree(home / base, ignore_errors=True)
