"""The locked environment's pure parts: requires-python, uv's selection flags, what
a code dir asks for, and the host templates run here with plain sh (no SSH)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import multihost
from multihost.envsync.probe import Probe, pack_format
from multihost.envsync.request import Selection, request, satisfies
from multihost.errors import SettingError
from multihost.events import Note
from multihost.model import Host
from multihost.remote import script
from multihost.remote.envsync import INSTALL, PACK, PROBE, SERVE
from multihost.remote.staging import SEED_STOP, python_source
from tests.clitools import cli
from tests.pyindex import Index, tinyab, uv_project


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("3.11.2", ">=3.10", True),
        ("3.11.2", ">=3.11.5", False),
        ("3.11.2", ">=3.10,<3.12", True),
        ("3.12.0", ">=3.10,<3.12", False),
        ("3.11.2", "~=3.11", True),
        ("3.11.2", "~=3.10.1", False),
        ("3.11.2", "==3.11.*", True),
        ("3.10.9", "==3.11.*", False),
        ("3.11.2", "!=3.11.2", False),
        ("3.11.2", "", True),
    ],
)
def test_requires_python(version: str, spec: str, ok: bool) -> None:
    assert satisfies(version, spec) is ok


def test_selection_flags_keep_uv_names() -> None:
    s = Selection(extras=("tpu",), all_extras=True, groups=("a", "b"), no_dev=True)
    assert s.flags() == (
        "--extra",
        "tpu",
        "--all-extras",
        "--group",
        "a",
        "--group",
        "b",
        "--no-dev",
    )


def test_what_a_code_dir_asks_for(tmp_path: Path) -> None:
    assert request(tmp_path) is None  # no pyproject.toml
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n')
    assert request(tmp_path) is None  # no uv.lock: nothing to sync
    with pytest.raises(SettingError, match="bad extra"):
        request(tmp_path, extras=("a b",))
    (tmp_path / "uv.lock").write_text("version = 1\n")
    assert request(tmp_path, sync=False) is None


def _sh(command: str, home: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["sh", "-c", command],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


ZSTD = pytest.mark.skipif(shutil.which("zstd", path="/usr/bin:/bin") is None, reason="no zstd")
FORMATS = ["gz", pytest.param("zst", marks=ZSTD)]


def _packed_env(fmt: str = "gz") -> bytes:
    """A packed environment (bin/x: abc) in ``fmt``: gzip, or zstd by the zstd program."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz" if fmt == "gz" else "w") as tar:
        for name, data in (
            (".multihost-manifest", b"3 bin/x\n"),
            ("bin/x", b"abc"),
            (".multihost-complete", b""),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if fmt == "gz":
        return raw.getvalue()
    return subprocess.run(
        ["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True, check=True
    ).stdout


@pytest.mark.parametrize("fmt", FORMATS)
def test_install_checks_sha256_then_pack_hands_it_on(tmp_path: Path, fmt: str) -> None:
    data = _packed_env(fmt)
    digest = hashlib.sha256(data).hexdigest()
    key = "k" * 32
    bad = _sh(
        script(
            INSTALL,
            paths={"b": "~/.mh"},
            key=key,
            fmt=fmt,
            digest="0" * 64,
            how="stdin",
            url="",
            fetch="",
            timeout=0,
        ),
        tmp_path,
        data,
    )
    assert bad.returncode == 3
    assert b"sha256 mismatch" in bad.stderr
    assert not (tmp_path / ".mh" / "envs" / key).exists()
    assert not list((tmp_path / ".mh" / "envs").glob(".incoming.*"))
    good = _sh(
        script(
            INSTALL,
            paths={"b": "~/.mh"},
            key=key,
            fmt=fmt,
            digest=digest,
            how="stdin",
            url="",
            fetch="",
            timeout=0,
        ),
        tmp_path,
        data,
    )
    assert good.returncode == 0, good.stderr
    assert good.stdout.split() == [b"absent", b"installed"]
    assert (tmp_path / ".mh" / "envs" / key / "bin" / "x").read_bytes() == b"abc"
    envs = tmp_path / ".mh" / "envs"
    assert (envs / f"{key}.tar.{fmt}").read_bytes() == data
    assert (envs / f"{key}.tar.{fmt}.sha256").read_text() == digest + "\n"
    # the kept archive is what a later PACK hands on, unchanged
    packed = _sh(script(PACK, paths={"b": "~/.mh"}, key=key, fmt=fmt), tmp_path)
    assert packed.stdout.split() == [b"packed", str(len(data)).encode(), digest.encode()]


@ZSTD
@pytest.mark.parametrize(("first", "then"), [("gz", "zst"), ("zst", "gz")])
def test_a_pack_of_the_other_format_is_replaced(tmp_path: Path, first: str, then: str) -> None:
    """A host keeping a pack in one format asked for the other packs the environment again in
    that one and keeps only it; the new pack installs on a host that reads it."""
    key = "k" * 32
    assert _install(tmp_path / "a", key, _packed_env(first), first).returncode == 0
    envs = tmp_path / "a" / ".mh" / "envs"
    packed = _sh(script(PACK, paths={"b": "~/.mh"}, key=key, fmt=then), tmp_path / "a")
    assert packed.returncode == 0, packed.stderr
    word, size, digest = packed.stdout.decode().split()
    pack = envs / f"{key}.tar.{then}"
    assert (word, int(size)) == ("packed", pack.stat().st_size)
    assert digest == hashlib.sha256(pack.read_bytes()).hexdigest()
    assert (envs / f"{key}.tar.{then}.sha256").read_text() == digest + "\n"
    assert sorted(p.name for p in envs.glob(f"{key}.tar.*")) == [pack.name, pack.name + ".sha256"]
    got = _install(tmp_path / "b", key, pack.read_bytes(), then)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "b" / ".mh" / "envs" / key / "bin" / "x").read_bytes() == b"abc"
    # and back: the host taking the first format again keeps only that one
    assert _install(tmp_path / "b", key, _packed_env(first), first).returncode == 0
    held = tmp_path / "b" / ".mh" / "envs"
    assert sorted(p.name for p in held.glob(f"{key}.tar.*")) == [
        f"{key}.tar.{first}",
        f"{key}.tar.{first}.sha256",
    ]


def _install(
    home: Path, key: str, data: bytes, fmt: str = "gz"
) -> subprocess.CompletedProcess[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    command = script(
        INSTALL,
        paths={"b": "~/.mh"},
        key=key,
        fmt=fmt,
        digest=hashlib.sha256(data).hexdigest(),
        how="stdin",
        url="",
        fetch="",
        timeout=0,
    )
    return _sh(command, home, data)


def _altered(path: Path) -> None:
    """Flip the bytes in the middle of ``path``, keeping its size (a manifest would not see)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_altered_kept_pack_is_packed_again(tmp_path: Path, fmt: str) -> None:
    data = _packed_env(fmt)
    key = "k" * 32
    assert _install(tmp_path, key, data, fmt).returncode == 0
    kept = tmp_path / ".mh" / "envs" / f"{key}.tar.{fmt}"
    assert (kept.parent / f"{key}.tar.{fmt}.sha256").read_text().strip() == hashlib.sha256(
        data
    ).hexdigest()
    _altered(kept)
    packed = _sh(script(PACK, paths={"b": "~/.mh"}, key=key, fmt=fmt), tmp_path)
    assert packed.returncode == 0, packed.stderr
    first, last = packed.stdout.decode().splitlines()
    bad = hashlib.sha256(kept.read_bytes()).hexdigest()  # the new pack's
    assert first.startswith("repacked: its kept pack's sha256 is ")
    assert f"not the {hashlib.sha256(data).hexdigest()} it was packed with" in first
    assert last == f"packed {kept.stat().st_size} {bad}"
    other = tmp_path / "other"  # packed again from the environment itself: it installs
    assert _install(other, key, kept.read_bytes(), fmt).returncode == 0
    assert (other / ".mh" / "envs" / key / "bin" / "x").read_bytes() == b"abc"
    again = _sh(script(PACK, paths={"b": "~/.mh"}, key=key, fmt=fmt), tmp_path)
    assert again.stdout.decode().splitlines() == [last]  # consistent now: handed on as is


def test_a_seed_serving_a_tampered_pack_is_refused(tmp_path: Path) -> None:
    """The real SERVE (an environment's seed) and INSTALL --peer (seed_fetch.py): bytes that
    are not the pack's sha256 are refused by the fetching host, nothing unpacked."""
    from multihost.remote.envsync import SERVE
    from multihost.remote.staging import SEED_STOP

    data = _packed_env()
    digest = hashlib.sha256(data).hexdigest()
    key = "k" * 32
    seed, host = tmp_path / "seed", tmp_path / "host"
    seed.mkdir()
    host.mkdir()
    assert _install(seed, key, data).returncode == 0
    token = b"t0ken\n"
    served = _sh(
        script(
            SERVE,
            paths={"b": "~/.mh"},
            key=key,
            fmt="gz",
            serve=python_source("seed_serve"),
            addr="127.0.0.1",
            lifetime="30",
            fetches=1,
            name=f"/{digest}.tar.gz",
        ),
        seed,
        token,
    )
    word, port, pid, folder = served.stdout.decode().split()
    assert word == "serving", served
    try:
        _altered(Path(folder) / "archive")  # on the seed, after the runner read its digest
        tampered = hashlib.sha256((Path(folder) / "archive").read_bytes()).hexdigest()
        url = f"http://127.0.0.1:{port}/{digest}.tar.gz"
        got = _sh(
            script(
                INSTALL,
                paths={"b": "~/.mh"},
                key=key,
                fmt="gz",
                digest=digest,
                how="peer",
                url=url,
                fetch=python_source("seed_fetch"),
                timeout=10,
            ),
            host,
            token,
        )
        assert got.returncode == 3, got
        assert f"sha256 mismatch ({tampered}, expected {digest})" in got.stderr.decode()
        assert not (host / ".mh" / "envs" / key).exists()
        assert not list((host / ".mh" / "envs").glob(".incoming.*"))
    finally:
        _sh(script(SEED_STOP, p=pid, s=folder), seed)


def _check(home: Path) -> str:
    """The environment's check as a run sends it, env_probe.py in a kit folder in ``home``."""
    kit = home / "kit"
    kit.mkdir()
    (kit / "env_probe.py").write_text(python_source("env_probe"))
    return script(PROBE, paths={"b": "~/.mh", "k": str(kit)}, r="", lock="L", ruv="0.13.9")


def test_probe_reports_key_and_state(tmp_path: Path) -> None:
    host = Host(address="127.0.0.1", process_id=0)
    probe = _check(tmp_path)
    first = Probe.parse(host, _sh(probe, tmp_path).stdout.decode())
    assert first.state == "absent"
    env = tmp_path / ".mh" / "envs" / first.key
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "x").write_bytes(b"abc")
    (env / ".multihost-manifest").write_text("3 bin/x\n")
    assert Probe.parse(host, _sh(probe, tmp_path).stdout.decode()).state == "damaged"  # no marker
    (env / ".multihost-complete").write_bytes(b"")
    assert Probe.parse(host, _sh(probe, tmp_path).stdout.decode()).state == "present"
    (env / "bin" / "x").write_bytes(b"ab")
    assert Probe.parse(host, _sh(probe, tmp_path).stdout.decode()).state == "damaged"


def test_probe_says_whether_zstd_is_on_path(tmp_path: Path) -> None:
    """zstd=yes only for an executable zstd on the host's PATH (not a directory, not a file
    without x); a probe line without the word (an older multihost's) parses as no zstd."""
    host = Host(address="127.0.0.1", process_id=0)
    probe = _check(tmp_path)
    bare, tools = tmp_path / "bare", tmp_path / "tools"
    for d in (bare, tools):
        d.mkdir()
        (d / "python3").symlink_to(shutil.which("python3", path="/usr/bin:/bin") or "python3")
    (bare / "zstd").mkdir()  # a directory named zstd is no program
    (tools / "zstd").write_text("#!/bin/sh\n")

    def said(path: str) -> Probe:
        out = subprocess.run(
            ["/bin/sh", "-c", probe],
            capture_output=True,
            timeout=60,
            env={"HOME": str(tmp_path), "PATH": path},
            check=True,
        )
        return Probe.parse(host, out.stdout.decode())

    assert not said(f"{bare}").zstd
    assert not said(f"{tools}").zstd  # not executable
    (tools / "zstd").chmod(0o755)
    assert said(f"{bare}:{tools}").zstd
    line = "key=k state=absent python=3.11.2 exe=/p machine=x86_64 envs=/e uv=none"
    assert not Probe.parse(host, line).zstd
    assert Probe.parse(host, line + " zstd=yes").zstd


def _probe(worker: int, zstd: bool) -> Probe:
    host = Host(address=f"h{worker}", worker_id=worker, process_id=worker)
    return Probe(host, "k", "absent", "3.11.2", "/p", "x86_64", "/e", False, zstd=zstd)


def test_pack_format_is_zstd_only_when_every_host_reads_it() -> None:
    w0, w1, w2, w3 = (_probe(0, True), _probe(1, True), _probe(2, False), _probe(3, False))
    assert pack_format(w0, [w1], bucket=False) == ("zst", "")
    assert pack_format(w0, [], bucket=False) == ("zst", "")  # kept for later: the builder's
    assert pack_format(w0, [w1, w2], bucket=False) == ("gz", "no zstd on s0/w2")
    assert pack_format(w2, [w1, w3], bucket=False) == (
        "gz",
        "no zstd on s0/w2 (and 1 more host(s))",
    )
    assert pack_format(w2, [w3], bucket=False) == ("gz", "")  # none has it: nothing to say
    assert pack_format(w0, [w1], bucket=True) == ("gz", "the pack may go through a bucket")


# -- the whole path with --local workers (no SSH): real uv, an index served here --------------
@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, Index]]:
    idx = Index(tmp_path / "index")
    idx.add("tinya", "1.0", {"tinya/__init__.py": b"X = 1\n"})
    with idx.serving():
        root = uv_project(tmp_path / "proj", idx.url)
        idx.hits.clear()
        yield root, idx


