"""``multihost run`` against real OpenSSH hosts on loopback: staging, env, failures, signals."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests.clitools import cli, fleet_run_args, host_logs, manifest, no_processes, spawn
from tests.helpers import wait_for

N = 4


pytestmark = pytest.mark.usefixtures("fresh_runs")


@pytest.fixture
def code(code: Path) -> Path:
    """The shared code dir plus a program and a data file unique to this test."""
    (code / "hello.py").write_text("import os\nprint('hello from', os.environ['JAX_PROCESS_ID'])\n")
    (code / "data").mkdir()
    (code / "data" / "blob.txt").write_text(f"unique {time.time_ns()}\n")
    return code


def _args(fleet, code: Path, logs: Path, run: str, cmd: str, n: int = N) -> list[str]:  # type: ignore[no-untyped-def]
    return fleet_run_args(fleet, code, logs, run, cmd, n, "--stream", "all")


def _no_processes(fleet, n: int = N) -> bool:  # type: ignore[no-untyped-def]
    return no_processes(fleet, n)


def test_stage_run_and_env(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = (
        "python3 hello.py && cat data/blob.txt && "
        'echo "env $JAX_PROCESS_ID/$JAX_PROCESS_COUNT $MULTIHOST_SLICE_ID $MULTIHOST_WORKER_ID '
        "$MULTIHOST_NUM_SLICES $MULTIHOST_RUN $JAX_COORDINATOR_ADDRESS "
        '$MULTIHOST_TEST_HOST $(id -un)"'
    )
    res = cli(_args(ssh_fleet, code, logs, "r1", cmd))
    assert res.returncode == 0, res.stderr
    per_host = host_logs(logs, "r1")
    blob = (code / "data" / "blob.txt").read_text()
    for i in range(N):
        text = per_host[f"slice_0000_worker_{i:04d}"]
        assert f"hello from {i}\n" in text
        assert blob in text
        assert f"env {i}/{N} 0 {i} 1 r1 127.0.0.2:8476 h{i} {loopback.user(i)}\n" in text
        assert f"[s0/w{i}] hello from {i}" in res.stdout
    data = manifest(logs, "r1")
    assert [h["state"] for h in data["hosts"]] == ["done"] * N
    assert [h["exit_code"] for h in data["hosts"]] == [0] * N
    assert all(h["bytes_sent"] > 0 for h in data["hosts"])
    assert data["hosts"][1]["env"]["JAX_PROCESS_ID"] == "1"
    # remote state is plain files, private to the user
    home = ssh_fleet.hosts[1].home
    run_dir = home / ".multihost" / "runs" / "r1"
    assert (run_dir / "exit").read_text().strip() == "0"
    assert (run_dir / "command").read_text() == cmd + "\n"
    assert (home / ".multihost").stat().st_mode & 0o077 == 0
    assert (run_dir / "log").read_text() == per_host["slice_0000_worker_0001"]

    # unchanged code: nothing is sent again
    res = cli(_args(ssh_fleet, code, logs, "r2", "true"))
    assert res.returncode == 0, res.stderr
    assert [h["bytes_sent"] for h in manifest(logs, "r2")["hosts"]] == [0] * N
    wait_for(lambda: _no_processes(ssh_fleet), 10, "host processes to end")


def test_quotes_spaces_and_dollar(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = """X='a  b'; printf '[%s]' "$X" 'lit $HOME' "$((6*7))"; echo " $JAX_PROCESS_ID" """
    res = cli([*_args(ssh_fleet, code, logs, "q", cmd, n=2), "--env", 'WEIRD=it\'s "$x" `y`'])
    assert res.returncode == 0, res.stderr
    logs_text = host_logs(logs, "q")
    assert logs_text["slice_0000_worker_0001"] == "[a  b][lit $HOME][42] 1\n"
    env_file = ssh_fleet.hosts[0].home / ".multihost" / "runs" / "q" / "env"
    assert 'WEIRD=it\'s "$x" `y`\n' in env_file.read_text()


def test_one_host_fails_others_stopped(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = 'if [ "$JAX_PROCESS_ID" = 2 ]; then sleep 1; echo "bad thing"; exit 3; fi; sleep 300'
    t0 = time.monotonic()
    res = cli(_args(ssh_fleet, code, logs, "ff", cmd))
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 30
    assert "s0/w2 failed first: exited with code 3" in res.stderr
    states = [h["state"] for h in manifest(logs, "ff")["hosts"]]
    assert states == ["killed", "killed", "failed", "killed"]
    assert manifest(logs, "ff")["hosts"][2]["last_line"] == "bad thing"
    wait_for(lambda: _no_processes(ssh_fleet), 10, "the other hosts' processes to be gone")


def test_no_fail_fast_waits_for_all(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = 'if [ "$JAX_PROCESS_ID" = 0 ]; then exit 5; fi; sleep 1; echo finished'
    res = cli([*_args(ssh_fleet, code, logs, "nff", cmd), "--no-fail-fast"])
    assert res.returncode == 1
    data = manifest(logs, "nff")
    assert [h["state"] for h in data["hosts"]] == ["failed", "done", "done", "done"]
    assert data["hosts"][0]["exit_code"] == 5


def test_ctrl_c_stops_everywhere(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    proc = spawn(_args(ssh_fleet, code, logs, "intr", "echo started; sleep 300"))
    try:
        wait_for(
            lambda: (
                all("started" in t for t in host_logs(logs, "intr").values())
                and len(host_logs(logs, "intr")) == N
            ),
            60,
            "every host to start",
        )
        assert not _no_processes(ssh_fleet)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "SIGINT" in err
    assert "Traceback" not in err
    assert {h["state"] for h in manifest(logs, "intr")["hosts"]} == {"killed"}
    wait_for(lambda: _no_processes(ssh_fleet), 10, "remote processes to be gone")


def test_sigterm_is_like_ctrl_c(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    proc = spawn(_args(ssh_fleet, code, logs, "term", "echo started; sleep 300", n=2))
    try:
        wait_for(
            lambda: (
                len(host_logs(logs, "term")) == 2
                and all("started" in t for t in host_logs(logs, "term").values())
            ),
            60,
        )
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    wait_for(lambda: _no_processes(ssh_fleet, 2), 10, "remote processes to be gone")


def test_unreachable_host(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    args = _args(ssh_fleet, code, logs, "dead", "sleep 300", n=2)
    args[args.index("--hosts") + 1] = "h0,dead,h1"
    t0 = time.monotonic()
    res = cli([*args, "--connect-timeout", "5"])
    assert time.monotonic() - t0 < 20
    assert res.returncode == 1
    data = manifest(logs, "dead")
    dead = data["hosts"][1]
    assert dead["state"] == "error"
    assert "connection refused" in dead["error"]
    assert "127.0.0.254" in dead["error"]
    assert "s0/w1" in res.stderr
    # nothing was launched anywhere when a host could not be prepared
    assert [h["state"] for h in data["hosts"]] == ["error"] * 3
    # h0 and h1 were sent their launches behind their code (core.prepare): both were held
    for h in ssh_fleet.hosts[:2]:
        assert not (h.home / ".multihost" / "runs" / "dead").exists()
    assert wait_for(lambda: _no_processes(ssh_fleet, 2), timeout=10)


def test_host_key_mismatch_refused(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    args = _args(ssh_fleet, code, logs, "bk", "true", n=1)
    args[args.index("--hosts") + 1] = "badkey"
    res = cli(args)
    assert res.returncode == 1
    err = manifest(logs, "bk")["hosts"][0]["error"]
    assert "host key not verified" in err
    assert not (ssh_fleet.hosts[0].home / ".multihost" / "runs" / "bk").exists()


def _h0_config(fleet, tmp_path: Path, alias: str, known_hosts: object) -> Path:  # type: ignore[no-untyped-def]
    """An ssh config with one entry, ``alias`` for host 0, trusting ``known_hosts``."""
    h0 = fleet.hosts[0]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {alias}\n  HostName {h0.address}\n  Port {h0.port}\n  User {h0.user}\n"
        f"  IdentityFile {fleet.key}\n  UserKnownHostsFile {known_hosts}\n"
    )
    return config


def test_accept_new_records_then_refuses_changed_key(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host = ssh_fleet.hosts[0]
    config = _h0_config(ssh_fleet, tmp_path, "tofu", tmp_path / "empty_known")
    state = tmp_path / "state"
    base = [
        "run",
        "--hosts",
        "tofu",
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--cmd",
        "true",
    ]
    strict = cli([*base, "--run-name", "s"], XDG_STATE_HOME=str(state))
    assert strict.returncode == 1
    assert "accept-new" in json.dumps(manifest(tmp_path / "logs", "s"))

    first = cli([*base, "--run-name", "a1", "--host-keys", "accept-new"], XDG_STATE_HOME=str(state))
    assert first.returncode == 0, first.stderr
    trust = state / "multihost" / "known_hosts"
    names, kind = trust.read_text().split()[:2]
    assert f"[{host.address}]:{host.port}" in names.split(",")
    assert kind == "ssh-ed25519"
    again = cli([*base, "--run-name", "a2", "--host-keys", "accept-new"], XDG_STATE_HOME=str(state))
    assert again.returncode == 0, again.stderr
    assert len(trust.read_text().splitlines()) == 1

    wrong = (ssh_fleet.dir / "wrong_key.pub").read_text().split()[:2]
    trust.write_text(f"[{host.address}]:{host.port} {' '.join(wrong)}\n")
    changed = cli(
        [*base, "--run-name", "a3", "--host-keys", "accept-new"], XDG_STATE_HOME=str(state)
    )
    assert changed.returncode == 1
    assert "CHANGED" in manifest(tmp_path / "logs", "a3")["hosts"][0]["error"]


def test_known_hosts_none_still_checks(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # To asyncssh ``UserKnownHostsFile none`` means "check nothing"; strict mode trusts nothing.
    config = _h0_config(ssh_fleet, tmp_path, "nokh", "none")
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--hosts",
            "nokh",
            "--ssh-config",
            str(config),
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "nokh",
            "--cmd",
            "true",
        ]
    )
    assert res.returncode == 1
    assert "host key not verified" in manifest(logs, "nokh")["hosts"][0]["error"]


def test_proxy_jump(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # h0 reached through h1; its address for the other workers is its HostName, not the alias.
    h0 = ssh_fleet.hosts[0]
    config = tmp_path / "ssh_config"
    jump = "\n".join(
        f"Host {name}\n  HostName {h0.address}\n  Port {h0.port}\n  User {h0.user}\n"
        f"  ProxyJump {via}\n  UserKnownHostsFile {ssh_fleet.known_hosts}"
        for name, via in (("viah1", ssh_fleet.aliases[1]), ("viadead", "dead"))
    )
    config.write_text(jump + "\n\n" + ssh_fleet.ssh_config.read_text())
    logs = tmp_path / "logs"
    base = [
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--connect-timeout",
        "5",
        "--cmd",
        "echo $JAX_COORDINATOR_ADDRESS",
    ]
    ok = cli(["run", "--hosts", "viah1", "--run-name", "pj", *base])
    assert ok.returncode == 0, ok.stderr
    assert host_logs(logs, "pj")["slice_0000_worker_0000"] == f"{h0.address}:8476\n"
    refused = cli(["run", "--hosts", "viadead", "--run-name", "pjd", *base])
    assert refused.returncode == 1  # the jump is really taken: through a dead host, no way in


def test_timeout_bounds_the_run(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    t0 = time.monotonic()
    res = cli([*_args(ssh_fleet, code, logs, "to", "sleep 300", n=2), "--timeout", "3"])
    assert res.returncode == 1
    assert time.monotonic() - t0 < 30
    assert "timed out" in res.stderr
    wait_for(lambda: _no_processes(ssh_fleet, 2), 10, "remote processes to be gone")


def test_local_matches_ssh(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cmd = 'python3 hello.py; echo "$JAX_PROCESS_ID $JAX_PROCESS_COUNT $MULTIHOST_WORKER_ID"; exit 0'
    ssh = cli(_args(ssh_fleet, code, tmp_path / "a", "same", cmd))
    local = cli(
        [
            "run",
            "--local",
            str(N),
            "--script-dir",
            str(code),
            "--log-dir",
            str(tmp_path / "b"),
            "--run-name",
            "same",
            "--cmd",
            cmd,
        ],
        HOME=str(tmp_path / "home"),
    )
    assert ssh.returncode == local.returncode == 0, local.stderr
    assert host_logs(tmp_path / "a", "same") == host_logs(tmp_path / "b", "same")
    states = [[h["state"] for h in manifest(tmp_path / d, "same")["hosts"]] for d in "ab"]
    assert states[0] == states[1] == ["done"] * N


def test_no_python_on_the_host_runs_its_python3(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The fleet's hosts are as a TPU VM is: python3, and no ``python`` on the login PATH. A
    run's ``python`` is their python3 (last on the run's PATH, as a venv's bin would be
    first), said once for the run, not per host; with ``--detach`` too. A run that sets PATH
    itself gets no such python, and is told nothing."""
    probe = subprocess.run(
        ["ssh", "-F", str(ssh_fleet.ssh_config), "h0", "command -v python || echo none"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "none", probe  # no python on the host, as on a TPU VM
    logs = tmp_path / "logs"
    shown = 'sys.version_info[0], sys.executable.endswith("/bin/python")'
    cmd = f"python -c 'import sys; print({shown})'"
    res = cli(_args(ssh_fleet, code, logs, "py", cmd))
    assert res.returncode == 0, res.stderr
    for i in range(N):
        assert f"[s0/w{i}] 3 True" in res.stdout
    said = [ln for ln in res.stderr.splitlines() if "no python on" in ln]
    assert said == [
        f"multihost: no python on {N} hosts (s0/w0-{N - 1}): this run's python is their "
        "python3 (/usr/bin/python3), as in a virtual environment"
    ], res.stderr
    # --detach: the same python, said once
    outs = [h.home / "pyd.out" for h in ssh_fleet.hosts[:2]]
    for out in outs:
        out.unlink(missing_ok=True)
    detached = cli(
        [*_args(ssh_fleet, code, logs, "pyd", f'{cmd} > "$HOME"/pyd.out', n=2), "--detach"]
    )
    assert detached.returncode == 0, detached.stderr
    assert detached.stderr.count("no python on 2 hosts (s0/w0-1)") == 1, detached.stderr
    wait_for(lambda: _no_processes(ssh_fleet, 2), 10, "the detached jobs to end")
    assert [out.read_text() for out in outs] == ["3 True\n"] * 2
    for out in outs:
        out.unlink()
    # a run that sets PATH: its own, nothing added, nothing said
    bare = cli(
        [*_args(ssh_fleet, code, logs, "pyp", "python -c pass", n=2), "--env", "PATH=/usr/bin:/bin"]
    )
    assert bare.returncode == 1
    assert "python: not found" in bare.stdout + bare.stderr
    assert "no python on" not in bare.stderr
    wait_for(lambda: _no_processes(ssh_fleet), 10, "host processes to end")
