"""Stale accelerator holders: run the script locally with `sh -c` against fake holders."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from multihost.fleetops.stale import (
    DEFAULT_DEVICE_GLOB,
    Holder,
    StaleReport,
    parse_stale,
    stale_command,
)

Spawn = Callable[..., subprocess.Popen[bytes]]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def run(script: str, *, prefix: tuple[str, ...] = (), stdin: IO[Any] | None = None) -> StaleReport:
    """Run the stale script as the runner would on a host, and parse what it printed."""
    proc = subprocess.run(
        [*prefix, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return parse_stale(proc.stdout)


@pytest.fixture
def devdir() -> Iterator[Path]:
    """A world-readable directory standing in for /dev (and /tmp for the lockfile)."""
    path = Path(tempfile.mkdtemp(prefix="multihost-stale-"))
    path.chmod(0o755)
    (path / "accel0").write_text("")
    (path / "accel1").write_text("")
    (path / "libtpu_lockfile").write_text("")
    yield path
    shutil.rmtree(path)


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start `sleep` holding a file open on stdin; the test process keeps no copy of the fd."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        device: Path, *, ignore_term: bool = False, prefix: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        ignore = (lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) if ignore_term else None
        with device.open("rb") as held:
            proc = subprocess.Popen([*prefix, "sleep", "60"], stdin=held, preexec_fn=ignore)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def script(devdir: Path, *, kill: bool, grace: float = 5.0, glob: str = "accel*") -> str:
    return stale_command(
        kill=kill,
        device_glob=f"{devdir}/{glob}",
        grace=grace,
        lockfile=str(devdir / "libtpu_lockfile"),
    )


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_detects_holder_without_killing(devdir: Path, spawn: Spawn) -> None:
    proc = spawn(devdir / "accel0")
    report = run(script(devdir, kill=False))
    assert report.holders == (Holder(proc.pid, comm(proc.pid), (f"{devdir}/accel0",)),)
    assert report.devices == (f"{devdir}/accel0", f"{devdir}/accel1")
    assert report.lockfile == f"{devdir}/libtpu_lockfile"
    assert (report.killed, report.removed_lockfile) == ((), False)
    assert proc.poll() is None
    assert (devdir / "libtpu_lockfile").exists()
    assert report.summary() == (
        f"pid {proc.pid} (sleep) holds {devdir}/accel0; {devdir}/libtpu_lockfile present"
    )


def test_kill_stops_holder_with_term_and_removes_lockfile(devdir: Path, spawn: Spawn) -> None:
    proc = spawn(devdir / "accel1")
    report = run(script(devdir, kill=True))
    assert report.killed == ((proc.pid, "TERM"),)
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert report.removed_lockfile
    assert not (devdir / "libtpu_lockfile").exists()
    assert report.remaining == ()
    assert report.summary() == (
        f"pid {proc.pid} (sleep) held {devdir}/accel1: stopped with TERM; "
        f"removed {devdir}/libtpu_lockfile"
    )


def test_holder_ignoring_term_gets_killed(devdir: Path, spawn: Spawn) -> None:
    stubborn = spawn(devdir / "accel0", ignore_term=True)
    polite = spawn(devdir / "accel1")
    report = run(script(devdir, kill=True, grace=0.3))
    assert sorted(report.killed) == sorted([(stubborn.pid, "KILL"), (polite.pid, "TERM")])
    assert stubborn.wait(timeout=5) == -signal.SIGKILL
    assert polite.wait(timeout=5) == -signal.SIGTERM
    assert report.survivors == ()


def test_one_holder_of_two_devices_is_one_holder(devdir: Path, spawn: Spawn) -> None:
    with (devdir / "accel0").open("rb") as a, (devdir / "accel1").open("rb") as b:
        proc = subprocess.Popen(["sleep", "60"], stdin=a, stdout=b)
    try:
        report = run(script(devdir, kill=False))
        assert [(h.pid, h.devices) for h in report.holders] == [
            (proc.pid, (f"{devdir}/accel0", f"{devdir}/accel1"))
        ]
    finally:
        proc.kill()
        proc.wait()


def test_no_holder(devdir: Path) -> None:
    report = run(script(devdir, kill=False))
    assert report.holders == ()
    assert report.summary() == f"no process holds an accelerator; {devdir}/libtpu_lockfile present"


def test_no_device_files(devdir: Path) -> None:
    report = run(script(devdir, kill=True, glob="vfio/[0-9]*"))
    assert (report.devices, report.holders, report.killed) == ((), (), ())
    assert report.removed_lockfile
    assert report.summary() == (
        f"no accelerator device files found; removed {devdir}/libtpu_lockfile"
    )
    (devdir / "libtpu_lockfile").unlink(missing_ok=True)
    assert run(script(devdir, kill=True, glob="nothing*")).summary() == (
        "no accelerator device files found"
    )


def test_its_own_shell_is_not_a_holder(devdir: Path) -> None:
    with (devdir / "accel0").open("rb") as device:
        report = run(script(devdir, kill=True), stdin=device)
    assert report.holders == ()
    assert report.killed == ()


def test_inserted_values_are_quoted(devdir: Path, spawn: Spawn) -> None:
    odd = devdir / "it's $(touch pwned) lock"
    odd.write_text("")
    proc = spawn(devdir / "accel0")
    report = run(
        stale_command(kill=True, device_glob=f"{devdir}/accel0 ;touch pwned2", lockfile=str(odd))
    )
    assert [h.pid for h in report.holders] == [proc.pid]
    assert report.removed_lockfile
    assert report.lockfile == str(odd)
    assert not odd.exists()
    assert not list(devdir.glob("pwned*"))
    assert not Path("pwned").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("sudo") is not None,
    reason="needs root, setpriv, and no sudo to run the script as an unprivileged user",
)
def test_unprivileged_user_sees_and_stops_only_its_own(devdir: Path, spawn: Spawn) -> None:
    theirs = spawn(devdir / "accel0")
    mine = spawn(devdir / "accel1", prefix=tuple(NOBODY))
    (devdir / "libtpu_lockfile").unlink()
    report = run(script(devdir, kill=True), prefix=tuple(NOBODY))
    assert report.scope == "user"
    assert [h.pid for h in report.holders] == [mine.pid]
    assert report.killed == ((mine.pid, "TERM"),)
    assert mine.wait(timeout=5) == -signal.SIGTERM
    assert theirs.poll() is None
    assert report.summary().endswith(
        "only this user's processes checked (not root, no passwordless sudo)"
    )


def test_script_shape() -> None:
    text = stale_command(kill=False)
    assert subprocess.run(["sh", "-n", "-c", text], check=False).returncode == 0
    assert "sudo -n" in text
    assert "lsof" not in text
    assert DEFAULT_DEVICE_GLOB in text
    assert "/tmp/libtpu_lockfile" in text
    with pytest.raises(ValueError, match="grace"):
        stale_command(kill=True, grace=-1)
    with pytest.raises(ValueError, match="grace"):
        stale_command(kill=True, grace=float("nan"))


def test_parse_ignores_noise_and_keeps_spaces_in_comm() -> None:
    report = parse_stale(
        "Welcome to Ubuntu\n"
        "scope root\n"
        "device /dev/accel0\n"
        "device /dev/accel1\n"
        "holder 12 /dev/accel0 Web Content\n"
        "holder 12 /dev/accel1 Web Content\n"
        "holder x /dev/accel1 bad\n"
        "holder 13 /dev/accel1 python3\n"
        "killed 12 KILL\n"
        "killed 13 HUP\n"
        "survived 13\n"
        "survived\n"
        "lockfile /tmp/libtpu_lockfile\n"
    )
    assert report.holders == (
        Holder(12, "Web Content", ("/dev/accel0", "/dev/accel1")),
        Holder(13, "python3", ("/dev/accel1",)),
    )
    assert report.killed == ((12, "KILL"),)
    assert report.survivors == (13,)
    assert report.remaining == (Holder(13, "python3", ("/dev/accel1",)),)
    assert report.summary() == (
        "pid 12 (Web Content) held /dev/accel0, /dev/accel1: stopped with KILL; "
        "pid 13 (python3) holds /dev/accel1: still running after KILL; "
        "/tmp/libtpu_lockfile present"
    )


def test_parse_empty() -> None:
    assert parse_stale("") == StaleReport()
    assert StaleReport().summary() == "no accelerator device files found"