def test_local_workers_share_one_build(home: Path, project: tuple[Path, Index]) -> None:
    root, idx = project
    res = multihost.run(
        'python -c "import tinya, sys; print(tinya.X, sys.prefix.endswith(tinya.__name__) or 1)"',
        local=2,
        script_dir=root,
        log_dir=home / "logs",
        stream="none",
    )
    assert res.ok, res
    assert idx.downloads() == 1  # both workers share one home: one build, one download


@pytest.mark.parametrize("fault", ["a wheel the index lacks", "the index down"])
def test_cli_failing_build_names_the_builder_and_starts_nothing(
    home: Path, tmp_path: Path, fault: str
) -> None:
    idx = tinyab(tmp_path / "index")
    root = tmp_path / "proj"
    root.mkdir()
    with idx.serving():
        uv_project(root, idx.url, requires=None)
        args = [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(root),
            "--log-dir",
            str(home / "logs"),
            "--run-name",
            "bad",
            "--cmd",
            "echo started",
        ]
        if fault == "a wheel the index lacks":
            next((tmp_path / "index" / "tinyb").glob("*.whl")).unlink()
            out = cli(args, HOME=str(home), UV_HTTP_RETRIES="0")
    if fault == "the index down":
        out = cli(args, HOME=str(home), UV_HTTP_RETRIES="0")
    assert out.returncode == 1, out
    assert "started" not in out.stdout
    assert "s0/w0 failed first: environment build failed: " in out.stderr
    assert "Traceback" not in out.stderr
    record = json.loads((home / "logs" / "bad" / "run.json").read_text())
    assert [h["exit_code"] for h in record["hosts"]] == [None, None]
    said = "404 Not Found" if fault == "a wheel the index lacks" else "Connection refused"
    assert said in record["hosts"][0]["error"]  # uv's own cause, under the builder's name
    assert record["hosts"][1]["error"] == "no environment: s0/w0 could not provide it"
    workers = home / ".cache" / "multihost" / "local"
    assert not [p for p in workers.glob("w*/runs/*")]  # no run directory kept anywhere
    left = [
        p
        for p in workers.glob("w*/envs/*")
        if p.name != ".lock" and not p.name.startswith(".probe-")
    ]
    assert not left  # nor a half-built environment


