"""Runs outlive the runner: SIGKILL then attach, sshd restarts, detach/status/kill, logs, clean."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.clitools import cli, fleet_run_args, host_logs, manifest, no_processes, spawn
from tests.helpers import wait_for

N = 4
COUNT = 50  # numbered lines per host, one every 0.1 s
NUMBERED = f'for i in $(seq 1 {COUNT}); do echo "$JAX_PROCESS_ID line $i"; sleep 0.1; done'


pytestmark = pytest.mark.usefixtures("fresh_runs")


def _args(fleet, code: Path, logs: Path, run: str, cmd: str, n: int = N) -> list[str]:  # type: ignore[no-untyped-def]
    return fleet_run_args(fleet, code, logs, run, cmd, n)


def _watchers(fleet) -> list[str]:  # type: ignore[no-untyped-def]
    return [cmd for i in range(N) for _, cmd in fleet.user_processes(i) if "tail" in cmd]


def _exactly_once(text: str, pid: int) -> None:
    assert text == "".join(f"{pid} line {i}\n" for i in range(1, COUNT + 1))


def _unseen_lines(fleet, logs: Path, run: str, i: int) -> int:  # type: ignore[no-untyped-def]
    """Lines host ``i``'s job has written that the runner has not received yet."""
    remote = fleet.hosts[i].home / ".multihost" / "runs" / run / "log"
    local = host_logs(logs, run).get(f"slice_0000_worker_{i:04d}", "")
    return remote.read_text().count("\n") - local.count("\n")


def _no_processes(fleet, n: int = N) -> bool:  # type: ignore[no-untyped-def]
    return no_processes(fleet, n)


