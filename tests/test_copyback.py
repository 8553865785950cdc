"""``multihost pull`` over local workers: files and globs back per host, re-runs skip, a host
that fails is named while the rest arrive, and nothing is ever written outside the folder."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

import multihost
from multihost.errors import UsageError
from multihost.runs.pull import RemoteFile, list_command, parse_listing
from tests.clitools import REPO, cli

N = 3
# Every host writes out/p.txt and out/sub/d.txt; all but host 1 write metrics.json.
WRITE = (
    'mkdir -p out/sub && echo "p $JAX_PROCESS_ID" > out/p.txt && echo deep > out/sub/d.txt && '
    'touch -d @1600000000 out/p.txt && { [ "$JAX_PROCESS_ID" = 1 ] || echo "{}" > metrics.json; }'
)


def _env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PYTHONPATH": str(REPO)}


@pytest.fixture
def run(home: Path, code: Path, tmp_path: Path) -> Path:
    """A finished local run ``r`` whose hosts wrote files; returns its log dir."""
    logs = tmp_path / "logs"
    result = multihost.run(
        WRITE, local=N, script_dir=code, log_dir=logs, run_name="r", stream="none"
    )
    assert result.ok, result
    return logs


def test_listing_is_parsed_and_names_that_leave_the_folder_are_refused() -> None:
    out = b"P /w\0F 3 1600000000.5 a b.txt\0D /etc/shadow\0M *.json\0W rel\0F x 1 bad\0"
    listing = parse_listing(out, b"find: 'x': Permission denied\n")
    assert listing.work_dir == "/w"
    assert listing.files == (RemoteFile("a b.txt", 3, 1600000000.5),)
    assert listing.remote_path(listing.files[0]) == "/w/a b.txt"
    assert listing.problems == (
        "/etc/shadow: permission denied",
        "no match for '*.json'",
        "'rel': the run's work dir is gone from the host",
        "unreadable listing entry 'F x 1 bad'",
        "find: 'x': Permission denied",
    )
    assert RemoteFile("/tmp/a/../b", 1, 0).local_name == "tmp/b"
    assert RemoteFile("out/./p.txt", 1, 0).local_name == "out/p.txt"
    for bad in ("../x", "a/../../x", ".", "/"):
        assert RemoteFile(bad, 1, 0).local_name is None, bad


def test_listing_script_with_awkward_names(tmp_path: Path) -> None:
    work = tmp_path / "w"
    (work / "d").mkdir(parents=True)
    names = ("-delete", "a b.txt", "new\nline", "d/x.json")
    for name in names:
        (work / name).write_text("x")
    (work / "d" / "link").symlink_to("/etc/hostname")  # below a directory: not followed
    command = list_command(str(work), ["-delete", "a b.txt", "new*", "d", "nope*"])
    res = subprocess.run(["sh", "-c", command], capture_output=True, timeout=30)
    listing = parse_listing(res.stdout, res.stderr)
    assert listing.work_dir == str(work)
    assert sorted(f.path for f in listing.files) == [
        "./-delete",
        "a b.txt",
        "d/x.json",
        "new\nline",
    ]
    assert listing.problems == ("no match for 'nope*'",)
    assert all((work / name).exists() for name in names)


def test_pull_globs_and_dirs_names_the_host_without_a_match_and_skips_on_rerun(
    run: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "got"
    results = multihost.pull("r", ["out", "*.json"], to=dest, log_dir=run)
    assert [r.host.name for r in results] == ["s0/w0", "s0/w1", "s0/w2"]
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].errors == ("no match for '*.json'",)
    assert [r.files for r in results] == [3, 2, 3]
    for i in range(N):
        host = dest / "s0" / f"w{i}"
        assert (host / "out" / "p.txt").read_text() == f"p {i}\n"
        assert (host / "out" / "sub" / "d.txt").read_text() == "deep\n"
        assert (host / "out" / "p.txt").stat().st_mtime == 1600000000  # the host's mtime
        assert (host / "metrics.json").exists() == (i != 1)
        for path in (host, host / "out", host / "out" / "sub"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert stat.S_IMODE((host / "out" / "p.txt").stat().st_mode) == 0o600
        assert not list(host.rglob("*.multihost-partial"))
    again = multihost.pull("r", ["out", "*.json"], to=dest, log_dir=run)
    assert [(r.files, r.skipped, r.bytes) for r in again] == [(0, 3, 0), (0, 2, 0), (0, 3, 0)]
    # A changed file (size or mtime) is copied again.
    (dest / "s0" / "w0" / "out" / "p.txt").write_text("local edit, longer\n")
    third = multihost.pull("r", "out/p.txt", to=dest, log_dir=run)
    assert [(r.files, r.skipped) for r in third] == [(1, 0), (0, 1), (0, 1)]
    assert (dest / "s0" / "w0" / "out" / "p.txt").read_text() == "p 0\n"


def test_nothing_is_written_outside_the_folder(run: Path, tmp_path: Path) -> None:
    dest = tmp_path / "got"
    outside = tmp_path / "outside"
    outside.mkdir()
    # A symbolic link planted inside the folder for host 0: pulling through it is refused.
    (dest / "s0" / "w0").mkdir(parents=True)
    (dest / "s0" / "w0" / "out").symlink_to(outside)
    # ../<hash>/out/p.txt is a real file next to the work dir: a path that leaves the work dir
    # is refused before any host is asked, and a name with '..' a host lists is never written.
    code_hash = next((Path(os.environ["HOME"]) / ".cache/multihost/local/w0/code").iterdir()).name
    with pytest.raises(UsageError, match="leaves the run's work dir"):
        multihost.pull("r", [f"../{code_hash}/out/p.txt"], to=dest, log_dir=run)
    assert RemoteFile(f"../{code_hash}/out/p.txt", 1, 0.0).local_name is None
    results = multihost.pull("r", ["out/p.txt", ".*"], to=dest, log_dir=run)
    assert not results[0].ok
    assert any("symbolic link" in e and "out/p.txt" in e for e in results[0].errors)
    assert list(outside.iterdir()) == []
    for r in results:  # '.*' matches no '..': the host's other runs and code are not listed
        assert not any(".." in e for e in r.errors), r.errors
    assert [(dest / "s0" / f"w{i}" / "out" / "p.txt").is_file() for i in range(3)] == [
        False,
        True,
        True,
    ]
    assert not list(tmp_path.glob("*/p.txt"))
    assert not (tmp_path / "out").exists()


def test_cli_pull_and_run_pull(home: Path, code: Path, tmp_path: Path) -> None:
    args = ["--local", "2", "--script-dir", str(code), "--log-dir", "logs", "--run-name", "cp"]
    res = cli(
        [
            "run",
            *args,
            "--no-fail-fast",
            "--cmd",
            WRITE + "; exit 3",
            "--pull",
            "out/p.txt",
            "--pull",
            "*.json",
        ],
        cwd=tmp_path,
        **_env(home),
    )
    assert res.returncode == 1, res.stderr  # the run failed; files still came back
    assert "\x1b" not in res.stdout + res.stderr  # not a terminal: no progress bar
    got = tmp_path / "multihost-pull" / "cp"
    assert (got / "s0" / "w0" / "out" / "p.txt").read_text() == "p 0\n"
    assert (got / "s0" / "w1" / "out" / "p.txt").read_text() == "p 1\n"
    assert "s0/w1  FAILED" in res.stdout
    assert "no match for '*.json'" in res.stdout
    assert "from 2 of 2 host(s) into multihost-pull/cp; 1 host(s) had problems" in res.stdout
    res = cli(
        ["pull", "cp", "--log-dir", "logs", "out", "--to", "again", "--json"],
        cwd=tmp_path,
        **_env(home),
    )
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    assert '"files": 2' in res.stdout
    res = cli(
        ["run", *args, "--run-name", "cd", "--detach", "--pull", "x", "--cmd", "true"],
        cwd=tmp_path,
        **_env(home),
    )
    assert res.returncode == 2
    assert "--detach" in res.stderr
    res = cli(["pull", "cp", "--log-dir", "logs", ""], cwd=tmp_path, **_env(home))
    assert res.returncode == 2
    assert "not a remote path" in res.stderr
