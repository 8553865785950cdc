"""The failing TPU hosts' runtime logs come back (pure: the script and the unpacking)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from multihost.diagnose.tpu_logs import collect_command, unpack


def test_collect_script_parses_and_passes_shellcheck() -> None:
    subprocess.run(["sh", "-n", "-c", collect_command("~/x")], check=True)
    lint = subprocess.run(
        ["shellcheck", "--shell=sh", "-"],
        input=collect_command("~/x"),
        text=True,
        capture_output=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout


def test_collect_keeps_the_newest_files_cut_to_their_tails(tmp_path: Path) -> None:
    logs = tmp_path / "tpu_logs"
    logs.mkdir()
    for i, size in enumerate([10, 5000, 20, 30]):  # written oldest first
        (logs / f"f{i}.log").write_bytes(b"a" * (size - 4) + b"tail")
        os.utime(logs / f"f{i}.log", (1_700_000_000 + i, 1_700_000_000 + i))
    out = subprocess.run(
        ["sh", "-c", collect_command(str(logs), files=3, file_bytes=100)],
        capture_output=True,
        check=True,
    ).stdout
    dest = tmp_path / "back"
    assert unpack(out, dest) == (3, 1)
    assert sorted(p.name for p in dest.iterdir()) == ["CUT.txt", "f1.log", "f2.log", "f3.log"]
    assert (dest / "f1.log").read_bytes() == b"a" * 96 + b"tail"
    assert (dest / "CUT.txt").read_text() == "5000 f1.log\n"
    assert oct((dest / "f1.log").stat().st_mode & 0o777) == "0o600"
    missing = subprocess.run(["sh", "-c", collect_command(str(tmp_path / "none"))], check=False)
    assert missing.returncode == 3


def test_unpack_refuses_paths_that_leave_the_folder(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("../evil", "sub/x", "./ok.log"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    assert unpack(buf.getvalue(), tmp_path / "d") == (1, 0)
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["ok.log"]
    assert not (tmp_path / "evil").exists()