def test_sigkilled_runner_then_attach(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = f'{NUMBERED}; exit "$((JAX_PROCESS_ID == 3 ? 3 : 0))"'
    proc = spawn([*_args(ssh_fleet, code, logs, "k9", cmd), "--no-fail-fast"])
    wait_for(
        lambda: (
            len(host_logs(logs, "k9")) == N
            and all("line 5\n" in t for t in host_logs(logs, "k9").values())
        ),
        60,
    )
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    # the hosts saw the runner go (its watchers' pipes closed) ...
    wait_for(lambda: not _watchers(ssh_fleet), 10, "the remote watchers to exit")
    assert not _no_processes(ssh_fleet)  # ... and the jobs outlive the runner
    res = cli(["attach", "k9", "--log-dir", str(logs), "--stream", "all"])
    assert res.returncode == 1, res.stderr  # host 3 exits 3
    for i, text in enumerate(host_logs(logs, "k9").values()):
        assert text.count("\n") == COUNT, res.stderr[-3000:]
        _exactly_once(text, i)
        remote = ssh_fleet.hosts[i].home / ".multihost" / "runs" / "k9" / "log"
        assert remote.read_text() == text
    data = manifest(logs, "k9")
    assert [h["exit_code"] for h in data["hosts"]] == [0, 0, 0, 3]
    assert [h["state"] for h in data["hosts"]] == ["done", "done", "done", "failed"]


def test_sigkilled_runner_leaves_no_watchers(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A quiet job: the watchers never write, so they must notice by themselves that nobody reads
    # them any more (GNU tail sees its pipe close; the watch loop also checks for its parent).
    logs = tmp_path / "logs"
    proc = spawn(_args(ssh_fleet, code, logs, "quiet", "sleep 30", n=2))

    def watching() -> bool:  # this run's: an earlier test's watchers may still be exiting
        record = logs / "quiet" / "run.json"
        running = record.exists() and all(
            h["state"] == "running" for h in manifest(logs, "quiet")["hosts"]
        )
        return running and len(_watchers(ssh_fleet)) >= 2

    wait_for(watching, 30, "the run's watchers to start")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_for(lambda: not _watchers(ssh_fleet), 5, "the remote watchers to exit")
    assert not _no_processes(ssh_fleet, 2)  # while the jobs go on
    assert cli(["kill", "quiet", "--log-dir", str(logs)]).returncode == 0


def test_sshd_restart_resumes_without_gap(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    proc = spawn([*_args(ssh_fleet, code, logs, "blip", NUMBERED), "--stream", "all"])
    try:
        wait_for(
            lambda: "line 10\n" in host_logs(logs, "blip").get("slice_0000_worker_0002", ""), 60
        )
        ssh_fleet.stop_host(2)
        wait_for(
            lambda: manifest(logs, "blip")["hosts"][2]["state"] == "reconnecting",
            20,
            "the host to show as reconnecting",
        )
        wait_for(
            lambda: _unseen_lines(ssh_fleet, logs, "blip", 2) >= 10,
            20,
            "10 lines written on the host while it cannot be reached",
        )
        ssh_fleet.start_host(2)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        ssh_fleet.start_host(2)
    assert proc.returncode == 0, err
    for i, text in enumerate(host_logs(logs, "blip").values()):
        _exactly_once(text, i)


def test_host_lost_past_reconnect_timeout(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = "echo up; sleep 120"
    proc = spawn([*_args(ssh_fleet, code, logs, "lost", cmd), "--reconnect-timeout", "3"])
    try:
        wait_for(
            lambda: (
                len(host_logs(logs, "lost")) == N
                and all("up" in t for t in host_logs(logs, "lost").values())
            ),
            60,
        )
        ssh_fleet.stop_host(1)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
        ssh_fleet.start_host(1)
    assert proc.returncode == 1
    data = manifest(logs, "lost")
    assert [h["state"] for h in data["hosts"]] == ["killed", "lost", "killed", "killed"]
    assert "gave up reconnecting" in data["hosts"][1]["error"]
    assert "s0/w1" in err
    # the lost host's job kept running where we could not reach it; kill finishes the job
    assert ssh_fleet.user_processes(1)
    res = cli(["kill", "lost", "--log-dir", str(logs), "--grace", "2"])
    assert res.returncode == 0, res.stderr
    wait_for(lambda: _no_processes(ssh_fleet), 15, "every host's processes to be gone")


def test_detach_status_kill_status(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    res = cli([*_args(ssh_fleet, code, logs, "det", "echo hi; sleep 120"), "--detach"])
    assert res.returncode == 0, res.stderr
    assert "multihost attach det" in res.stdout
    wait_for(lambda: all(ssh_fleet.user_processes(i) for i in range(N)), 10)
    status = cli(["status", "det", "--log-dir", str(logs), "--json"])
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    assert [r["state"] for r in rows] == ["running"] * N
    wait_for(
        lambda: all(
            r["last line"] == "hi"
            for r in json.loads(cli(["status", "det", "--log-dir", str(logs), "--json"]).stdout)
        ),
        10,
    )

    killed = cli(["kill", "det", "--log-dir", str(logs), "--grace", "2"])
    assert killed.returncode == 0, killed.stderr
    wait_for(lambda: _no_processes(ssh_fleet), 10, "every host's processes to be gone")
    assert [h["state"] for h in manifest(logs, "det")["hosts"]] == ["killed"] * N
    again = cli(["kill", "det", "--log-dir", str(logs)])  # idempotent
    assert again.returncode == 0, again.stderr

    ssh_fleet.stop_host(0)  # a finished run's status needs no host
    try:
        final = cli(["status", "det", "--log-dir", str(logs), "--json"])
    finally:
        ssh_fleet.start_host(0)
    assert final.returncode == 0, final.stderr
    assert [r["state"] for r in json.loads(final.stdout)] == ["killed"] * N
    assert all(r["exit"] == "signal 15" for r in json.loads(final.stdout))


def test_logs_follow_ls_and_clean(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    res = cli([*_args(ssh_fleet, code, logs, "fol", NUMBERED, n=2), "--detach"])
    assert res.returncode == 0, res.stderr
    follow = cli(["logs", "fol", "--log-dir", str(logs), "--follow"])
    assert follow.returncode == 0, follow.stderr
    assert f"[s0/w1] 1 line {COUNT}" in follow.stdout
    for i, text in enumerate(host_logs(logs, "fol").values()):
        _exactly_once(text, i)
    one = cli(["logs", "fol", "--log-dir", str(logs), "--host", "s0/w1"])
    assert one.stdout == "".join(f"1 line {i}\n" for i in range(1, COUNT + 1))
    bad = cli(["logs", "fol", "--log-dir", str(logs), "--host", "s9/w9"])
    assert bad.returncode == 2

    listed = cli(["ls", "--log-dir", str(logs)])
    assert "fol" in listed.stdout
    assert "2 done" in listed.stdout

    kept = cli(["clean", "--older-than", "1d", "--log-dir", str(logs)])
    assert "nothing older" in kept.stdout
    remote = ssh_fleet.hosts[1].home / ".multihost" / "runs" / "fol"
    assert remote.is_dir()
    code_dirs = ssh_fleet.hosts[1].home / ".multihost" / "code"
    staged = {d.name for d in code_dirs.iterdir()}
    assert manifest(logs, "fol")["code_hash"] in staged
    in_use = code_dirs / "f00dfeedf00dfeed"  # a staged dir another (still present) run uses
    in_use.mkdir(exist_ok=True)  # (a run of this test killed midway leaves it)
    other = ssh_fleet.hosts[1].home / ".multihost" / "runs" / "other"
    other.mkdir(parents=True)
    (other / "job.sh").write_text(f"cd {in_use} || exit 126\n")
    for made in (in_use, other.parent, other, other / "job.sh"):
        shutil.chown(made, ssh_fleet.hosts[1].user, ssh_fleet.hosts[1].user)
    gone = cli(["clean", "--older-than", "0s", "--log-dir", str(logs)])
    assert "removed fol" in gone.stdout
    assert "staged code dir(s)" in gone.stdout
    assert not (logs / "fol").exists()
    assert not remote.exists()
    assert manifest_hash_gone(code_dirs, staged - {in_use.name})
    assert in_use.is_dir()
    shutil.rmtree(in_use)
    assert cli(["clean", "--older-than", "soon", "--log-dir", str(logs)]).returncode == 2


def manifest_hash_gone(code_dirs: Path, names: set[str]) -> bool:
    return not any((code_dirs / n).exists() for n in names)