@pytest.mark.parametrize("fault", ["a wheel the index lacks", "the index down"])
def test_cli_sweep_stops_at_a_failing_environment(home: Path, tmp_path: Path, fault: str) -> None:
    """The first trial's failing build stops the sweep with the builder's uv cause: the build
    is tried once, the trials left are recorded as not run, exit 1."""
    idx = tinyab(tmp_path / "index")
    root = tmp_path / "proj"
    root.mkdir()
    with idx.serving():
        uv_project(root, idx.url, requires=None)
        idx.hits.clear()
        args = [
            "sweep",
            "--local",
            "2",
            "--script-dir",
            str(root),
            "--log-dir",
            str(home / "logs"),
            "--run-name",
            "sw",
            "--cmd",
            "echo started {n}",
            "--grid",
            "n=1,2,3",
        ]
        if fault == "a wheel the index lacks":
            next((tmp_path / "index" / "tinyb").glob("*.whl")).unlink()
            out = cli(args, HOME=str(home), UV_HTTP_RETRIES="0")
            assert [n for p, n in idx.hits.items() if "tinyb" in p and p.endswith(".whl")] == [1]
    if fault == "the index down":
        out = cli(args, HOME=str(home), UV_HTTP_RETRIES="0")
    assert out.returncode == 1, out
    said = "404 Not Found" if fault == "a wheel the index lacks" else "Connection refused"
    stop = [ln for ln in out.stderr.splitlines() if "the sweep stopped" in ln]
    assert len(stop) == 1, out.stderr
    assert stop[0].startswith("multihost: the sweep stopped: s0/w0 (")
    assert "environment build failed: " in stop[0]
    assert said in stop[0]  # uv's own cause, under the builder's name
    assert stop[0].endswith("; 2 trial(s) not run")
    rows = [
        json.loads(ln) for ln in (home / "logs" / "sw" / "results.jsonl").read_text().splitlines()
    ]
    assert [r["n"] for r in rows] == [1, 2, 3]
    assert rows[0]["status"].startswith("failed: s0/w0 environment build failed: ")
    assert said in rows[0]["status"]
    assert [r["status"] for r in rows[1:]] == [
        "not run: the locked environment failed on s0/w0 (local0)"
    ] * 2
    assert not (home / "logs" / "sw" / "n2").exists()  # never started
    assert "Traceback" not in out.stderr


