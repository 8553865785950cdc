"""Hangs on the real sshd fleet with real multi-process JAX: one host never joins a collective.

Process 3 sleeps before an all-process collective; the other 7 wait inside it. ``multihost
stack`` must show two groups (7 in the collective, s0/w3 in time.sleep at the user's line), and
``--hang-timeout`` must take the same stacks by itself, name s0/w3 and stop the run.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from multihost.diagnose.collect import collect_command, parse_collect
from multihost.model import Host
from tests.clitools import cli, fleet_run_args, manifest, no_processes
from tests.helpers import free_port, wait_for

pytestmark = [pytest.mark.jax, pytest.mark.usefixtures("fresh_runs")]
N = 8
STUCK = """\
import os, time
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils

jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"],
                           int(os.environ["JAX_PROCESS_COUNT"]), int(os.environ["JAX_PROCESS_ID"]))
print("joined", flush=True)
if jax.process_index() == 3:
    time.sleep(3600)  # the straggler: line 9
total = multihost_utils.process_allgather(jnp.ones(2))  # everyone else waits here: line 10
print("sum", float(total.sum()), flush=True)
"""


@pytest.fixture
def code(code: Path) -> Path:
    """The shared code dir plus the stuck program and a slow one."""
    (code / "stuck.py").write_text(STUCK)
    (code / "slow.py").write_text(
        "import time\nfor i in range(12):\n    print('step', i, flush=True)\n    time.sleep(1)\n"
    )
    return code


def _args(
    fleet, remote_jax, code: Path, logs: Path, run: str, script: str, *extra: str
) -> list[str]:  # type: ignore[no-untyped-def]
    return fleet_run_args(
        fleet,
        code,
        logs,
        run,
        f"{remote_jax['PYTHON']} {script}",
        N,
        "--env",
        f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--env",
        f"XLA_FLAGS={remote_jax['XLA_FLAGS']}",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--coordinator-port",
        str(free_port()),
        *extra,
    )


def _joined(fleet, run: str) -> bool:  # type: ignore[no-untyped-def]
    """Every host's own log says it joined (a detached run streams nothing locally)."""
    logs = [Path(h.home) / ".multihost" / "runs" / run / "log" for h in fleet.hosts[:N]]
    return all(p.is_file() and "joined" in p.read_text() for p in logs)


def _in_the_collective(fleet, run: str) -> bool:  # type: ignore[no-untyped-def]
    """s0/w3 asleep at line 9 and every other process inside the allgather, as their hooks
    show it: the collection script ``stack`` runs on a host, run here on each host's run dir."""
    scripts = [
        subprocess.Popen(
            collect_command(str(h.home / ".multihost" / "runs" / run)),
            shell=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        for h in fleet.hosts[:N]
    ]
    outs = [script.communicate(timeout=60)[0] for script in scripts]
    for i, out in enumerate(outs):
        dump = parse_collect(Host(f"h{i}", worker_id=i, process_id=i), out)
        frames = [f for p in dump.stacks.processes for t in p.threads for f in t.frames]
        if i == 3:
            if not any(f.file.endswith("stuck.py") and f.line == 9 for f in frames):
                return False
        elif not any("multihost_utils" in f.file for f in frames):
            return False
    return True


def test_stack_groups_the_straggler(ssh_fleet, remote_jax, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    res = cli([*_args(ssh_fleet, remote_jax, code, logs, "hang", "stuck.py"), "--detach"])
    assert res.returncode == 0, res.stderr
    try:
        wait_for(lambda: _joined(ssh_fleet, "hang"), 120, "every process to join")
        wait_for(lambda: _in_the_collective(ssh_fleet, "hang"), 60, "7 in the collective")
        started = time.monotonic()
        stack = cli(["stack", "hang", "--log-dir", str(logs), "--json"])
        took = time.monotonic() - started
        assert stack.returncode == 0, stack.stderr
        report = json.loads(stack.stdout)
        print(f"stack on {N} hosts took {took:.1f} s")
        assert took < 10
        assert report["stragglers"] == "s0/w3"
        odd, most = report["groups"]
        assert (odd["hosts"], most["size"]) == ("s0/w3", 7)
        assert {"file": "stuck.py", "line": 9, "function": "<module>"} in odd["frames"]
        assert odd["frames"][0]["function"] == "sleep" or "stuck.py" in odd["frames"][0]["file"]
        assert most["frames"][-1] == {"file": "stuck.py", "line": 10, "function": "<module>"}
        assert any("multihost_utils" in f["file"] for f in most["frames"])
        saved = sorted(Path(report["saved"]).iterdir())
        assert [p.name for p in saved] == [f"slice_0000_worker_{i:04d}.txt" for i in range(N)]
    finally:
        killed = cli(["kill", "hang", "--log-dir", str(logs), "--grace", "2"])
    assert killed.returncode == 0, killed.stderr
    left = [ssh_fleet.user_processes(i) for i in range(N)]
    wait_for(lambda: no_processes(ssh_fleet, N), 20, f"every host's processes to be gone: {left}")
    finished = cli(["stack", "hang", "--log-dir", str(logs)])
    assert finished.returncode == 2
    assert "no stacks to take" in finished.stderr
    unknown = cli(["stack", "nope", "--log-dir", str(logs)])
    assert unknown.returncode == 2
    assert unknown.stderr.count("\n") == 1


def test_hang_timeout_names_straggler_and_stops(
    ssh_fleet, remote_jax, code: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    started = time.monotonic()
    res = cli(
        _args(ssh_fleet, remote_jax, code, logs, "auto", "stuck.py", "--hang-timeout", "20"),
        timeout=240,
    )
    took = time.monotonic() - started
    assert res.returncode == 1, res.stderr
    assert "straggler(s): s0/w3" in res.stderr
    record = manifest(logs, "auto")
    assert record["first_failure"].startswith("hang: no output for")
    assert "s0/w3" in record["first_failure"]
    assert len(list((logs / "auto" / "stacks").iterdir())) == 1
    joined = max(p.stat().st_mtime for p in (logs / "auto").glob("*.log"))
    print(f"hang-timeout 20: the run took {took:.1f} s")
    assert time.time() - joined < 20 + 15 + 5
    wait_for(lambda: no_processes(ssh_fleet, N), 20, "every host's processes to be gone")


def test_slow_but_printing_keeps_running(ssh_fleet, remote_jax, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    res = cli(
        _args(ssh_fleet, remote_jax, code, logs, "slow", "slow.py", "--hang-timeout", "4"),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert not (logs / "slow" / "stacks").exists()
