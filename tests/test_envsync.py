"""The locked environment's pure parts (issue 27): requires-python, uv's selection flags, what
a code dir asks for, and the host templates run here with plain sh (no SSH)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import multihost
from multihost.core.envsync import Probe
from multihost.envsync import Selection, request, satisfies
from multihost.errors import SettingError
from multihost.model import Host
from multihost.remote import script
from multihost.remote.envsync import INSTALL, PACK, PROBE
from multihost.remote.staging import python_source
from tests.clitools import cli
from tests.pyindex import Index


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
    assert s.flags() == ("--extra", "tpu", "--all-extras", "--group", "a", "--group", "b",
                         "--no-dev")  # fmt: skip


def test_what_a_code_dir_asks_for(tmp_path: Path) -> None:
    assert request(tmp_path) is None  # no pyproject.toml
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n')
    assert request(tmp_path) is None  # no uv.lock: nothing to sync
    with pytest.raises(SettingError, match="bad extra"):
        request(tmp_path, extras=("a b",))
    (tmp_path / "uv.lock").write_text("version = 1\n")
    assert request(tmp_path, sync=False) is None


def _sh(command: str, home: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, timeout=60,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin"})  # fmt: skip


def _packed_env() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in ((".multihost-manifest", b"3 bin/x\n"), ("bin/x", b"abc"),
                           (".multihost-complete", b"")):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def test_install_checks_sha256_then_probe_sees_damage(tmp_path: Path) -> None:
    data = _packed_env()
    digest = hashlib.sha256(data).hexdigest()
    key = "k" * 32
    bad = _sh(
        script(
            INSTALL,
            paths={"b": "~/.mh"},
            key=key,
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
    # the kept archive is what a later PACK hands on, unchanged
    packed = _sh(script(PACK, paths={"b": "~/.mh"}, key=key), tmp_path)
    assert packed.stdout.split() == [b"packed", str(len(data)).encode(), digest.encode()]


def test_probe_reports_key_and_state(tmp_path: Path) -> None:
    host = Host(address="127.0.0.1", process_id=0)
    probe = script(PROBE, paths={"b": "~/.mh"}, lock="L", ruv="0.13.9",
                   probe=python_source("env_probe"))  # fmt: skip
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


# -- the whole path with --local workers (no SSH): real uv, an index served here --------------
@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, Index]]:
    idx = Index(tmp_path / "index")
    idx.add("tinya", "1.0", {"tinya/__init__.py": b"X = 1\n"})
    with idx.serving():
        root = tmp_path / "proj"
        root.mkdir()
        (root / "pyproject.toml").write_text(
            '[project]\nname = "demo"\nversion = "0.1"\nrequires-python = ">=3.9"\n'
            'dependencies = ["tinya"]\n[tool.uv]\npackage = false\n'
            f'[[tool.uv.index]]\nurl = "{idx.url}"\ndefault = true\n'
        )
        env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(tmp_path / "uvc"))
        subprocess.run(["uv", "lock", "-q"], cwd=root, env=env, check=True, timeout=60)
        idx.hits.clear()
        yield root, idx


def test_local_workers_share_one_build(home: Path, project: tuple[Path, Index]) -> None:
    root, idx = project
    res = multihost.run(
        'python -c "import tinya, sys; print(tinya.X, sys.prefix.endswith(tinya.__name__) or 1)"',
        local=2, script_dir=root, log_dir=home / "logs", stream="none",
    )  # fmt: skip
    assert res.ok, res
    assert idx.downloads() == 1  # both workers share one home: one build, one download


def test_cli_stale_lock_is_one_line_exit_2(home: Path, project: tuple[Path, Index]) -> None:
    root, idx = project
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('["tinya"]', '["tinya", "tinyz"]'))
    out = cli(["run", "--local", "1", "--script-dir", str(root), "--cmd", "true"], HOME=str(home))
    assert out.returncode == 2
    assert "out of date with pyproject.toml: run `uv lock`" in out.stderr
    assert "Traceback" not in out.stderr
    assert not idx.hits
