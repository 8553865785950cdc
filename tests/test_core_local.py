"""The pipeline over the local transport: no sshd, no root — the fast tier that runs first.

Fail-fast, stopping, timeouts, reattach by byte offset, detach/status/kill and the summary are
the same code over ``--local`` as over SSH; each test gets its own HOME (where local workers
keep their state) and log dir.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import sys
from pathlib import Path

import pytest

import multihost
from multihost.runs.record import SCHEMA, RecordError, dumps, from_json, read_record, to_json
from tests.clitools import cli, host_logs, manifest, spawn
from tests.helpers import wait_for

N = 3
COUNT = 30  # numbered lines per host, one every 0.05 s
NUMBERED = f'for i in $(seq 1 {COUNT}); do echo "$JAX_PROCESS_ID line $i"; sleep 0.05; done'


def _run(code: Path, logs: Path, run: str, cmd: str, *extra: str, n: int = N) -> list[str]:
    return [
        "run",
        "--local",
        str(n),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        run,
        "--grace",
        "2",
        *extra,
        "--cmd",
        cmd,
    ]


def _alive(home: Path, run: str, n: int = N) -> list[int]:
    """Process groups of the run's workers still alive (read from /proc, not from the runner)."""
    alive = []
    for i in range(n):
        pid_file = home / ".cache/multihost/local" / f"w{i}" / "runs" / run / "pid"
        if pid_file.is_file():
            pgid = int(pid_file.read_text())
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    try:
                        state, _, group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                        if int(group) == pgid and state != "Z":  # zombies wait for a late reaper
                            alive.append(pgid)
                            break
                    except (OSError, IndexError, ValueError):
                        continue
    return alive


