"""The payloads through the runner: ``--local 4`` and the SSH fleet, 2 CPU devices per process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from multihost.results.records import RESULT_MARKER
from tests.clitools import REPO, cli, host_logs
from tests.helpers import free_port

pytestmark = [pytest.mark.jax, pytest.mark.slow]
SHARDINGS = "payloads/shardings.py -dd 2 -if 4 -d 256 -b 16 -n 2 --tries 2"
VERIFY = "payloads/shardings.py -dd 2 -if -1 -it 2 -d 128 -b 8 -n 2 --verify --impl"
TRAIN = "payloads/train.py --model mlp -dd 2 -if 4 --d_model 64 --d_ff 128 --steps 4 --warmup 1"


def _results(logs: Path, run: str) -> list[dict[str, Any]]:
    found = []
    for text in host_logs(logs, run).values():
        lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARKER + " ")]
        found += [json.loads(ln.split(" ", 1)[1]) for ln in lines]
    return found


def _check_same(results: list[dict[str, Any]], processes: int) -> dict[str, Any]:
    assert sorted(r["process_index"] for r in results) == list(range(processes))
    # Every process gathers the same weights and sums them in the same order.
    assert len({r.get("fingerprint", r.get("verify_max_rel_err")) for r in results}) == 1
    first = next(r for r in results if r["process_index"] == 0)
    assert first["num_processes"] == processes
    assert first["num_devices"] == 2 * processes
    return first


def _local(tmp_path: Path, run: str, cmd: str, n: int = 4) -> list[dict[str, Any]]:
    res = cli(
        [
            "run",
            "--local",
            str(n),
            "--script-dir",
            str(REPO),
            "--log-dir",
            str(tmp_path),
            "--run-name",
            run,
            "--env",
            "JAX_NUM_CPU_DEVICES=2",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--coordinator-port",
            str(free_port()),
            "--timeout",
            "240",
            "--cmd",
            cmd,
        ],
        timeout=300,
        HOME=str(tmp_path / "home"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return _results(tmp_path, run)


@pytest.fixture(scope="module")
def shardings_local_4(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """SHARDINGS over ``--local 4``, run once: its own test and the SSH run's reference."""
    return _local(tmp_path_factory.mktemp("local4"), "sh", f"{sys.executable} {SHARDINGS}")


def test_shardings_local_4(shardings_local_4: list[dict[str, Any]]) -> None:
    first = _check_same(shardings_local_4, 4)
    assert first["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert first["payload"] == "shardings"


@pytest.mark.parametrize(("n", "impl"), [(2, "shard_map"), (4, "jit")])
def test_shardings_verify_local(tmp_path: Path, n: int, impl: str) -> None:
    cmd = f"{sys.executable} {VERIFY} {impl}"
    first = _check_same(_local(tmp_path, f"v{n}", cmd, n), n)
    assert first["verify_ok"] is True
    assert first["impl"] == impl
    assert first["mesh"]["data"] == 2  # DCN over processes (n = 2) or process groups (n = 4)


def test_train_local_4(tmp_path: Path) -> None:
    first = _check_same(_local(tmp_path, "tr", f"{sys.executable} {TRAIN}"), 4)
    assert first["losses"][-1] < first["losses"][0]


@pytest.mark.usefixtures("fresh_runs")  # the run name is fixed, the hosts are shared
def test_shardings_over_ssh(  # type: ignore[no-untyped-def]
    ssh_fleet, remote_jax: dict[str, str], shardings_local_4: list[dict[str, Any]], tmp_path: Path
) -> None:
    res = cli(
        [
            "run",
            "--hosts",
            ",".join(ssh_fleet.aliases[:4]),
            "--ssh-config",
            str(ssh_fleet.ssh_config),
            "--script-dir",
            str(REPO),
            "--log-dir",
            str(tmp_path),
            "--run-name",
            "ssh-sh",
            "--env",
            "JAX_NUM_CPU_DEVICES=2",
            "--env",
            "JAX_PLATFORMS=cpu",
            "--env",
            f"PYTHONPATH={remote_jax['PYTHONPATH']}",
            "--env",
            f"XLA_FLAGS={remote_jax['XLA_FLAGS']}",
            "--coordinator-port",
            str(free_port()),
            "--timeout",
            "240",
            "--cmd",
            f"{remote_jax['PYTHON']} {SHARDINGS}",
        ],
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ssh = _check_same(_results(tmp_path, "ssh-sh"), 4)
    local = _check_same(shardings_local_4, 4)  # the same command over --local 4
    assert ssh["fingerprint"] == pytest.approx(local["fingerprint"], rel=1e-6)
