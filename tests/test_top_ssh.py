"""``multihost top``, ``attach --gather`` and ``plot`` over the real sshd fleet: four hosts
run one real JAX job (CPU) in which s0/w2 sleeps before each step. ``top --once --json``
names it over one connection per host; a process stopped with SIGSTOP marks every host stuck
(the stopped one "stopped"); attaching with ``--gather`` shows each step's line once; the
picture comes from the hosts' own step logs; nothing is left on any host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.clitools import cli, fleet_run_args, no_processes
from tests.helpers import free_port, wait_for
from tests.test_top_jax import SLOWHOST

pytestmark = [pytest.mark.jax, pytest.mark.slow, pytest.mark.usefixtures("fresh_runs")]
N, SLOW = 4, 2


@pytest.fixture
def code(code: Path) -> Path:
    (code / "slowhost.py").write_text(SLOWHOST)
    return code


def _top(logs: Path) -> dict[str, Any]:
    res = cli(["top", "ssht", "--log-dir", str(logs), "--json"])
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_top_gather_and_plot_over_ssh(ssh_fleet, remote_jax, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    args = fleet_run_args(
        ssh_fleet,
        code,
        logs,
        "ssht",
        f"{remote_jax['PYTHON']} slowhost.py",
        N,
        "--env",
        f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        f"SLOW_PROCESS={SLOW}",
        "--env",
        "STOP_FILE=/nonexistent/stop",  # it runs until it is killed
        "--coordinator-port",
        str(free_port()),
        "--detach",
    )
    res = cli(args)
    assert res.returncode == 0, res.stderr
    try:

        def stepping() -> dict[str, Any] | None:
            data = _top(logs)
            ok = all(h["state"] == "stepping" and (h["steps"] or 0) >= 8 for h in data["hosts"])
            return data if ok else None

        data = wait_for(stepping, 240, "every host stepping")
        assert data["straggler"] == f"s0/w{SLOW}", data
        assert [h["host"] for h in data["hosts"] if h["slow"]] == [f"s0/w{SLOW}"]
        assert data["stuck"] == []

        out = tmp_path / "attached"
        with open(out, "w") as o, open(tmp_path / "attach.err", "w") as e:
            attach = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "multihost",
                    "attach",
                    "ssht",
                    "--log-dir",
                    str(logs),
                    "--gather",
                ],
                stdout=o,
                stderr=e,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "COLUMNS": "200"},
            )

        def grouped() -> bool:
            lines = out.read_text().splitlines()
            return sum(line.startswith("[s0/w0-3] step ") for line in lines) >= 5

        wait_for(grouped, 60, "five steps' lines, each once for every host")
        attach.send_signal(signal.SIGINT)  # detaches: the run goes on
        assert attach.wait(timeout=30) == 130
        steps = [x for x in out.read_text().splitlines() if " step " in x]
        # each step's line once for all four (its Gloo lines differ: apart); the last one
        # or two may have been cut short by the detach, which prints what it holds
        assert all(x.startswith("[s0/w0-3] step ") for x in steps[:-2]), steps

        home = ssh_fleet.hosts[1].home / ".multihost" / "runs" / "ssht" / "hook"
        (watch,) = home.glob("*.watch")
        pid = int(watch.name.split(".")[0])
        os.kill(pid, signal.SIGSTOP)
        try:

            def stuck() -> dict[str, Any] | None:
                data = _top(logs)
                return data if len(data["stuck"]) == N else None

            data = wait_for(stuck, 60, "every host marked stuck")
            rows = {h["host"]: h for h in data["hosts"]}
            assert rows["s0/w1"]["state"] == "stopped"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: not _top(logs)["stuck"], 60, "every host stepping again")
    finally:
        killed = cli(["kill", "ssht", "--log-dir", str(logs), "--grace", "2"])
    assert killed.returncode == 0, killed.stderr
    wait_for(lambda: no_processes(ssh_fleet, N), 30, "no process left on any host")
    plot = cli(["plot", "ssht", "--log-dir", str(logs)])
    assert plot.returncode == 0, plot.stderr
    assert Path(plot.stdout.strip()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{N} host(s) (s0/w0-3)" in plot.stderr
    wait_for(lambda: no_processes(ssh_fleet, N), 30, "nothing left by plot either")
