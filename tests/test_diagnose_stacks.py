"""Stacks: the staged hook dumps a real process' stacks on a signal; parsing and grouping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from multihost import remote
from multihost.diagnose.collect import collect_command, parse_collect
from multihost.diagnose.stacks import (
    Frame,
    HostStacks,
    ProcessStack,
    ThreadStack,
    group,
    normalize,
    parse_dump,
)
from multihost.model import Host, host_ranges
from multihost.remote.commands import hook_text
from tests.helpers import wait_for

PROGRAM = """\
import threading, time
def loader():
    time.sleep(60)
threading.Thread(target=loader, daemon=True).start()
def step():
    time.sleep(60)
step()
"""


def _asleep(pid: int) -> bool:
    """Every thread of ``pid`` blocked in ``time.sleep`` (the kernel's wait channel, from
    /proc): PROGRAM is in ``loader`` and ``step``, where the tests take its stacks."""
    try:
        chans = [(t / "wchan").read_text() for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return False
    return bool(chans) and all("nanosleep" in c for c in chans)


def _hooked_pids(pattern: str, root: Path) -> list[int]:
    """The pids of the processes whose hook says it listens (``<pid>.ready`` under ``root``)."""
    return [int(p.name.removesuffix(".ready")) for p in root.glob(pattern)]


def _hooked(tmp_path: Path, program: str, user_site: Path | None = None) -> subprocess.Popen[bytes]:
    """``program`` as train.py, started with the hook in ``tmp_path/hook`` (a run's layout)."""
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(hook_text())
    (tmp_path / "train.py").write_text(program)
    path = [str(hook_dir), *([str(user_site)] if user_site else [])]
    env = {**os.environ, "MULTIHOST_STACK_DIR": str(hook_dir), "PYTHONPATH": ":".join(path)}
    return subprocess.Popen([sys.executable, "train.py"], cwd=tmp_path, env=env)


def test_hook_dumps_every_thread_on_signal(tmp_path: Path) -> None:
    proc = _hooked(tmp_path, PROGRAM)
    try:
        ready = tmp_path / "hook" / f"{proc.pid}.ready"
        wait_for(ready.exists, 20, "the hook to register")
        wait_for(lambda: _asleep(proc.pid), 20, "train.py asleep in step() and loader()")
        proc.send_signal(signal.SIGUSR2)
        dump = tmp_path / "hook" / f"{proc.pid}.txt"
        # written thread by thread; the main thread (its outermost frame the module) comes last
        wait_for(lambda: "in <module>" in dump.read_text(), 10, "the whole dump")
        assert proc.poll() is None  # the signal did not kill it
    finally:
        proc.kill()
        proc.wait()
    assert "train.py" in ready.read_text()
    threads = parse_dump(dump.read_text(), str(tmp_path))
    assert len(threads) == 2
    main = next(t for t in threads if t.main)
    assert main.frames[0] == Frame("~/train.py", 6, "step")
    assert main.frames[-1].function == "<module>"
    other = next(t for t in threads if not t.main)
    assert Frame("~/train.py", 3, "loader") in other.frames


def test_hook_chains_the_users_sitecustomize(tmp_path: Path) -> None:
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE = 1\n")
    proc = _hooked(
        tmp_path, "import builtins, sys\nsys.exit(0 if builtins.USER_SITE else 1)\n", user_site
    )
    assert proc.wait(timeout=20) == 0


def test_hook_is_inert_without_a_stack_dir(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(hook_text())
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "MULTIHOST_STACK_DIR": str(tmp_path / "no")}
    res = subprocess.run(
        [sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, check=True
    )
    assert res.stdout == "ran\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sitecustomize.py"]


def test_normalize_code_dir_and_home() -> None:
    assert normalize("/home/mhw3/.multihost/code/0123456789abcdef/train.py") == "train.py"
    assert normalize("/home/mhw3/venv/lib/x.py", "/home/mhw3") == "~/venv/lib/x.py"
    assert normalize("/usr/lib/python3/x.py", "/home/mhw3") == "/usr/lib/python3/x.py"


def _host(w: int, s: int = 0) -> Host:
    return Host(f"h{s}{w}", slice_id=s, worker_id=w, process_id=s * 4 + w)


def _stack(*frames: Frame) -> ProcessStack:
    return ProcessStack(1, "python train.py", (ThreadStack("0x1", frames),))


def test_group_odd_ones_first_and_stragglers() -> None:
    collective = (Frame("jax/_src/x.py", 10, "psum"), Frame("train.py", 9, "<module>"))
    sleeping = (Frame("train.py", 5, "load"), Frame("train.py", 9, "<module>"))
    found = [HostStacks(_host(w, s), (_stack(*collective),)) for s in (0, 1) for w in range(4)]
    found[3] = HostStacks(_host(3), (_stack(*sleeping),))
    found.append(HostStacks(Host("gone", slice_id=2), error="unreachable"))
    report = group(found)
    assert [g.size for g in report.groups] == [1, 7]
    assert report.groups[0].frames == sleeping
    assert host_ranges(report.groups[1].hosts) == "s0/w0-2,s1/w0-3"
    assert report.stragglers == (_host(3),)
    assert [e.error for e in report.errors] == ["unreachable"]


def test_no_straggler_when_all_agree_or_tie() -> None:
    a = (Frame("a.py", 1, "f"),)
    b = (Frame("b.py", 1, "g"),)
    same = group([HostStacks(_host(w), (_stack(*a),)) for w in range(3)])
    assert same.stragglers == ()
    tie = group([HostStacks(_host(w), (_stack(*(a if w % 2 else b)),)) for w in range(4)])
    assert tie.stragglers == ()


def test_host_ranges() -> None:
    hosts = [_host(w) for w in (0, 1, 2, 5)] + [_host(0, 1)]
    assert host_ranges(hosts) == "s0/w0-2,s0/w5,s1/w0"
    assert host_ranges([_host(3)]) == "s0/w3"


def test_collect_script_signals_only_the_runs_processes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _hooked(run_dir, PROGRAM)
    # a stale marker whose pid is alive but not ours (this test process): never signalled
    (run_dir / "hook" / f"{os.getpid()}.ready").write_text("not the job")
    (run_dir / "hook" / f"{os.getpid()}.txt").write_text("")
    try:
        wait_for((run_dir / "hook" / f"{proc.pid}.ready").exists, 20, "the hook")
        wait_for(lambda: _asleep(proc.pid), 20, "train.py asleep in step() and loader()")
        out = subprocess.run(
            collect_command(str(run_dir)),
            shell=True,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    dump = parse_collect(_host(1), out)
    assert dump.stacks.error is None
    [process] = dump.stacks.processes
    assert process.pid == proc.pid
    assert "train.py" in process.command
    main = process.main_thread
    assert main is not None
    assert str(main.frames[0]).endswith("train.py:6 in step")
    assert (run_dir / "hook" / f"{os.getpid()}.txt").read_text() == ""


def test_collect_without_hook_or_process(tmp_path: Path) -> None:
    out = subprocess.run(
        collect_command(str(tmp_path)), shell=True, capture_output=True, text=True, check=True
    ).stdout
    assert "no stack hook" in str(parse_collect(_host(0), out).stacks.error)
    (tmp_path / "hook").mkdir()
    out = subprocess.run(
        collect_command(str(tmp_path)), shell=True, capture_output=True, text=True, check=True
    ).stdout
    assert parse_collect(_host(0), out).stacks.error == "no Python process of the run is alive"


def test_collect_script_is_clean_sh() -> None:
    text = remote.load("stacks").text
    subprocess.run(["sh", "-n", "-c", text], check=True)
    lint = subprocess.run(
        ["shellcheck", "--shell=sh", "-"], input=text, text=True, capture_output=True
    )
    assert lint.returncode == 0, lint.stdout


def test_status_line_names_silent_hosts() -> None:
    from multihost.cli import report
    from multihost.model import State

    hosts = [_host(w) for w in range(5)]
    states = {h.process_id: State.RUNNING for h in hosts}
    silent = {hosts[3]: 252.0, hosts[1]: 61.0, hosts[0]: 3700.0, hosts[4]: 90.0}
    text = report.status_line("r", states, 400.0, silent).plain
    assert "4 host(s) silent > 1m01s: s0/w0 1h01m, s0/w3 4m12s, s0/w4 1m30s, +1" in text
    assert "silent" not in report.status_line("r", states, 400.0, {}).plain


def test_sigquit_in_the_live_run_prints_grouped_stacks(
    code: Path, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-\\ (SIGQUIT) to a running ``multihost run``: stacks now, and the run goes on."""
    from tests.clitools import spawn

    monkeypatch.setenv("HOME", str(tmp_path))
    (code / "train.py").write_text(PROGRAM)
    logs = tmp_path / "logs"
    proc = spawn(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "q",
            "--grace",
            "2",
            "--cmd",
            f"{sys.executable} train.py",
        ]
    )
    try:
        hooks = ".cache/multihost/local/w*/runs/q/hook/*.ready"
        wait_for(lambda: len(_hooked_pids(hooks, tmp_path)) == 2, 30, "both hooks")
        wait_for(lambda: all(map(_asleep, _hooked_pids(hooks, tmp_path))), 20, "both asleep")
        proc.send_signal(signal.SIGQUIT)
        # both hosts' stacks saved: the report is said in the same step, before any signal
        wait_for(
            lambda: len(list((logs / "q" / "stacks").glob("*/*.txt"))) == 2,
            30,
            "both hosts' saved stacks",
        )
        assert proc.poll() is None  # still running
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "stacks (on request)" in err
    assert "[s0/w0-1] ×2" in err
    assert "train.py:6 in step" in err


def test_api_returns_grouped_stacks_as_data(code: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import multihost

    monkeypatch.setenv("HOME", str(tmp_path))
    (code / "train.py").write_text(PROGRAM)
    logs = tmp_path / "logs"
    multihost.run(
        f"{sys.executable} train.py",
        local=2,
        script_dir=code,
        run_name="api",
        log_dir=logs,
        detach=True,
        stream="none",
    )
    try:
        hooks = ".cache/multihost/local/w*/runs/api/hook/*.ready"
        wait_for(lambda: len(_hooked_pids(hooks, tmp_path)) == 2, 30, "both hooks")
        wait_for(lambda: all(map(_asleep, _hooked_pids(hooks, tmp_path))), 20, "both asleep")
        report = multihost.stacks("api", log_dir=logs)
    finally:
        multihost.kill("api", log_dir=logs, grace=2)
    [both] = report.groups
    assert host_ranges(both.hosts) == "s0/w0-1"
    assert str(both.frames[0]).endswith("train.py:6 in step")
    assert report.stragglers == ()
