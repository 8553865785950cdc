"""A warm sweep on the real sshd fleet with real multi-process JAX on CPU: points that raise,
end their process (``os._exit``) and hang past their timeout, each failing alone while the
sweep goes on in new warm processes; a script that calls ``jax.distributed.initialize()``
itself; Ctrl-C in its middle and its runner killed. What is left on the hosts is read from
/proc (every process of the hosts' users)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.clitools import cli, no_processes, spawn
from tests.helpers import free_port, wait_for
from tests.test_warm_local import POINT

pytestmark = [pytest.mark.jax, pytest.mark.usefixtures("fresh_runs")]
N = 2


def _sweep(fleet, remote_jax, code: Path, logs: Path, name: str, kinds: str, *extra: str):  # type: ignore[no-untyped-def]
    return [
        "sweep",
        "--hosts",
        ",".join(fleet.aliases[:N]),
        "--ssh-config",
        str(fleet.ssh_config),
        "--warm",
        "--script-dir",
        str(code),
        "--log-dir",
        str(logs),
        "--run-name",
        name,
        "--grace",
        "2",
        "--coordinator-port",
        str(free_port()),
        "--env",
        f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        "JAX_NUM_CPU_DEVICES=2",
        "--metric",
        "score",
        "--cmd",
        f"{remote_jax['PYTHON']} point.py {{kind}}",
        "--grid",
        f"kind={kinds}",
        *extra,
    ]


def _rows(path: Path) -> dict[str, dict[str, object]]:
    return {r["kind"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_a_warm_sweep_over_ssh_goes_on_past_every_failure(  # type: ignore[no-untyped-def]
    ssh_fleet, remote_jax, code: Path, tmp_path: Path
) -> None:
    (code / "point.py").write_text(POINT)
    logs = tmp_path / "logs"
    kinds = "ok,raise,okay,exit,fine,hang,good"
    args = _sweep(ssh_fleet, remote_jax, code, logs, "wss", kinds, "--point-timeout", "20")
    res = cli(args, timeout=900)
    assert res.returncode == 1, res.stderr[-3000:]
    rows = _rows(logs / "wss" / "results.jsonl")
    assert "raised RuntimeError: this point raised" in str(rows["raise"]["status"])
    assert rows["exit"]["status"] == "failed: s0/w1 exited with code 9 (its warm process ended)"
    assert rows["hang"]["status"] == "timed out after 20 s"
    for kind in ("ok", "okay", "fine", "good"):
        assert rows[kind]["status"] == "ok"
        assert rows[kind]["devices"] == 4  # its own initialize() a no-op: one job, 2 hosts
    assert rows["ok"]["pid"] == rows["okay"]["pid"] != rows["fine"]["pid"] != rows["good"]["pid"]
    assert "reproduce: multihost run --hosts" in res.stdout
    wait_for(lambda: no_processes(ssh_fleet, N), 30, "nothing left on the hosts")


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_a_warm_sweep_over_ssh_stopped_in_its_middle_leaves_nothing(  # type: ignore[no-untyped-def]
    ssh_fleet, remote_jax, code: Path, tmp_path: Path, how: str
) -> None:
    (code / "point.py").write_text(POINT)
    logs = tmp_path / "logs"
    proc = spawn(_sweep(ssh_fleet, remote_jax, code, logs, "wsc", "ok,hang,good"))
    hang = logs / "wsc" / "kindhang" / "slice_0000_worker_0001.log"
    try:
        wait_for(lambda: hang.is_file() and "hanging" in hang.read_text(), 300, "the hang point")
        assert all(ssh_fleet.user_processes(i) for i in range(N))
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, err[-2000:]
        else:
            proc.kill()  # the connections drop: each warm process sees its channel gone
            proc.communicate(timeout=30)
        wait_for(lambda: no_processes(ssh_fleet, N), 60, "nothing left on the hosts")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert list(_rows(logs / "wsc" / "results.jsonl")) == ["ok"]
