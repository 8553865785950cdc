"""What ``pip install multihost`` gets: one real build (sdist, then the wheel from the sdist)
checked for payloads, py.typed, LICENSE and the tests; the installed payload staged by
``run --payload``; gitignore-style directory excludes in a git checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from multihost.staging.archive import list_files
from tests.clitools import REPO

PAYLOAD_FILES = sorted(p.name for p in (REPO / "payloads").glob("*.py"))


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    log: str

    def wheel_names(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as z:
            return set(z.namelist())

    def sdist_names(self) -> set[str]:
        with tarfile.open(self.sdist) as t:
            return {n.split("/", 1)[1] for n in t.getnames() if "/" in n}


def _source_files() -> list[str]:
    """The checkout's files as git sees them (tracked and not ignored), else every file."""
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        return [n for n in out.decode().split("\0") if n and (REPO / n).is_file()]
    except (OSError, subprocess.SubprocessError):  # an unpacked sdist: no git
        return [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``python -m build`` of a copy of the checkout (the build writes into its tree)."""
    pytest.importorskip("build", reason="python -m build (multihost[dev]) is not installed")
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    for name in _source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    res = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("*.whl")
    (sdist,) = (tmp / "dist").glob("*.tar.gz")
    return Built(wheel, sdist, res.stdout + res.stderr)


@pytest.mark.slow  # one build for the module: ~15-30 s
def test_the_wheel_has_the_package_payloads_license_and_types(built: Built) -> None:
    names = built.wheel_names()
    package = {n for n in _source_files() if n.startswith("multihost/") and n.endswith(".py")}
    assert package <= names, sorted(package - names)  # pyproject's package list is complete
    scripts = {n for n in _source_files() if n.startswith("multihost/") and n.endswith(".sh")}
    assert scripts <= names, sorted(scripts - names)  # the hosts' scripts are package data
    assert {f"multihost/payloads/{n}" for n in PAYLOAD_FILES} <= names
    assert "multihost/py.typed" in names
    dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
    assert f"{dist_info}/licenses/LICENSE" in names
    with zipfile.ZipFile(built.wheel) as z:
        metadata = z.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Deprecat" not in built.log  # e.g. setuptools' warning for a license table


@pytest.mark.slow  # one build for the module: ~15-30 s
def test_the_sdist_can_run_its_tests(built: Built) -> None:
    names = built.sdist_names()
    kept = ("tests/", "payloads/", "benchmarks/", "docs/")
    needed = [n for n in _source_files() if n.startswith(kept)]
    assert set(needed) <= names, sorted(set(needed) - names)
    assert {
        "tests/conftest.py",
        "tests/fleet.py",
        ".ci/constraints.txt",
        "tests/clitools.py",
        "LICENSE",
        "pyproject.toml",
        "README.md",
        "mkdocs.yml",
    } <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.slow  # one build for the module: ~15-30 s
def test_the_installed_payload_is_staged(built: Built, tmp_path: Path) -> None:
    """``run --payload shardings`` from the installed wheel, run from an unrelated directory:
    the wheel's payloads are the code, ``PYTHON shardings.py ARGS`` the command."""
    site = tmp_path / "site"
    with zipfile.ZipFile(built.wheel) as z:
        z.extractall(site)  # a pure-Python wheel: unpacking is installing
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "multihost",
            "run",
            "--local",
            "2",
            "--payload",
            "shardings",
            "--python",
            "python3",
            "--dry-run",
            "--",
            "-d",
            "2048",
            "--tag",
            "a b",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=work,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert f": {len(PAYLOAD_FILES)} files," in res.stdout.splitlines()[0]
    assert "exec sh -c 'python3 shardings.py -d 2048 --tag '\"'\"'a b'\"'\"''" in res.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import multihost.staging.bundled as b; print(b.payloads_dir())"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=work,
        env=env,
        check=True,
    ).stdout.strip()
    assert where == str(site / "multihost" / "payloads")


def test_payload_needs_no_script_dir_and_takes_args_only_after_dashes(tmp_path: Path) -> None:
    from tests.clitools import cli

    bad = cli(
        [
            "run",
            "--local",
            "1",
            "--payload",
            "shardings",
            "--script-dir",
            str(tmp_path),
            "--dry-run",
        ]
    )
    assert bad.returncode == 2
    assert "--payload stages the payloads that ship with multihost" in bad.stderr
    stray = cli(["run", "--local", "1", "--cmd", "true", "--dry-run", "--", "-d", "8"])
    assert stray.returncode == 2
    assert "only --payload takes arguments after --" in stray.stderr


def test_trailing_slash_excludes_a_directory_in_a_git_checkout(tmp_path: Path) -> None:
    for name in ("a.py", "tests/t.py", "tests/data/d.bin", "pkg/tests/u.py", "testsx/k.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True, timeout=60)
    assert list_files(tmp_path, ("tests/",)) == ["a.py", "testsx/k.py"]
    assert list_files(tmp_path, ("/tests/",)) == ["a.py", "pkg/tests/u.py", "testsx/k.py"]