def test_sweep_goes_on_after_a_failing_trial(home: Path, call_project: tuple[Path, Index]) -> None:
    """A trial whose job fails (not its environment) does not stop the sweep."""
    root, _idx = call_project
    res = multihost.run_sweep(
        "python main.py {n}",
        {"n": ["x", 2]},
        metric="x",
        local=2,
        script_dir=root,
        log_dir=home / "logs",
        on_record=lambda _r: None,
    )
    assert res.env_failure is None
    first, second = (r.status for r in res.records)
    assert re.fullmatch(r"failed: s0/w[01] exited with code 1", first), first  # either, first
    assert second == "ok"
    assert res.records[1].result["x"] == 2


def test_cli_stale_lock_is_one_line_exit_2(home: Path, project: tuple[Path, Index]) -> None:
    root, idx = project
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('["tinya"]', '["tinya", "tinyz"]'))
    out = cli(["run", "--local", "1", "--script-dir", str(root), "--cmd", "true"], HOME=str(home))
    assert out.returncode == 2
    assert "out of date with pyproject.toml: run `uv lock`" in out.stderr
    assert "Traceback" not in out.stderr
    assert not idx.hits


# -- --requirements FILE: a fully pinned file instead of uv.lock ---------------------------------
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("tinya>=1.0\n", "line 1: 'tinya>=1.0' is not pinned"),
        ("# pins\ntinya==1.0\ntinyb\n", "line 3: 'tinyb' is not pinned"),
        ("tinya==1.*\n", "line 1: 'tinya==1.*' is not pinned"),
        ("-r base.txt\n", "line 1: '-r base.txt': only name==version"),
        ("-e .\n", "line 1: '-e .': only name==version"),
        ("tinya @ https://x.test/a.whl\n", "is not pinned"),
        ("tinya==1.0 --no-binary :all:\n", "only --hash=ALGO:HEX may follow a pin"),
        ("# nothing\n", "no requirement in it"),
    ],
)
def test_requirements_refused(tmp_path: Path, text: str, said: str) -> None:
    from multihost.errors import UsageError

    req = tmp_path / "requirements.txt"
    req.write_text(text)
    with pytest.raises(UsageError, match=re.escape(said)):
        request(tmp_path, requirements=req)


