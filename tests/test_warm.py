"""Warm processes, the pure tier: frames, a point's command read as a piece, the portal a
session's loop lives on, the server's own parts, and what ``--warm`` refuses before anything
starts. The processes themselves: tests/test_warm_local.py (``--local``) and
tests/test_warm_ssh.py (the sshd fleet)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multihost.bridge import Interrupt, Portal
from multihost.errors import UsageError
from multihost.remote.staging import python_source
from multihost.staging.bundled import payloads_dir
from multihost.warm.frames import Frame, FrameError, FrameReader, frame, work_frame
from multihost.warm.pieces import Layout, Piece, from_command
from tests.clitools import cli


def test_frames_cut_whatever_the_chunks() -> None:
    data = frame("ready", b'{"pid": 1}') + frame("out", b"a\nb\n" * 1000) + frame("bye")
    for size in (1, 7, 4096, len(data)):
        reader = FrameReader()
        got: list[Frame] = []
        for at in range(0, len(data), size):
            got += reader.feed(data[at : at + size])
        assert [f.kind for f in got] == ["ready", "out", "bye"]
        assert got[0].json() == {"pid": 1}
        assert got[1].data == b"a\nb\n" * 1000
    done = Frame("done", b'{"exit": 0}\n\x80binary\nvalue')
    assert done.json() == {"exit": 0}
    assert done.tail == b"\x80binary\nvalue"
    assert work_frame({"id": 1}, b"blob") == b'work 14\n{"id": 1}\nblob'


@pytest.mark.parametrize("junk", [b"x" * 100, b"ready -3\n", b"no way\n", b"k\xff 1\n"])
def test_what_is_no_frame_is_refused(junk: bytes) -> None:
    with pytest.raises(FrameError, match="not a frame"):
        FrameReader().feed(junk)


def test_a_points_command_as_a_layout_and_a_piece(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    layout, piece = from_command("A=1 B='x y' python3 -u t.py --n 4 'a b'", tmp_path)
    assert layout == Layout("python3", (("A", "1"), ("B", "x y")))
    assert piece == Piece("script", "t.py", ("--n", "4", "a b"))
    layout, piece = from_command(f"{sys.executable} -m pkg.mod -x", tmp_path)
    assert layout == Layout(sys.executable)
    assert piece == Piece("module", "pkg.mod", ("-x",))
    assert piece.header(3) == {"id": 3, "kind": "module", "target": "pkg.mod", "args": ["-x"]}


def test_a_bundled_payload_runs_through_its_main(tmp_path: Path) -> None:
    repo = payloads_dir().parent
    _, piece = from_command("python payloads/shardings.py -d 8", repo)
    assert piece.kind == "main"
    assert piece.header(1)["module"] == "shardings"
    (tmp_path / "shardings.py").write_text("print('mine')\n")  # the user's own, same name
    assert from_command("python shardings.py", tmp_path)[1].kind == "script"


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("cd x && python t.py", "shell syntax"),
        ("python t.py > out", "shell syntax"),
        ("python t.py $HOME", "shell syntax"),
        ("python t.py *.txt", "shell syntax"),
        ("echo hi", "does not start with python"),
        ("A=1", "does not start with python"),
        ("python -c 'print(1)'", "the script first"),
        ("python", "the script first"),
        ("python 'unclosed", "No closing quotation"),
    ],
)
def test_what_cannot_run_warm_is_refused(tmp_path: Path, command: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        from_command(command, tmp_path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cmd", "echo {a}"], "--warm runs a Python program without a shell"),
        (["--cmd", "python t.py {a}", "--trace", "2"], "--trace is not taken"),
        (["--cmd", "python t.py {a}", "--hang-timeout", "9"], "--hang-timeout is not taken"),
    ],
)
def test_warm_sweep_bad_input_is_one_line_and_exit_2(
    code: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    (code / "t.py").write_text("")
    args = ["sweep", "--local", "2", "--script-dir", str(code), "--warm", "--grid", "a=1,2"]
    res = cli([*args, "--log-dir", str(tmp_path / "logs"), *extra], HOME=str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "logs").exists()  # nothing started


def test_the_portal_keeps_its_loop_between_calls() -> None:
    portal = Portal()
    try:

        async def make() -> asyncio.Event:
            return asyncio.Event()

        event = portal.call(make)

        async def wait() -> str:
            await event.wait()  # an object of the portal's loop, from an earlier call
            return "set"

        async def later() -> None:
            event.set()

        threading.Timer(0.05, lambda: portal.call(later)).start()
        assert portal.call(wait) == "set"

        async def boom() -> None:
            raise KeyError("inside")

        with pytest.raises(KeyError, match="inside"):
            portal.call(boom)
    finally:
        portal.close()
    assert portal.closed
    portal.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        portal.call(make)


def _ctrl_c(after: threading.Event, times: int = 1) -> None:
    """Ctrl-C as a terminal or a kernel sends it, to the thread blocked in the call, once the
    work runs (``after``)."""
    assert after.wait(30)
    time.sleep(0.2)  # the caller is waiting by now (a signal before that is its own test)
    for _ in range(times):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        time.sleep(0.2)


def test_the_portal_stops_once_then_leaves_on_ctrl_c() -> None:
    """A library call's policy on the portal: the first Ctrl-C calls stop and the call returns
    what it returns; the second one is a KeyboardInterrupt and the work is cancelled."""
    portal = Portal()
    said: list[str] = []
    stopped, running = threading.Event(), threading.Event()
    try:

        async def stoppable() -> str:
            running.set()
            await asyncio.to_thread(stopped.wait, 30)
            return "stopped"

        policy = Interrupt(stopped.set, "stopping", say=said.append, label="interrupted")
        threading.Thread(target=_ctrl_c, args=(running,)).start()
        assert portal.call(stoppable, policy) == "stopped"
        assert said == ["multihost: interrupted: stopping"]

        cancelled, running = threading.Event(), threading.Event()

        async def stubborn() -> None:
            running.set()
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

        threading.Thread(target=_ctrl_c, args=(running, 2)).start()
        with pytest.raises(KeyboardInterrupt):
            portal.call(stubborn, Interrupt(lambda: None, "ignored", say=said.append))
        assert cancelled.wait(5)
    finally:
        portal.close()


def test_the_server_is_one_self_contained_file(tmp_path: Path) -> None:
    """It runs on a host from its text alone (standard library; jax only when there), and
    says why it leaves when nobody opens its channel in time."""
    text = python_source("warm_server")
    assert "import multihost" not in text
    assert "from multihost" not in text
    run = tmp_path / "run"
    run.mkdir()
    (run / "warm_server.py").write_text(text)
    env = {**os.environ, "MULTIHOST_RUN_DIR": str(run), "MULTIHOST_WARM_WAIT": "0.5"}
    env["MULTIHOST_JAX_INIT"] = "0"  # no backend: this test is about the channel
    done = subprocess.run(
        [sys.executable, str(run / "warm_server.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "no runner opened the channel within its wait: leaving" in done.stderr
    assert (run / "warm.in").is_fifo()
    assert (run / "warm.out").is_fifo()


def test_warm_processes_that_cannot_start_stop_the_sweep_at_the_second(
    code: Path, tmp_path: Path
) -> None:
    """Each point would fail the same way: the first two say why, the rest are not run."""
    (code / "t.py").write_text("")
    logs = tmp_path / "logs"
    res = cli(
        [
            "sweep",
            "--local",
            "2",
            "--warm",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "nope",
            "--cmd",
            "python9.99 t.py {a}",
            "--grid",
            "a=1,2,3",
        ],
        HOME=str(tmp_path / "home"),
    )
    assert res.returncode == 1, res.stderr
    rows = [json.loads(line) for line in (logs / "nope" / "results.jsonl").read_text().splitlines()]
    why = "the warm processes did not start: s0/w"
    assert why in rows[0]["status"]
    assert "exited with code 127" in rows[0]["status"]
    assert "python9.99" in rows[0]["status"]  # the shell's own words, from the run's log
    assert why in rows[1]["status"]
    assert rows[2]["status"].startswith(f"not run: {why}")
    assert rows[2]["status"].endswith("(twice in a row)")
