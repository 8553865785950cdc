"""What hosts hold of the locked environments and pruning the unused: the
host script run here with plain sh (no SSH), then the whole path with ``--local`` workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import multihost
from multihost.envsync.probe import Probe
from multihost.envsync.store import EnvStore, parse_store, store_command
from multihost.model import Host
from multihost.remote import sourced
from multihost.remote.commands import Paths, claim_command, kit, release_command
from multihost.remote.envsync import PROBE
from tests.clitools import cli
from tests.pyindex import Index, uv_project

HOST = Host(address="127.0.0.1", process_id=0)
DAY = 86400.0


def _sh(command: str, home: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["sh", "-c", command],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def _store(
    home: Path, mode: str = "list", age: float = 0.0, gone: tuple[str, ...] = ()
) -> EnvStore:
    res = _sh(store_command("~/.mh", mode, age, gone), home)
    assert res.returncode == 0, res.stderr
    return parse_store(HOST, res.stdout.decode())


def _env(
    envs: Path, key: str, files: dict[str, bytes], used_days_ago: float, pack: str = "tar.gz"
) -> int:
    """A complete environment (manifest, marker, archive ``KEY.<pack>`` and its sha256,
    last-use stamp); its files' bytes."""
    env = envs / key
    for name, data in files.items():
        (env / name).parent.mkdir(parents=True, exist_ok=True)
        (env / name).write_bytes(data)
    (env / ".multihost-manifest").write_text("".join(f"{len(d)} {n}\n" for n, d in files.items()))
    (env / ".multihost-complete").write_bytes(b"")
    (envs / f"{key}.{pack}").write_bytes(b"z" * 100)
    (envs / f"{key}.{pack}.sha256").write_text("0" * 64 + "\n")
    stamp = envs / f"{key}.used"
    stamp.write_bytes(b"")
    then = time.time() - used_days_ago * DAY
    os.utime(stamp, (then, then))
    return sum(f.stat().st_size for f in env.rglob("*") if f.is_file() and not f.is_symlink())


def _run_dir(runs: Path, name: str, *, key: str, via: str, finished: bool) -> None:
    d = runs / name
    d.mkdir(parents=True)
    if via == "envkey":
        (d / "envkey").write_text(key + "\n")
    else:
        (d / "job.sh").write_text(
            f"cd ~/.mh/code/c || exit 126\nexport MULTIHOST_ENV="
            f"{runs.parent}/envs/{key}\nexec sh -c true\n"
        )
    if finished:
        (d / "exit").write_text("0\n")


@pytest.fixture
def held(tmp_path: Path) -> tuple[Path, dict[str, str], dict[str, int]]:
    """~/.mh with four environments: one a finished run uses (job.sh), one a sweep point still
    preparing uses (envkey, no exit), one unused for 10 days (packed with zstd, the others with
    gzip), one unused but used an hour ago; and a build dir left by a killed build 8 days
    ago."""
    home = tmp_path / "home"
    envs, runs = home / ".mh" / "envs", home / ".mh" / "runs"
    envs.mkdir(parents=True)
    keys = {n: (n[0] * 32) for n in ("a", "b", "c", "d")}  # 32 hex characters each
    sizes = {
        "a": _env(envs, keys["a"], {"bin/python": b"x" * 10, "lib/m.py": b"y" * 1000}, 20),
        "b": _env(envs, keys["b"], {"bin/python": b"x" * 10}, 20),
        "c": _env(envs, keys["c"], {"lib/big.bin": os.urandom(5000)}, 10, "tar.zst"),
        "d": _env(envs, keys["d"], {"lib/m.py": b"d"}, 1 / 24),
    }
    _run_dir(runs, "old", key=keys["a"], via="job.sh", finished=True)
    _run_dir(runs, "sweep-1/p0", key=keys["b"], via="envkey", finished=False)
    partial = envs / ".build.Ab12Cd"
    (partial / "env").mkdir(parents=True)
    then = time.time() - 8 * DAY
    os.utime(partial, (then, then))
    return home, keys, sizes


def test_listing_says_sizes_states_last_use_and_users(
    held: tuple[Path, dict[str, str], dict[str, int]],
) -> None:
    home, keys, sizes = held
    store = _store(home)
    by_key = {e.key: e for e in store.envs}
    assert set(by_key) == {*keys.values(), ".build.Ab12Cd"}
    for name, key in keys.items():
        e = by_key[key]
        assert e.state == "complete"
        assert e.size == sizes[name]  # the environment's files, manifest and marker included
        assert e.packed == 100  # KEY.tar.gz, or KEY.tar.zst (c)
    assert by_key[keys["a"]].runs[0].run == "old"
    assert not by_key[keys["a"]].runs[0].running
    assert [(u.run, u.running) for u in by_key[keys["b"]].runs] == [("sweep-1/p0", True)]
    assert by_key[keys["c"]].runs == ()
    assert 9.9 * DAY < (by_key[keys["c"]].age or 0) < 10.1 * DAY
    assert by_key[".build.Ab12Cd"].state == "partial"
    (home / ".mh" / "envs" / keys["d"] / "lib" / "m.py").unlink()
    assert {e.key: e.state for e in _store(home).envs}[keys["d"]] == "damaged"
    assert _store(home, "list").removed == ()