def test_success_env_logs_and_record(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = 'cat x.txt; echo "env $JAX_PROCESS_ID/$JAX_PROCESS_COUNT $MULTIHOST_RUN"'
    res = cli(_run(code, logs, "ok", cmd), HOME=str(home))
    assert res.returncode == 0, res.stderr
    assert f"all {N} hosts succeeded" in res.stderr
    for i, text in enumerate(host_logs(logs, "ok").values()):
        assert text == f"staged\nenv {i}/{N} ok\n"
    record = read_record(logs / "ok")
    assert record.schema == SCHEMA
    assert [h.state for h in record.hosts] == [multihost.State.DONE] * N
    assert [h.exit_code for h in record.hosts] == [0] * N
    assert record.hosts[0].env is not None
    assert record.hosts[0].env["JAX_PROCESS_ID"] == "0"
    assert "remote_run_dir" not in manifest(logs, "ok")["hosts"][0]


def test_fail_fast_names_the_host_and_stops_the_rest(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    cmd = '[ "$JAX_PROCESS_ID" = 1 ] && { echo boom; exit 3; }; sleep 30'
    res = cli(_run(code, logs, "ff", cmd), HOME=str(home), timeout=40)
    assert res.returncode == 1
    assert "s0/w1 exited with code 3" in res.stderr
    states = [h["state"] for h in manifest(logs, "ff")["hosts"]]
    assert states == ["killed", "failed", "killed"]
    assert manifest(logs, "ff")["first_failure"] == "s0/w1 exited with code 3"
    assert _alive(home, "ff") == []


def test_no_fail_fast_waits_for_all(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = '[ "$JAX_PROCESS_ID" = 0 ] && exit 4; sleep 1; echo finished'
    res = cli(_run(code, logs, "nff", cmd, "--no-fail-fast"), HOME=str(home))
    assert res.returncode == 1
    assert [h["state"] for h in manifest(logs, "nff")["hosts"]] == ["failed", "done", "done"]


def test_timeout_stops_everywhere(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = cli(_run(code, logs, "to", "sleep 30", "--timeout", "1.5"), HOME=str(home), timeout=40)
    assert res.returncode == 1
    assert "timed out" in res.stderr
    assert manifest(logs, "to")["timed_out"] is True
    assert _alive(home, "to") == []


def test_ctrl_c_stops_every_host(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = spawn(_run(code, logs, "int", "echo up; sleep 30"))
    wait_for(lambda: len(_alive(home, "int")) == N, 20, "every worker to start")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert [h["state"] for h in manifest(logs, "int")["hosts"]] == ["killed"] * N
    assert _alive(home, "int") == []


def test_sigkilled_runner_then_attach_every_line_once(
    home: Path, code: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    proc = spawn(_run(code, logs, "sk", NUMBERED))
    wait_for(
        lambda: any(t.count("line") >= 5 for t in host_logs(logs, "sk").values()), 20, "some lines"
    )
    proc.kill()
    proc.communicate()
    res = cli(["attach", "sk", "--log-dir", str(logs)], HOME=str(home))
    assert res.returncode == 0, res.stderr
    for pid, text in enumerate(host_logs(logs, "sk").values()):
        assert text == "".join(f"{pid} line {i}\n" for i in range(1, COUNT + 1))


def test_detach_status_kill(home: Path, code: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = cli(_run(code, logs, "det", "sleep 30", "--detach"), HOME=str(home))
    assert res.returncode == 0, res.stderr
    assert f"started on {N} host(s)" in res.stdout
    assert f"attach: multihost attach det --log-dir {logs}\n" in res.stdout
    # in the default log dir, the hint does not repeat it
    default = ["run", "--local", "1", "--script-dir", str(code), "--run-name", "det0"]
    plain = cli(
        [*default, "--detach", "--cmd", "true"], HOME=str(home), MULTIHOST_LOG_DIR=str(logs)
    )
    assert plain.stdout.splitlines()[-1] == "attach: multihost attach det0", plain.stdout
    status = cli(["status", "det", "--log-dir", str(logs), "--json"], HOME=str(home))
    assert [r["state"] for r in json.loads(status.stdout)] == ["running"] * N
    killed = cli(["kill", "det", "--log-dir", str(logs), "--grace", "2"], HOME=str(home))
    assert killed.returncode == 0, killed.stderr
    assert [h["state"] for h in manifest(logs, "det")["hosts"]] == ["killed"] * N
    assert _alive(home, "det") == []
    status = cli(["status", "det", "--log-dir", str(logs), "--json"], HOME=str(home))
    assert [r["state"] for r in json.loads(status.stdout)] == ["killed"] * N


def test_python_api(home: Path, code: Path, tmp_path: Path) -> None:
    result = multihost.run(
        "echo $JAX_PROCESS_ID", local=2, script_dir=code, run_name="api", log_dir=tmp_path / "l"
    )
    assert result.exit_code == 0
    assert [(r.host.name, r.state) for r in result.hosts] == [
        ("s0/w0", multihost.State.DONE),
        ("s0/w1", multihost.State.DONE),
    ]


def test_watcher_error_is_not_swallowed(
    home: Path, code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a watcher surfaces (the TaskGroup raises it) instead of vanishing."""
    from multihost.runs import stream

    async def broken(self: stream.Follower) -> stream.Exit:
        raise RuntimeError("bug in a watcher")

    monkeypatch.setattr(stream.Follower, "follow", broken)
    with pytest.raises(ExceptionGroup) as info:
        multihost.run("true", local=2, script_dir=code, run_name="bug", log_dir=tmp_path / "l")
    assert info.group_contains(RuntimeError, match="bug in a watcher")


def test_record_round_trip_and_newer_schema(home: Path, code: Path, tmp_path: Path) -> None:
    multihost.run("echo hi", local=2, script_dir=code, run_name="rt", log_dir=tmp_path / "l")
    record = read_record(tmp_path / "l" / "rt")
    assert from_json(to_json(record)) == record
    newer = {**to_json(record), "schema": SCHEMA + 1}
    with pytest.raises(RecordError, match="newer multihost"):
        from_json(newer)
    old = {**to_json(record), "version": 1}
    del old["schema"]
    assert dataclasses.replace(from_json(old), schema=record.schema) == record
    back = from_json(to_json(record), tmp_path / "l" / "rt")
    assert [h.env for h in back.hosts] == [h.env for h in record.hosts]  # env is not compared
    assert [h.log for h in back.hosts] == [h.log for h in record.hosts]


OLD = Path(__file__).parent / "fixtures" / "runrecord" / "old"  # written by multihost before
# a host's entry in run.json was its HostResult (a failed host, two stopped by fail-fast)


def test_a_record_of_the_previous_layout_reads_and_writes_back_the_same() -> None:
    record = read_record(OLD)
    assert record.state == "failed"
    failed, killed = record.hosts[0], record.hosts[1]
    assert failed.reason == "exited with code 3"
    assert failed.last_line == "bad"
    assert (killed.state, killed.exit_code, killed.signal) == (multihost.State.KILLED, 143, 15)
    assert killed.error == "stopped by multihost (SIGTERM)"
    assert killed.env is not None
    assert killed.env["JAX_PROCESS_ID"] == "1"
    assert killed.log == OLD / "slice_0000_worker_0001.log"
    assert record.logs(OLD) == {h.host.process_id: h.log for h in record.hosts}
    assert dumps(to_json(record)) == (OLD / "run.json").read_text()  # the layout, to the byte


@pytest.mark.parametrize("via", ["direct", "peer"])
def test_a_host_step_runs_before_the_launch_and_its_failure_starts_nothing(
    home: Path, code: Path, tmp_path: Path, via: str
) -> None:
    """An extra per-host preparation step (``core.HostStep``) runs on every host once the code
    is there and before anything starts; when it fails on one host, that host is named, no host
    keeps the run's directory and no job starts anywhere (pipelined, and phased by --stage-via)."""
    import asyncio

    from multihost.api.runs import plan_run
    from multihost.core import HostStep, Run
    from multihost.core.supervisor import Supervisor
    from multihost.errors import RemoteError
    from multihost.remote.commands import shell_path

    seen: dict[int, str] = {}

    async def check(sup: Supervisor, host: multihost.Host) -> None:
        conn = sup.slots[host.process_id].conn
        assert conn is not None
        res = await conn.run(f"cat {shell_path(sup.paths(host).code)}/x.txt")
        seen[host.process_id] = res.stdout.decode().strip()
        if host.process_id == 1 and sup.job.run_name == "bad":
            raise RemoteError(host, "env sync failed")

    for name in ("good", "bad"):
        plan = plan_run(
            'echo ran > "$HOME"/ran.$MULTIHOST_RUN.$JAX_PROCESS_ID',
            {"local": N, "script_dir": code, "run_name": name, "log_dir": tmp_path / "l"},
        )
        options = dataclasses.replace(plan.options, stage_via=via)
        run = Run(plan.fleet, plan.job, options, steps=[HostStep("env sync", check, 10)])
        result = asyncio.run(run.execute())
        assert seen == dict.fromkeys(range(N), "staged")
        seen.clear()
        if name == "good":
            assert result.exit_code == 0
            assert len(list(home.glob("ran.good.*"))) == N
            continue
        assert result.exit_code != 0
        assert result.first_failure == "s0/w1 env sync failed"
        assert {r.error for r in result.hosts} == {
            "env sync failed",
            "not started: s0/w1 could not be prepared",
        }
        assert not list(home.glob("ran.bad.*"))
        workers = home / ".cache/multihost/local"
        assert not [w for w in workers.iterdir() if (w / "runs" / "bad").exists()]


def test_ctrl_c_at_the_launch_gate_starts_nothing(home: Path, code: Path, tmp_path: Path) -> None:
    """Ctrl-C while the hosts are getting ready at the gate: every gate is held, so no job
    starts anywhere and no host keeps the run's directory."""
    import asyncio

    from multihost.api.runs import plan_run
    from multihost.core import Run
    from multihost.events import HostEvent

    plan = plan_run(
        'echo ran > "$HOME"/ran.$JAX_PROCESS_ID',
        {"local": N, "script_dir": code, "run_name": "gate", "log_dir": tmp_path / "l"},
    )
    runs: list[Run] = []

    def on_event(event: object) -> None:
        if isinstance(event, HostEvent) and event.state is multihost.State.STARTING:
            runs[0].interrupt()  # the first host to reach the launch: as a Ctrl-C would

    runs.append(Run(plan.fleet, plan.job, plan.options, on_event))
    result = asyncio.run(runs[0].execute())
    assert result.interrupted
    assert result.exit_code == 130
    assert {r.state for r in result.hosts} == {multihost.State.ERROR}
    assert {r.error for r in result.hosts} == {"not started: interrupted"}
    assert not list(home.glob("ran.*"))
    workers = home / ".cache/multihost/local"
    assert not [w for w in workers.iterdir() if (w / "runs" / "gate").exists()]


def test_python_is_python3_only_where_there_is_none(home: Path, code: Path, tmp_path: Path) -> None:
    """Workers whose PATH has a python3 and no python (a bin with python3 alone, then
    /usr/bin:/bin, where this machine may have none) run ``python`` as that python3, said
    once for the run; where PATH has a python (this venv's), nothing is added or said."""
    if shutil.which("python", path="/usr/bin:/bin"):
        pytest.skip("this machine has a python in /usr/bin or /bin")
    logs = tmp_path / "logs"
    only3 = tmp_path / "only3"
    only3.mkdir()
    (only3 / "python3").symlink_to(sys.executable)
    bare = f"{only3}:/usr/bin:/bin"
    cmd = "python -c 'import sys; print(sys.version_info[0])'"
    res = cli(_run(code, logs, "py3", cmd, "--stream", "all", n=2), HOME=str(home), PATH=bare)
    assert res.returncode == 0, res.stderr
    assert "[s0/w0] 3" in res.stdout
    assert "[s0/w1] 3" in res.stdout
    assert res.stderr.count("multihost: no python on 2 hosts (s0/w0-1): this run's python is") == 1
    assert f"their python3 ({only3 / 'python3'})" in res.stderr
    has = cli(_run(code, logs, "py", cmd, n=2), HOME=str(home))  # this venv's python first
    assert has.returncode == 0, has.stderr
    assert "no python on" not in has.stderr
