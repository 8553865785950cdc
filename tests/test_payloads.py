"""Tests for payloads/shardings.py and the shared payloads/meshing.py (CPU, JAX subprocesses)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAYLOADS = ROOT / "payloads"
sys.path.insert(0, str(PAYLOADS))

import meshing  # noqa: E402
import shardings  # noqa: E402

SMALL = ["-d", "64", "-b", "16", "-n", "2", "--tries", "2"]
LAYOUTS = {
    "fsdp8": ["-if", "8"],
    "tensor8": ["-if", "1", "-it", "8"],
    "fsdp4xtensor2": ["-if", "4", "-it", "2"],
    "data2xfsdp4": ["-id", "2", "-if", "4"],
}
RESULT_PREFIX = "MULTIHOST_RESULT "


def parse_result_lines(text: str) -> list[dict[str, Any]]:
    """Every MULTIHOST_RESULT json object in text, in order."""
    out = []
    for line in text.splitlines():
        if line.startswith(RESULT_PREFIX):
            out.append(json.loads(line[len(RESULT_PREFIX) :]))
    return out


@dataclass(frozen=True)
class Proc:
    """One finished payload process."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def result(self) -> dict[str, Any]:
        """The single result line of this process."""
        results = parse_result_lines(self.stdout)
        assert len(results) == 1, self.stdout + self.stderr
        return results[0]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(devices: int) -> dict[str, str]:
    """Environment for a CPU payload with `devices` local devices and no cluster hints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MEGASCALE_"))}
    for key in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES"):
        env.pop(key, None)
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices), PYTHONUNBUFFERED="1")
    return env


def run_payload(
    script: str, args: list[str], processes: int = 1, devices: int = 8, timeout: float = 120
) -> list[Proc]:
    """Run payloads/<script> as `processes` JAX processes on 127.0.0.1; one Proc each."""
    port = free_port()
    cmd = [sys.executable, str(PAYLOADS / script), *args]
    popens = []
    start = time.monotonic()
    for i in range(processes):
        env = base_env(devices)
        if processes > 1:
            env.update(
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_PROCESS_ID=str(i),
                JAX_PROCESS_COUNT=str(processes),
            )
        popens.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    procs = []
    try:
        for p in popens:
            left = max(1.0, timeout - (time.monotonic() - start))
            out, err = p.communicate(timeout=left)
            procs.append(Proc(p.returncode, out, err, time.monotonic() - start))
    finally:
        for p in popens:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs


def run_ok(script: str, args: list[str], **kw: Any) -> list[dict[str, Any]]:
    """Run a payload that must succeed; the result of every process."""
    procs = run_payload(script, args, **kw)
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    return [p.result() for p in procs]


# ---------------------------------------------------------------- pure units


def test_flop_formula_against_hand_count() -> None:
    d, layers, b = 8, 3, 5
    # Per layer and row: two matmuls of D×4D, 2 flops per MAC forward, x3 for fwd+bwd.
    hand = layers * 2 * (2 * d * 4 * d) * 3 * b
    assert shardings.tflop_per_device(d, layers, b) * 1e12 == pytest.approx(hand)
    assert shardings.tflop_per_device(2048, 4, 131072) == pytest.approx(
        48 * 2048**2 * 4 * 131072 / 1e12
    )


@pytest.mark.parametrize(
    ("kind", "peak"),
    [
        ("TPU v3", 70.0),
        ("TPU v4", 275.0),
        ("TPU v5 lite", 197.0),
        ("TPU v5", 459.0),
        ("TPU v5p", 459.0),
        ("TPU v6 lite", 918.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("cpu", None),
    ],
)
def test_peak_table(kind: str, peak: float | None) -> None:
    assert meshing.peak_tflops(kind) == peak


def test_plan_mesh_fills_and_groups() -> None:
    plan = meshing.plan_mesh([2, 1, 1], [1, -1, 1], 8, 4, 1)
    assert plan.shape == {"data": 2, "fsdp": 4, "tensor": 1}
    assert plan.granule == "process_group"
    assert meshing.plan_mesh([-1, 1, 1], [1, 2, 1], 8, 4, 1).granule == "process"
    assert meshing.plan_mesh([2, 1, 1], [1, 4, 1], 8, 2, 2).granule == "slice"
    assert meshing.plan_mesh([1, 1, 1], [1, 4, 2], 8, 1, 1).granule == "none"


@pytest.mark.parametrize(
    ("dcn", "ici", "devices", "procs", "slices", "needle"),
    [
        ([1, 1, 1], [1, 4, 1], 8, 1, 1, "4 != 8 devices"),
        ([2, 1, 1], [1, 4, 1], 8, 1, 1, "number of processes 1"),
        ([3, 1, 1], [1, 2, 1], 8, 2, 2, "number of slices 2"),
        ([1, 1, 1], [-1, -1, 1], 8, 1, 1, "at most one axis"),
        ([1, 1, 1], [1, 3, -1], 8, 1, 1, "not divisible by 3"),
    ],
)
def test_plan_mesh_errors_name_sizes(
    dcn: list[int], ici: list[int], devices: int, procs: int, slices: int, needle: str
) -> None:
    with pytest.raises(meshing.MeshError, match=needle):
        meshing.plan_mesh(dcn, ici, devices, procs, slices)


def test_parse_result_lines_matches_meshing() -> None:
    text = 'noise\nMULTIHOST_RESULT {"a": 1}\nmore\n'
    assert parse_result_lines(text) == meshing.parse_result_lines(text) == [{"a": 1}]


# ---------------------------------------------------------------- reference


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def reference_step(seed: int, d: int, layers: int, global_batch: int) -> tuple[float, float]:
    """Unsharded float32 numpy forward/backward of the same step: (loss, weight checksum)."""
    import jax
    import jax.numpy as jnp

    data_key, params_key = jax.random.split(jax.random.key(seed))
    x = np.asarray(jax.random.uniform(data_key, (global_batch, d), dtype=jnp.bfloat16), np.float32)
    keys = jax.random.split(params_key, 2 * layers)
    ws = [
        np.asarray(1e-4 * jax.random.normal(k, (4 * d, d), dtype=jnp.bfloat16), np.float32)
        for k in keys
    ]
    w1s, w2s = ws[0::2], ws[1::2]
    saved = []
    h = x
    for w1, w2 in zip(w1s, w2s, strict=True):
        h1 = _sigmoid(h @ w1.T)
        h2 = _sigmoid(h1 @ w2)
        saved.append((h, h1, h2))
        h = h2
    loss = float(h.sum())
    grad = np.ones_like(h)
    new = []
    for (h0, h1, h2), w1, w2 in reversed(list(zip(saved, w1s, w2s, strict=True))):
        dz2 = grad * h2 * (1 - h2)
        dw2 = h1.T @ dz2
        dz1 = (dz2 @ w2.T) * h1 * (1 - h1)
        dw1 = dz1.T @ h0
        grad = dz1 @ w1
        new += [w1 - 1e-4 * dw1, w2 - 1e-4 * dw2]
    return loss, float(sum(w.sum(dtype=np.float64) for w in new))


# ---------------------------------------------------------------- shardings.py, one process


@pytest.mark.jax
@pytest.mark.slow
def test_shardings_layouts_agree_with_reference() -> None:
    results = {name: run_ok("shardings.py", SMALL + flags)[0] for name, flags in LAYOUTS.items()}
    ref_loss, ref_sum = reference_step(0, 64, 2, 16 * 8)
    first = results["fsdp8"]
    assert first["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    for name, res in results.items():
        assert res["checksum"] == pytest.approx(first["checksum"], rel=1e-2), name
        assert res["checksum"] == pytest.approx(ref_sum, rel=2e-2), name
        assert res["loss"] == pytest.approx(ref_loss, rel=1e-2), name
    # The update must matter, or the checksum would only compare the initial weights.
    init_sum = reference_step_init_sum(0, 64, 2)
    assert abs(ref_sum - init_sum) > 10 * abs(ref_sum - first["checksum"])


def reference_step_init_sum(seed: int, d: int, layers: int) -> float:
    """Sum of the initial weights (float32) for the seed."""
    import jax
    import jax.numpy as jnp

    _, params_key = jax.random.split(jax.random.key(seed))
    keys = jax.random.split(params_key, 2 * layers)
    return float(
        sum(
            np.asarray(
                1e-4 * jax.random.normal(k, (4 * d, d), dtype=jnp.bfloat16), np.float32
            ).sum()
            for k in keys
        )
    )


@pytest.mark.jax
def test_shardings_result_line_fields() -> None:
    res = run_ok("shardings.py", [*SMALL, "-if", "-1", "--warmup", "0"])[0]
    keys = (
        "payload num_devices num_processes mesh device_kind step_time_s tflop_per_device "
        "tflops_per_device peak_tflops utilization checksum process_index"
    )
    for key in keys.split():
        assert key in res
    assert res["payload"] == "shardings"
    assert res["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    assert res["device_kind"] == "cpu"
    assert res["peak_tflops"] is None
    assert res["utilization"] is None
    assert res["tflop_per_device"] == pytest.approx(48 * 64**2 * 2 * 16 / 1e12)
    assert len(res["timings_s"]) == 2


@pytest.mark.jax
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["-if", "4"], "4 != 8 devices"),
        (["-dd", "2", "-if", "4"], "number of processes 1"),
    ],
)
def test_shardings_bad_mesh_exits_2(flags: list[str], needle: str) -> None:
    (proc,) = run_payload("shardings.py", SMALL + flags, timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.seconds < 30


@pytest.mark.jax
def test_shardings_memory_guard() -> None:
    (proc,) = run_payload("shardings.py", [*SMALL, "-if", "8", "--memory_limit_gb", "0.00001"])
    assert proc.returncode == 2
    assert "estimated memory per device" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not parse_result_lines(proc.stdout)


# ---------------------------------------------------------------- shardings.py, 4 processes


@pytest.mark.jax
@pytest.mark.slow
def test_shardings_four_processes_agree() -> None:
    results = run_ok(
        "shardings.py", [*SMALL, "-dd", "2", "-if", "4"], processes=4, devices=2, timeout=180
    )
    assert [r["process_index"] for r in results] == [0, 1, 2, 3]
    first = results[0]
    assert first["num_processes"] == 4
    assert first["num_devices"] == 8
    assert first["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert {r["checksum"] for r in results} == {first["checksum"]}
    # Same global problem as one process with 8 devices.
    _, ref_sum = reference_step(0, 64, 2, 16 * 8)
    assert first["checksum"] == pytest.approx(ref_sum, rel=2e-2)


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["-if", "4"], "4 != 8 devices"),
        (["-dd", "3", "-if", "4"], "must divide the number of processes 4"),
    ],
)
def test_shardings_four_processes_bad_mesh_all_exit(flags: list[str], needle: str) -> None:
    procs = run_payload("shardings.py", SMALL + flags, processes=4, devices=2, timeout=60)
    for p in procs:
        assert p.returncode == 2, p.stderr[-2000:]
        assert needle in p.stderr
        assert "Traceback" not in p.stderr
    assert max(p.seconds for p in procs) < 30


@pytest.mark.jax
@pytest.mark.slow
def test_shardings_four_processes_memory_guard() -> None:
    procs = run_payload(
        "shardings.py",
        [*SMALL, "-dd", "2", "-if", "4", "--memory_limit_gb", "0.00001"],
        processes=4,
        devices=2,
        timeout=60,
    )
    for p in procs:
        assert p.returncode == 2, p.stderr[-2000:]
        assert "estimated memory per device" in p.stderr
    assert max(p.seconds for p in procs) < 30