def test_prune_removes_only_the_unused_and_old(
    held: tuple[Path, dict[str, str], dict[str, int]],
) -> None:
    home, keys, _ = held
    envs = home / ".mh" / "envs"
    before = sorted(p.name for p in envs.iterdir() if p.name != ".lock")
    # dry: with the finished run counted as removed its environment would go too
    dry = _store(home, "dry", 7 * DAY, gone=("old",))
    assert set(dry.removed) == {keys["a"], keys["c"], ".build.Ab12Cd"}
    assert dry.freed == sum(e.bytes for e in dry.envs if e.key in dry.removed)
    assert sorted(p.name for p in envs.iterdir() if p.name != ".lock") == before  # all kept
    for k in ("a", "c"):  # the warm check's caches (env_probe.remember), one per lock
        (envs / f".probe-{k * 64}").write_text(
            f"/lib/libc.so.6\n0.13|1.2.3.4 \nkey={keys[k]} x=y\n"
        )
    pruned = _store(home, "prune", 7 * DAY)
    assert set(pruned.removed) == {keys["c"], ".build.Ab12Cd"}
    assert not (envs / f".probe-{'c' * 64}").exists()  # its environment is gone: so is it
    assert (envs / f".probe-{'a' * 64}").exists()
    left = {p.name for p in envs.iterdir()}
    gone = {keys["c"], f"{keys['c']}.tar.zst", f"{keys['c']}.tar.zst.sha256", f"{keys['c']}.used"}
    assert not (gone | {".build.Ab12Cd"}) & left
    for k in ("a", "b", "d"):  # used by a run (finished or preparing), or used an hour ago
        assert (envs / keys[k] / ".multihost-complete").exists()
    # a partial build dir younger than a day stays whatever the age asked
    (envs / ".incoming.new").mkdir()
    assert ".incoming.new" not in _store(home, "prune", 0).removed
    assert (envs / ".incoming.new").is_dir()


def test_probe_records_the_key_in_the_run_and_release_undoes_the_claim(tmp_path: Path) -> None:
    home = tmp_path
    paths = Paths("~/.mh", "~/.mh/code/c", "~/.mh/runs/r1")
    assert _sh(claim_command(paths), home, kit().offer[1]).returncode == 0
    probe = sourced(
        PROBE,
        paths.kit,
        paths={"b": paths.base, "r": paths.run, "k": paths.kit},
        lock="L",
        ruv="0.13.9",
    )
    said = Probe.parse(HOST, _sh(probe, home).stdout.decode())
    run = home / ".mh" / "runs" / "r1"
    assert (run / "envkey").read_text() == said.key + "\n"
    store = _store(home)
    assert store.envs == ()  # not built yet: nothing held, nothing to list
    assert _sh(release_command(paths), home).returncode == 0
    assert not run.exists()  # the name is free again


# -- the whole path with a --local worker: real uv, an index served here -----------------------
@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    idx = Index(tmp_path / "index")
    idx.add("tinya", "1.0", {"tinya/__init__.py": b"X = 1\n" + b"#" * 20000})
    with idx.serving():
        yield uv_project(tmp_path / "proj", idx.url)


def test_local_envs_listing_then_clean(home: Path, project: Path) -> None:
    logs = home / "logs"
    res = multihost.run(
        "python -c 'import tinya'",
        local=1,
        script_dir=project,
        log_dir=logs,
        stream="none",
        run_name="r1",
    )
    assert res.ok, res
    listed = cli(["envs", "--local", "1", "--json"], HOME=str(home))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 1
    row = rows[0]
    env = home / ".cache" / "multihost" / "local" / "w0" / "envs" / row["key"]
    assert row["state"] == "complete"
    assert row["runs"] == ["r1"]
    assert row["running"] == []
    on_disk = sum(f.stat().st_size for f in env.rglob("*") if f.is_file() and not f.is_symlink())
    assert row["size"] == on_disk
    packs = [p for p in env.parent.glob(f"{row['key']}.tar.*") if p.suffix != ".sha256"]
    assert row["packed"] == sum(p.stat().st_size for p in packs)
    assert [p.suffix for p in packs] == [".zst" if shutil.which("zstd") else ".gz"]
    table = cli(["envs", "--local", "1"], HOME=str(home))
    assert row["key"][:12] in table.stdout
    assert "r1" in table.stdout
    # clean: the dry run says the environment would go with the run, and removes nothing
    dry = cli(["clean", "--older-than", "0s", "--log-dir", str(logs), "--dry-run"], HOME=str(home))
    assert dry.returncode == 0, dry.stderr
    assert "would remove r1" in dry.stdout
    assert f"and environment {row['key'][:12]} (" in dry.stdout
    assert env.is_dir()
    gone = cli(["clean", "--older-than", "0s", "--log-dir", str(logs)], HOME=str(home))
    assert gone.returncode == 0, gone.stderr
    assert "removed r1" in gone.stdout
    assert "and 1 environment(s) no remaining run on those hosts uses" in gone.stdout
    assert not env.exists()
    assert json.loads(cli(["envs", "--local", "1", "--json"], HOME=str(home)).stdout) == [
        {"host": "s0/w0", "address": "local0", "state": "none"}
    ]