def test_requirements_pinned_with_hashes_markers_and_index(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    text = (
        "--index-url http://127.0.0.1:1/simple\n"
        "# via uv pip compile\n"
        'Jax[tpu]==0.4.30 ; python_version >= "3.10" \\\n'
        "    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n"
        "jaxlib==0.4.30  # pinned\n"
    )
    req.write_text(text)
    got = request(tmp_path, requirements=req)
    assert got is not None
    assert got.requirements == text.encode()
    assert got.versions == (("jax", "0.4.30"), ("jaxlib", "0.4.30"))
    assert got.header == "environment from requirements.txt (jax 0.4.30, jaxlib 0.4.30)"
    assert got.lock_hash == hashlib.sha256(b"requirements\0" + text.encode()).hexdigest()
    req.write_text(text + "\n")  # the key is the file's content
    again = request(tmp_path, requirements=req)
    assert again is not None
    assert again.lock_hash != got.lock_hash


def test_requirements_and_a_lock_exit_2(tmp_path: Path) -> None:
    from multihost.errors import UsageError

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n')
    (tmp_path / "uv.lock").write_text("version = 1\n")
    req = tmp_path / "requirements.txt"
    req.write_text("tinya==1.0\n")
    with pytest.raises(UsageError, match="two environments for one run"):
        request(tmp_path, requirements=req)
    with pytest.raises(UsageError, match="with --no-sync"):
        request(tmp_path, requirements=req, sync=False)
    assert request(tmp_path, requirements=req, lock_excluded=True) is not None
    with pytest.raises(UsageError, match="not with --requirements"):
        request(tmp_path, requirements=req, lock_excluded=True, extras=("tpu",))


@pytest.fixture
def pinned(tmp_path: Path) -> Iterator[tuple[Path, Path, Index]]:
    """A code dir without uv.lock and a requirements file pinning tinya and its dependency."""
    idx = Index(tmp_path / "index")
    idx.add("tinya", "1.0", {"tinya/__init__.py": b"X = 1\n"}, ["tinyb"])
    idx.add("tinyb", "2.0", {"tinyb/__init__.py": b"Y = 2\n"})
    with idx.serving():
        root = tmp_path / "code"
        root.mkdir()
        (root / "main.py").write_text("import tinya, tinyb\nprint(tinya.X + tinyb.Y)\n")
        req = tmp_path / "requirements.txt"
        req.write_text(f"--index-url {idx.url}\ntinya==1.0\ntinyb==2.0\n")
        yield root, req, idx


def test_local_requirements_cold_then_warm(home: Path, pinned: tuple[Path, Path, Index]) -> None:
    root, req, idx = pinned
    lines: list[str] = []
    notes: list[str] = []
    kw = {
        "local": 2,
        "script_dir": root,
        "log_dir": home / "logs",
        "stream": "all",
        "requirements": req,
        "on_output": lambda _h, ln: lines.append(ln),
        "on_event": lambda e: notes.append(e.text) if isinstance(e, Note) else None,
    }
    res = multihost.run('python main.py; echo "$VIRTUAL_ENV" | grep -c /envs/', **kw)
    assert res.ok, res
    assert sorted(lines) == ["1", "1", "3", "3"]  # both workers inside the environment
    assert any(
        n.startswith("environment from requirements.txt (no jax in it): key ") for n in notes
    ), notes
    assert {p: n for p, n in idx.hits.items() if p.startswith("/files/")} == dict.fromkeys(
        idx.files(), 1
    )
    idx.hits.clear()
    res = multihost.run("python main.py", **kw)  # warm: nothing downloaded, nothing built
    assert res.ok, res
    assert not idx.hits


def test_local_requirements_missing_a_dependency(
    home: Path, pinned: tuple[Path, Path, Index]
) -> None:
    root, req, _ = pinned
    req.write_text(req.read_text().replace("tinyb==2.0\n", ""))  # tinya needs it
    res = multihost.run(
        "echo started",
        local=1,
        script_dir=root,
        log_dir=home / "logs",
        stream="none",
        requirements=req,
    )
    assert not res.ok
    assert "environment build failed" in (res.hosts[0].error or "")
    assert "requires `tinyb`" in (res.hosts[0].error or "")
    assert not list((home / ".multihost" / "envs").glob("*/"))


def test_cli_unpinned_requirement_exit_2(home: Path, pinned: tuple[Path, Path, Index]) -> None:
    root, req, idx = pinned
    req.write_text(req.read_text().replace("tinyb==2.0", "tinyb>=2"))
    out = cli(
        [
            "run",
            "--local",
            "1",
            "--script-dir",
            str(root),
            "--requirements",
            str(req),
            "--cmd",
            "echo started",
        ],
        HOME=str(home),
    )
    assert out.returncode == 2, out
    assert f"--requirements {req}, line 3: 'tinyb>=2' is not pinned (name==version)" in out.stderr
    assert "Traceback" not in out.stderr
    assert "started" not in out.stdout
    assert not idx.hits
    assert not (home / "multihost-logs").exists()


# -- the same for sweep trials and call --------------------------------------------------------
def _wheel_of_installed(idx: Index, name: str) -> None:
    """A wheel of an installed pure-python package, served by ``idx`` (for call: cloudpickle)."""
    import importlib
    from importlib import metadata

    package = Path(importlib.import_module(name).__file__ or "").parent
    files = {f"{name}/{p.relative_to(package)}": p.read_bytes() for p in package.rglob("*.py")}
    idx.add(name, metadata.version(name), files)


@pytest.fixture
def call_project(tmp_path: Path) -> Iterator[tuple[Path, Index]]:
    """A uv project locking tinya and cloudpickle (what call's runner needs), and a script."""
    idx = Index(tmp_path / "index")
    idx.add("tinya", "1.0", {"tinya/__init__.py": b"X = 1\n"})
    _wheel_of_installed(idx, "cloudpickle")
    with idx.serving():
        root = uv_project(
            tmp_path / "proj",
            idx.url,
            ["tinya", "cloudpickle"],
            tail="[dependency-groups]\ng = []\n",
        )
        (root / "main.py").write_text(
            "import json, os, sys, tinya\n"
            "print('MULTIHOST_RESULT ' + json.dumps({'x': int(sys.argv[1]) * tinya.X, "
            "'venv': os.environ.get('VIRTUAL_ENV', '')}))\n"
        )
        idx.hits.clear()
        yield root, idx


def _in_env(prefix: str, home: Path) -> bool:
    """``prefix`` is a locked environment under a worker's multihost dir in ``home``."""
    return Path(prefix).parent.name == "envs" and Path(prefix).is_relative_to(home)


def test_sweep_trials_run_in_the_locked_environment(
    home: Path, call_project: tuple[Path, Index]
) -> None:
    root, idx = call_project
    notes: list[str] = []
    kw = {
        "metric": "x",
        "local": 2,
        "script_dir": root,
        "log_dir": home / "logs",
        "on_record": lambda _r: None,
        "on_event": lambda e: notes.append(e.text) if isinstance(e, Note) else None,
    }
    res = multihost.run_sweep("python main.py {n}", {"n": [1, 2]}, **kw)
    assert res.ok, res
    assert [r.result["x"] for r in res.records] == [1, 2]
    assert all(_in_env(r.result["venv"], home) for r in res.records)  # every trial inside
    said = [n for n in notes if n.startswith("environment from uv.lock")]
    assert len(said) == 2
    assert "; built on s0/w0 (" in said[0]
    assert said[1].endswith("present on 2 host(s)")  # the second trial: warm
    assert idx.downloads() == len(idx.files())  # built once for the whole sweep
    idx.hits.clear()
    res = multihost.run_sweep("python main.py {n}", {"n": [3]}, no_sync=True, **kw)
    assert not res.ok  # the hosts' own Python has no tinya
    logs = (home / "logs" / res.name / "n3").glob("*.log")
    assert any("No module named 'tinya'" in p.read_text() for p in logs)
    assert not idx.hits


def test_cli_sweep_takes_the_environment_flags(
    home: Path, call_project: tuple[Path, Index]
) -> None:
    root, idx = call_project
    base = [
        "sweep",
        "--local",
        "1",
        "--script-dir",
        str(root),
        "--log-dir",
        str(home / "logs"),
        "--metric",
        "x",
        "--cmd",
        "python main.py {n}",
        "--grid",
        "n=2",
    ]
    out = cli([*base, "--run-name", "s1"], HOME=str(home))
    assert out.returncode == 0, out.stderr
    record = json.loads((home / "logs" / "s1" / "results.jsonl").read_text().splitlines()[0])
    assert _in_env(record["venv"], home)
    assert "multihost: environment from uv.lock (no jax in it): key " in out.stderr
    out = cli([*base, "--run-name", "s2", "--no-dev", "--group", "g"], HOME=str(home))
    assert out.returncode == 0, out.stderr  # a new selection: a new key, its own environment
    record = json.loads((home / "logs" / "s2" / "results.jsonl").read_text().splitlines()[0])
    assert _in_env(record["venv"], home)
    first = json.loads((home / "logs" / "s1" / "results.jsonl").read_text())
    assert record["venv"] != first["venv"]
    assert "--group g --no-dev --script-dir" in out.stdout  # the reproduce line keeps them
    idx.hits.clear()
    out = cli([*base, "--run-name", "s3", "--no-sync"], HOME=str(home))
    assert out.returncode == 1  # the hosts' own Python has no tinya
    assert "environment from" not in out.stderr
    assert not idx.hits


def test_call_runs_in_the_callers_locked_environment(
    home: Path, call_project: tuple[Path, Index], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, idx = call_project

    def _where() -> tuple[str, int]:  # nested: cloudpickle sends it by value
        import sys

        import tinya  # type: ignore[import-not-found]

        return sys.prefix, tinya.X

    got = multihost.call(_where, local=2, uv_project=root, log_dir=home / "logs", stream="none")
    assert [x for _, x in got] == [1, 1]
    assert all(_in_env(prefix, home) for prefix, _ in got)
    assert idx.downloads() == len(idx.files())
    (sub := root / "notebooks").mkdir()
    monkeypatch.chdir(sub)  # the project found from here up, as uv run finds it
    idx.hits.clear()
    assert multihost.call(_where, local=1, log_dir=home / "logs", stream="none") == got[:1]
    assert not idx.hits  # warm
    with pytest.raises(multihost.RemoteCallError, match="No module named 'tinya'"):
        multihost.call(_where, local=1, log_dir=home / "logs", stream="none", no_sync=True)
    with pytest.raises(SettingError, match=r"no pyproject\.toml and uv\.lock there"):
        multihost.call(_where, local=1, uv_project=home, log_dir=home / "logs")


@pytest.mark.parametrize("fmt", FORMATS)
def test_install_from_a_peer_hashes_once_and_refuses_a_wrong_sha256(
    tmp_path: Path, fmt: str
) -> None:
    """The real SERVE and INSTALL templates on 127.0.0.1: seed_fetch checks the sha256 as the
    bytes come (no second pass), a wrong one is refused with nothing unpacked."""
    data = _packed_env(fmt)
    digest = hashlib.sha256(data).hexdigest()
    key = "p" * 32
    seed, taker = tmp_path / "seed", tmp_path / "taker"
    (seed / ".mh" / "envs").mkdir(parents=True)
    (seed / ".mh" / "envs" / f"{key}.tar.{fmt}").write_bytes(data)
    token = b"t0ken\n"
    served = _sh(
        script(
            SERVE,
            paths={"b": "~/.mh"},
            key=key,
            fmt=fmt,
            serve=python_source("seed_serve"),
            addr="127.0.0.1",
            lifetime="30",
            fetches=2,
            name=f"/{digest}.tar.{fmt}",
        ),
        seed,
        token,
    )
    word, port, pid, folder = served.stdout.decode().split()
    assert word == "serving", served.stderr
    url = f"http://127.0.0.1:{port}/{digest}.tar.{fmt}"

    def install(want: str) -> subprocess.CompletedProcess[bytes]:
        return _sh(
            script(
                INSTALL,
                paths={"b": "~/.mh"},
                key=key,
                fmt=fmt,
                digest=want,
                how="peer",
                url=url,
                fetch=python_source("seed_fetch"),
                timeout=10,
            ),
            taker,
            token,
        )

    try:
        bad = install("0" * 64)
        assert bad.returncode == 3, bad.stderr
        assert b"sha256 mismatch" in bad.stderr
        assert not (taker / ".mh" / "envs" / key).exists()
        assert not list((taker / ".mh" / "envs").glob(".incoming.*"))
        good = install(digest)
        assert good.returncode == 0, good.stderr
        assert good.stdout.split() == [b"installed"]
        assert (taker / ".mh" / "envs" / key / "bin" / "x").read_bytes() == b"abc"
        assert (taker / ".mh" / "envs" / f"{key}.tar.{fmt}").read_bytes() == data
    finally:
        _sh(script(SEED_STOP, p=pid, s=folder), seed)
