"""Where a run's start goes, per host: the staged hook's phases (``import``, ``join``,
``devices``, ``compile``, ``first_step``) brought back with each host's end, kept in run.json,
said in one line under the run's table and by ``multihost status``. The pure tier reads and
says them; the local pipeline carries a process's phase file as the hook writes it; the JAX
tier measures real multi-process JAX on CPU, locally and over the sshd fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.api import runs as api
from multihost.diagnose import hookstart
from multihost.model import Host, State
from multihost.results.phases import PHASES, cell, parse, phase_times, startup_line
from multihost.results.records import HostResult, RunResult
from multihost.runs.record import from_json, read_record, to_json
from multihost.runs.stream import parse_exit, parse_watch_end
from tests.clitools import cli, fleet_run_args, manifest, no_processes

STEADY = {"import": 1.0, "join": 1.2, "devices": 1.3, "compile": 3.0, "first_step": 3.4}


def _late(extra: float) -> dict[str, float]:
    """STEADY with ``extra`` seconds lost in joining."""
    return {p: t + (extra if p != "import" else 0.0) for p, t in STEADY.items()}


def test_phases_read_in_order_and_junk_left_out() -> None:
    assert list(parse("first_step=3.4,import=1.0,compile=3,devices=1.3")) == [
        "import",
        "devices",
        "compile",
        "first_step",
    ]
    assert parse("-") == {}
    assert parse("import=x,bogus=1,join=-1,devices=inf,compile=2.5") == {"compile": 2.5}
    assert PHASES == hookstart.PHASES  # the hook is staged alone: it keeps its own copy
    assert phase_times({"import": 1.0, "devices": 1.5, "first_step": 4.0}) == {
        "import": 1.0,
        "devices": 0.5,
        "first_step": 2.5,
    }
    assert cell(STEADY) == "import 1.00 join 0.20 devices 0.10 compile 1.70 first step 0.40"


def test_the_line_names_the_slowest_host_and_where_it_lost() -> None:
    hosts = [(f"s0/w{i}", STEADY) for i in range(3)] + [("s0/w3", _late(4.0))]
    line = startup_line(hosts)
    assert line == (
        "start-up (median of 4 hosts): import 1.00 s, join 0.20 s, devices 0.10 s, "
        "compile 1.70 s, first step 0.40 s; first step at 3.40 s; slowest: s0/w3 at 7.40 s "
        "(+4.00 s; join +4.00 s)"
    )
    close = [(f"s0/w{i}", STEADY) for i in range(3)] + [("s0/w3", _late(0.2))]
    assert "slowest" not in (startup_line(close) or "")  # within the spread: nobody named
    assert startup_line([("s0/w0", STEADY)]) == (
        "start-up: import 1.00 s, join 0.20 s, devices 0.10 s, compile 1.70 s, "
        "first step 0.40 s; first step at 3.40 s"
    )
    # a host still compiling: the line goes as far as every host got
    partial = [("s0/w0", STEADY), ("s0/w1", {"import": 1.1, "join": 1.2, "devices": 1.4})]
    assert (startup_line(partial) or "").endswith("; devices at 1.35 s")
    assert startup_line([("s0/w0", {}), ("s0/w1", {})]) is None  # no JAX: no line


def test_the_end_line_and_the_state_header_carry_the_phases() -> None:
    end = parse_watch_end(b"end 0 1.0 2.0 - 120 0 import=1.1,devices=1.5\n")
    assert end is not None
    assert dict(end[0].startup) == {"import": 1.1, "devices": 1.5}
    old = parse_watch_end(b"end 0 1.0 2.0 - 120 0\n")  # seven words: as before
    assert old is not None
    assert old[0].startup == ()
    exit_info = parse_exit("0 1.0 2.0 - 0 import=0.9,join=1.0")
    assert exit_info is not None
    assert dict(exit_info.startup) == {"import": 0.9, "join": 1.0}


def test_run_json_keeps_them_and_older_records_still_read(tmp_path: Path) -> None:
    from multihost.model import Job
    from multihost.runs.record import RunRecord

    host = Host(address="a")
    record = RunRecord(
        "r", Job("true", "r"), (HostResult(host, State.DONE, exit_code=0, startup=STEADY),)
    )
    data = to_json(record)
    assert data["hosts"][0]["startup"] == STEADY
    back = from_json(json.loads(json.dumps(data)))
    assert list(back.hosts[0].startup.items()) == list(STEADY.items())
    del data["hosts"][0]["startup"]  # a record written before phases were kept
    assert from_json(data).hosts[0].startup == {}


def test_the_hook_writes_one_line_a_shell_can_read() -> None:
    assert hookstart.startup_line({"first_step": 3.4567, "import": 1.0}) == (
        "2 import=1.000,first_step=3.457\n"
    )


# what the hook leaves on each host: two processes each; one a torn line, one a partial write
FAKE_HOOK = """\
d=$MULTIHOST_STACK_DIR
if [ "$JAX_PROCESS_ID" = 0 ]; then
  echo "1 import=0.800" > "$d/11.startup"
  echo "3 import=0.700,devices=1.000,compile=2.000" > "$d/22.startup"
else
  echo "4 import=0.900,join=1.100,devices=1.200,compile=2.500" > "$d/11.startup"
  echo "5 import=x y" > "$d/22.startup"
  echo "5 import=1,join=2,devices=3,compile=4,first_step=5" > "$d/.33.startup"
