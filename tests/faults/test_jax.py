"""A user's own JAX script in a run, for real (multi-process JAX on CPU, over ``--local`` and
over the sshd fleet): a JAX helper it starts is a JAX program of its own, and a job that JAX's
coordination service aborts says why on every host, naming the host at fault, with each
host's raw exit kept and no process of the run left anywhere."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.clitools import cli, host_logs, manifest
from tests.faults.conftest import Where
from tests.helpers import free_port, wait_for

pytestmark = [pytest.mark.jax, pytest.mark.slow]

HELPERS = """\
import multiprocessing, os, socket, subprocess, sys
import jax


def worker(q):  # a multiprocessing worker that uses JAX
    import jax
    q.put(jax.process_count())


def python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


if __name__ == "__main__":
    print("parent", jax.process_index(), jax.process_count(), flush=True)
    child = python("import jax; print('child', jax.process_count(), jax.devices())")
    print(child.stdout.strip() or child.stderr[-2000:], flush=True)
    bare = python("import jax; jax.distributed.initialize()")
    print("bare", bare.returncode, "not the run's JAX process" in bare.stderr, flush=True)
    with socket.socket() as s:  # a job of the helper's own: its own coordinator and ids
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    own = python(
        f"import jax; jax.distributed.initialize('127.0.0.1:{port}', 1, 0); "
        "print('own', jax.process_index(), jax.process_count())"
    )
    print(own.stdout.strip() or own.stderr[-2000:], flush=True)
    spawn = multiprocessing.get_context("spawn")
    q = spawn.Queue()
    p = spawn.Process(target=worker, args=(q,))
    p.start()
    print("worker", q.get(timeout=120), flush=True)
    p.join()
    print("parent done", jax.process_count(), flush=True)
"""

# a helper that joins the job with its parent's own ids: the coordination service aborts all
TWICE = """\
import os, subprocess, sys, time
import jax
print("joined", jax.process_index(), flush=True)
if jax.process_index() == 1:
    subprocess.run([sys.executable, "-c", "import jax, os; jax.distributed.initialize("
                    "os.environ['JAX_COORDINATOR_ADDRESS'], int(os.environ['JAX_PROCESS_COUNT']), "
                    "int(os.environ['JAX_PROCESS_ID']))"])
time.sleep(120)
"""

NEVER = """\
import os, time
if os.environ["JAX_PROCESS_ID"] == "1":
    print("busy elsewhere", flush=True)
    time.sleep(120)  # never joins
import jax
jax.distributed.initialize(initialization_timeout=3)
"""

HANG = """\
import os, signal, time
import jax
jax.distributed.initialize(heartbeat_timeout_seconds=5)
print("joined", jax.process_index(), flush=True)
if jax.process_index() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # hung: no heartbeat from here on
time.sleep(120)
"""


def _run(
    where: Where, request: pytest.FixtureRequest, code: Path, run: str, script: str, n: int
) -> tuple[Any, dict[str, Any]]:
    """The script as every host's command; the CLI's result and the run's record."""
    (code / f"{run}.py").write_text(script)
    extra = ["--env", "JAX_PLATFORMS=cpu", "--env", "JAX_NUM_CPU_DEVICES=1"]
    python = sys.executable
    if where.kind == "ssh":
        remote: dict[str, str] = request.getfixturevalue("remote_jax")
        python = remote["PYTHON"]
        extra += ["--env", f"PYTHONPATH={remote['PYTHONPATH']}"]
        extra += ["--coordinator-port", str(free_port())]  # other fleets share the hosts' ports
    logs = where.home / "logs"
    cmd = f"{python} {run}.py"
    if run == "helpers":  # and a second JAX program after the first: it joins in turn
        cmd += f" && {python} -c \"import jax; print('second', jax.process_count())\""
    res = cli(where.args(code, logs, run, cmd, *extra, n=n), timeout=240)
    wait_for(lambda: not where.leftovers(run, n), 20, "no process of the run left")
    return res, manifest(logs, run)


def test_a_jax_helper_of_the_users_own_is_a_program_of_its_own(
    where: Where, request: pytest.FixtureRequest, code: Path
) -> None:
    """A pod script that starts JAX helpers while it is in the job (a subprocess, one that
    calls a bare initialize(), one with a job of its own, a multiprocessing worker): the
    helpers are single-process JAX programs, the run succeeds, every host exits 0."""
    res, record = _run(where, request, code, "helpers", HELPERS, 2)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [h["exit_code"] for h in record["hosts"]] == [0, 0]
    for i, text in enumerate(host_logs(where.home / "logs", "helpers").values()):
        lines = text.splitlines()
        assert f"parent {i} 2" in lines, text
        assert "child 1 [CpuDevice(id=0)]" in lines, text
        assert "bare 1 True" in lines, text  # a clear error, not the parent's id
        assert "own 0 1" in lines, text
        assert "worker 1" in lines, text
        assert "parent done 2" in lines, text
        assert "second 2" in lines, text  # the next Python after the first joins


def _hosts(record: dict[str, Any]) -> list[tuple[str, int | None, str]]:
    return [(h["state"], h["signal"], h.get("cause") or "") for h in record["hosts"]]


def test_a_second_process_joining_as_one_names_its_host(
    where: Where, request: pytest.FixtureRequest, code: Path
) -> None:
    res, record = _run(where, request, code, "twice", TWICE, 3)
    assert res.returncode == 1
    joined = "a second process joined as JAX process 1"
    aborted = f"aborted by JAX's coordination service because of s0/w1: {joined}"
    hosts = _hosts(record)
    assert hosts[1][2] == joined, hosts
    for state, signal, cause in (hosts[0], hosts[2]):
        # the raw signal is kept: SIGABRT, or the fail-fast stop's SIGTERM when it came while
        # the abort was still printing its stack
        assert (state, cause) == ("killed", aborted)
        assert signal in (6, 15)
    assert joined in record["first_failure"]
    assert f"{joined};" in res.stderr  # the summary's rows and its verdict


def test_a_process_that_never_joins_is_named(
    where: Where, request: pytest.FixtureRequest, code: Path
) -> None:
    res, record = _run(where, request, code, "never", NEVER, 2)
    assert res.returncode == 1
    hosts = _hosts(record)
    assert hosts[0] == (
        "killed",
        6,
        "gave up waiting for s0/w1 to join the JAX job (jax.distributed.initialize timed out)",
    )
    assert hosts[1][2] == "never joined the JAX job (the others timed out waiting for it)"
    assert record["hosts"][1]["error"] == "stopped by multihost (SIGTERM)"
    assert "first failure: s0/w0 gave up waiting for s0/w1 to join" in res.stderr


def test_a_hung_process_is_named_by_the_heartbeat(
    where: Where, request: pytest.FixtureRequest, code: Path
) -> None:
    res, record = _run(where, request, code, "hang", HANG, 3)
    assert res.returncode == 1
    hosts = _hosts(record)
    assert hosts[1][2] == "stopped answering (heartbeat timed out)", hosts
    assert record["hosts"][1]["error"].startswith("stopped by multihost")
    aborted = (
        "aborted by JAX's coordination service because of s0/w1: stopped answering "
        "(heartbeat timed out)"
    )
    for state, signal, cause in (hosts[0], hosts[2]):
        assert (state, cause) == ("killed", aborted)
        assert signal in (6, 15)
