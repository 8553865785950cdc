"""The environment probe's key without json and platform: the same key as with them, so that
hosts keep their environments; and what it imports in the common case."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.errors import RunNameTaken, UsageError
from multihost.model import Host
from multihost.remote import env_probe, script
from multihost.remote.commands import Paths
from multihost.remote.envsync import PROBE
from multihost.remote.staging import python_source
from multihost.runs.launch import claim
from multihost.staging.archive import pack, stage_then
from multihost.transport import Completed
from multihost.transport.local import LocalConnection

FACTS = {
    "lock": "ab" * 32,
    "python": ["cpython", "3.11.2", "/usr/bin/python3.11"],
    "platform": ["linux", "x86_64", "glibc-2.36"],
    "uv": "0.13.9",
}


@pytest.mark.parametrize(
    "facts",
    [
        FACTS,
        {**FACTS, "uv": "", "platform": ["linux", "aarch64", "unknown"]},
        {**FACTS, "python": ["cpython", "3.13.0rc1", "/opt/py thon/bin/python3"]},
        {**FACTS, "python": ["pypy", "3.10.14", "/opt/é/python3"]},  # json escapes: json itself
        {**FACTS, "python": ["cpython", "3.12.1", 'a"b\\c\t']},
    ],
)
def test_dumps_is_sorted_json(facts: dict[str, str | list[str]]) -> None:
    assert env_probe.dumps(facts) == json.dumps(facts, sort_keys=True)


def test_host_facts_match_platform() -> None:
    assert env_probe.python_version() == platform.python_version()
    assert env_probe.libc_version() == ("-".join(platform.libc_ver()) or "unknown")


def test_probe_imports_neither_json_nor_platform_nor_subprocess(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-S",
            "-X",
            "importtime",
            "-c",
            python_source("env_probe"),
            str(tmp_path),
            "L",
            "0.13.9",
            "",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines() if "|" in ln}
    assert "hashlib" in imported
    assert not {"json", "platform", "subprocess"} & imported
    assert out.stdout.startswith("key=")


# -- the warm path: the PROBE template answers from the last probe's cache, starting no Python


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A base dir with a claimed run, and a PATH whose python3 is this interpreter itself
    (a link: the file the probe fingerprints, as on a host whose python3 is a binary)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(Path(sys.executable).resolve())
    base = tmp_path / "base"
    (base / "runs" / "r1").mkdir(parents=True)
    return base, {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}


def _command(base: Path, source: str, ruv: str) -> str:
    """The check's command, with ``source`` as the kit's env_probe.py (staged with the kit)."""
    kit = base.parent / "kit"
    kit.mkdir(exist_ok=True)
    (kit / "env_probe.py").write_text(source)
    return script(
        PROBE,
        paths={"b": str(base), "r": str(base / "runs" / "r1"), "k": str(kit)},
        lock="ab" * 32,
        ruv=ruv,
    )


def _probe(base: Path, env: dict[str, str], source: str = "", ruv: str = "0.13.9") -> str:
    command = _command(base, source or python_source("env_probe"), ruv)
    out = subprocess.run(
        ["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _words(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split())


def _complete(base: Path, key: str) -> Path:
    """An environment as BUILD leaves it: files, a link, the manifest and the marker."""
    env = base / "envs" / key
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "tool").write_text("hello")
    (env / "bin" / "alias").symlink_to("tool")
    (env / ".multihost-manifest").write_text("5 bin/tool\nl bin/alias\n")
    (env / ".multihost-complete").touch()
    return env


NO_PYTHON = "import sys; sys.exit(7)"  # a probe that fails: the warm path must not start it


def test_warm_check_starts_no_python(host: tuple[Path, dict[str, str]]) -> None:
    base, env = host
    first = _words(_probe(base, env))  # no cache yet: env_probe.py, which leaves one
    assert first["state"] == "absent"
    assert (base / "envs" / f".probe-{'ab' * 32}").stat().st_mode & 0o777 == 0o600
    key = first["key"]
    _complete(base, key)
    (base / "envs" / f"{key}.used").touch()
    os.utime(base / "envs" / f"{key}.used", (1, 1))
    (base / "runs" / "r1" / "envkey").unlink()
    (base / "envs" / key / "bin" / "__pycache__").mkdir()  # what running it adds: no damage
    (base / "envs" / key / "bin" / "__pycache__" / "x.pyc").write_bytes(b"x")
    warm = _words(_probe(base, env, NO_PYTHON))
    assert warm == {**first, "state": "present"}  # the same words: no Python ran
    assert (base / "runs" / "r1" / "envkey").read_text() == key + "\n"  # the run uses it
    assert (base / "envs" / f"{key}.used").stat().st_mtime > 1  # and its last use is now
    assert _words(_probe(base, env))["state"] == "present"  # env_probe.py agrees
    cache = base / "envs" / f".probe-{'ab' * 32}"
    cache.write_text(cache.read_text().replace("zstd=yes", "zstd=no"))
    assert _words(_probe(base, env, NO_PYTHON))["zstd"] == "yes"  # asked now, not cached


@pytest.mark.parametrize(
    "change", ["a file deleted", "a file's size", "no marker", "runner's uv", "another libc"]
)
def test_warm_check_hands_anything_else_to_the_probe(
    host: tuple[Path, dict[str, str]], change: str
) -> None:
    """Damage, or a fingerprint that is not the cached one: env_probe.py runs (the failing
    probe's exit 7 says so) and says what it finds."""
    base, env = host
    key = _words(_probe(base, env))["key"]
    envdir = _complete(base, key)
    ruv = "0.13.9"
    if change == "a file deleted":
        (envdir / "bin" / "tool").unlink()
    elif change == "a file's size":
        (envdir / "bin" / "tool").write_text("hello, world")
    elif change == "no marker":
        (envdir / ".multihost-complete").unlink()
    elif change == "another libc":  # a file of the fingerprint that is not the one it was
        cache = base / "envs" / f".probe-{'ab' * 32}"
        cache.write_text("/bin/sh\n" + cache.read_text().split("\n", 1)[1])
    else:
        ruv = "0.14.0"  # a host without uv gets another version: another key
    out = subprocess.run(
        ["sh", "-c", _command(base, NO_PYTHON, ruv)], env=env, capture_output=True, timeout=60
    )
    assert out.returncode == 7, out
    said = _words(_probe(base, env, ruv=ruv))
    if change == "another libc":  # the probe says the same key, and leaves its cache again
        assert said["key"] == key
        assert said["state"] == "present"
        assert _words(_probe(base, env, NO_PYTHON))["state"] == "present"
    elif change == "runner's uv":
        assert said["key"] != key
        assert said["state"] == "absent"
    else:
        assert said["key"] == key
        assert said["state"] == "damaged"


def test_stage_then_runs_on_the_staging_channel(tmp_path: Path) -> None:
    """What follows the staging runs once the code is there, and says its own exit status;
    a staging that fails (the run's name taken) never runs it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("pass\n")
    archive = pack(code)
    base = tmp_path / "base"
    paths = Paths(str(base), f"{base}/code/{archive.short}", f"{base}/runs/r1")
    conn = LocalConnection(Host("local0"))
    then = "echo said; echo oops >&2; exit 9"
    sent, done, _kit = asyncio.run(stage_then(conn, archive, paths, then, claim=True))
    assert sent == len(archive.data)
    assert (base / "runs" / "r1").is_dir()
    assert (done.exit_status, done.stdout, done.stderr) == (9, b"said\n", b"oops\n")
    with pytest.raises(RunNameTaken):
        asyncio.run(stage_then(conn, archive, paths, "echo never", claim=True))


def test_warm_check_asks_for_zstd_as_the_probe_does(host: tuple[Path, dict[str, str]]) -> None:
    """Whether zstd is there is asked on every warm check (not cached), as env_probe.py asks
    it: an executable file on PATH, not one without the execute bit, not a directory."""
    base, env = host
    tools = Path(env["PATH"].split(":", 1)[0])
    for tool in ("stat", "find", "awk", "flock"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    env = {**env, "PATH": str(tools)}  # no other zstd than the one made here
    key = _words(_probe(base, env))["key"]
    _complete(base, key)
    assert _words(_probe(base, env))["zstd"] == "no"
    (tools / "zstd").mkdir()
    assert _words(_probe(base, env, NO_PYTHON))["zstd"] == "no"
    (tools / "zstd").rmdir()
    (tools / "zstd").write_text("#!/bin/sh\n")
    assert _words(_probe(base, env, NO_PYTHON))["zstd"] == "no"
    (tools / "zstd").chmod(0o755)
    assert _words(_probe(base, env, NO_PYTHON))["zstd"] == "yes"
    assert _words(_probe(base, env))["zstd"] == "yes"  # env_probe.py agrees


def test_claim_then_runs_once_the_run_is_claimed(tmp_path: Path) -> None:
    """A phased run checks environments on the claim's channel: what follows the claim runs
    in the claimed directory's presence and is handed back; a taken name never runs it."""
    base = tmp_path / "base"
    paths = {0: Paths(str(base), f"{base}/code/c", f"{base}/runs/r1")}
    conns = {0: LocalConnection(Host("local0"))}
    said: dict[int, Completed] = {}
    then = f"test -d {base}/runs/r1 && echo claimed; exit 4"
    outcomes = asyncio.run(claim([Host("local0")], conns, paths, 30, lambda h: then, said))
    assert all(o.ok for o in outcomes)
    assert (said[0].exit_status, said[0].stdout) == (4, b"claimed\n")
    said.clear()
    with pytest.raises(UsageError, match="exists"):
        asyncio.run(claim([Host("local0")], conns, paths, 30, lambda h: "echo never", said))
    assert not said