fi
echo done
"""


def test_the_process_that_got_furthest_is_reported(home: Path, code: Path, tmp_path: Path) -> None:
    """Each host's state files as the hook leaves them (several processes, one that never
    imported jax, a torn line): its end brings back the line of the process that got furthest,
    run.json keeps it, the summary says it, ``status`` shows it."""
    logs = tmp_path / "logs"
    (code / "phases.sh").write_text(FAKE_HOOK)
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "phases",
            "--cmd",
            "sh phases.sh",
        ]
    )
    assert res.returncode == 0, res.stderr
    hosts = manifest(logs, "phases")["hosts"]
    assert hosts[0]["startup"] == {"import": 0.7, "devices": 1.0, "compile": 2.0}
    assert hosts[1]["startup"] == {"import": 0.9, "join": 1.1, "devices": 1.2, "compile": 2.5}
    assert "start-up (median of 2 hosts): import 0.80 s, join 0.20 s, devices" in res.stderr
    status = cli(["status", "phases", "--log-dir", str(logs), "--json", "--refresh"])
    assert status.returncode == 0, status.stderr
    assert [r["startup"] for r in json.loads(status.stdout)] == [h["startup"] for h in hosts]
    table = cli(["status", "phases", "--log-dir", str(logs)])
    assert "start-up (median of 2 hosts)" in table.stdout
    assert [h.startup for h in api.status("phases", log_dir=logs, refresh=True)] == [
        h["startup"] for h in hosts
    ]
    record = read_record(logs / "phases")
    result = RunResult("phases", record.hosts)
    assert "start-up (median of 2 hosts)" in str(result)
    assert "start-up (median of 2 hosts)" in result._repr_html_()


# -- real JAX ---------------------------------------------------------------------------------
PROGRAM = """\
import sys, jax, jax.numpy as jnp
x = jnp.ones((64, 64))
f = jax.jit(lambda a: (a @ a).sum())
if sys.argv[1] == "annotated":
    jax.block_until_ready(x)  # a wait before the first step: replaced by the step
    for i in range(2):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(f(x))
elif sys.argv[1] == "waits":
    jax.block_until_ready(f(x))
else:
    f(x)
print("ok", flush=True)
"""


def _hooked(tmp_path: Path, how: str, **env: str) -> dict[str, float]:
    """Run PROGRAM with the staged hook as sitecustomize; its phases as written."""
    from multihost.remote.commands import hook_text

    hook, stacks = tmp_path / "hook", tmp_path / f"stacks-{how}"
    hook.mkdir(exist_ok=True)
    stacks.mkdir()
    (hook / "sitecustomize.py").write_text(hook_text())
    (tmp_path / "program.py").write_text(PROGRAM)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MULTIHOST_"))}
    run = subprocess.run(
        [sys.executable, str(tmp_path / "program.py"), how],
        env={
            **base,
            "PYTHONPATH": str(hook),
            "MULTIHOST_STACK_DIR": str(stacks),
            "JAX_PLATFORMS": "cpu",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    files = list(stacks.glob("*.startup"))
    assert len(files) == 1, files
    count, _, pairs = files[0].read_text().partition(" ")
    found = parse(pairs.strip())
    assert int(count) == len(found)
    return found


@pytest.mark.jax
def test_a_real_process_goes_through_the_phases_in_order(tmp_path: Path) -> None:
    annotated = _hooked(tmp_path, "annotated")
    assert list(annotated) == ["import", "devices", "compile", "first_step"]  # one process
    times = list(annotated.values())
    assert times == sorted(times)
    assert times[0] > 0.05
    waits = _hooked(tmp_path, "waits")  # marks no steps: its first wait is the step
    assert list(waits) == ["import", "devices", "compile", "first_step"]
    neither = _hooked(tmp_path, "neither")  # neither marks nor waits: no first step
    assert list(neither) == ["import", "devices", "compile"]


@pytest.mark.jax
@pytest.mark.usefixtures("home")
def test_each_local_process_joins_and_reports_its_phases(code: Path, tmp_path: Path) -> None:
    (code / "program.py").write_text(PROGRAM)
    logs = tmp_path / "logs"
    res = cli(
        [
            "run",
            "--local",
            "2",
            "--script-dir",
            str(code),
            "--log-dir",
            str(logs),
            "--run-name",
            "jaxphases",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--cmd",
            f"{sys.executable} program.py annotated",
        ],
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for h in manifest(logs, "jaxphases")["hosts"]:
        assert list(h["startup"]) == list(PHASES)  # joined by the hook: every phase
    assert "start-up (median of 2 hosts): import" in res.stderr


@pytest.mark.jax
@pytest.mark.usefixtures("fresh_runs")
def test_phases_come_back_over_ssh(ssh_fleet, remote_jax, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (code / "program.py").write_text(PROGRAM)
    logs = tmp_path / "logs"
    cmd = f"{remote_jax['PYTHON']} program.py annotated"
    env = ["--env", "JAX_PLATFORMS=cpu", "--env", f"PYTHONPATH={remote_jax['PYTHONPATH']}"]
    res = cli(fleet_run_args(ssh_fleet, code, logs, "sshphases", cmd, 2, *env), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for h in manifest(logs, "sshphases")["hosts"]:
        assert list(h["startup"]) == list(PHASES)
    assert "start-up (median of 2 hosts)" in res.stderr
    assert no_processes(ssh_fleet, 2)
