"""Tests for payloads/shardings.py and the shared payloads/meshing.py (CPU, JAX subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
PAYLOADS = ROOT / "payloads"
sys.path.insert(0, str(PAYLOADS))

import memory  # noqa: E402
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
        ("TPU v3", 61.5),
        ("TPU v4", 275.0),
        ("TPU v5 lite", 197.0),
        ("TPU v5", 459.0),
        ("TPU v5p", 459.0),
        ("TPU v6 lite", 918.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
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


# ---------------------------------------------------------------- shardings.py, one process


@pytest.mark.jax
def test_shardings_verify_cli_ok() -> None:
    (proc,) = run_payload("shardings.py", [*SMALL, "-if", "4", "-it", "2", "--verify"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("verify:")]
    assert len(lines) == 1
    assert lines[0].startswith("verify: ok (max rel err ")
    assert "tolerance 0.0234 = eps_bf16·(L+1)" in lines[0]
    res = proc.result()
    assert res["verify_ok"] is True
    assert res["init_scale"] == pytest.approx(64**-0.5)
    assert "tflops_per_device" not in res  # verify does not time


@pytest.mark.jax
def test_shardings_result_line_fields() -> None:
    res = run_ok("shardings.py", [*SMALL, "-if", "-1", "--warmup", "0"])[0]
    keys = (
        "payload num_devices num_processes mesh device_kind step_time_s tflop_per_device "
        "tflops_per_device peak_tflops utilization fingerprint process_index impl "
        "step_time_median_s step_time_min_s step_time_max_s"
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
    assert (res["timed_steps"], res["warmup_steps"]) == (2, 0)
    # "time is" is the mean of the timed steps, as MaxText's shardings.py prints it.
    assert res["step_time_s"] == pytest.approx(sum(res["timings_s"]) / 2)
    assert res["step_time_min_s"] <= res["step_time_median_s"] <= res["step_time_max_s"]
    assert res["tflops_per_device"] == pytest.approx(res["tflop_per_device"] / res["step_time_s"])
    assert res["impl"] == "jit"
    assert res["init_scale"] == 1e-4


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
    assert "estimated memory per process (8 CPU devices share this host's RAM)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not parse_result_lines(proc.stdout)


@pytest.mark.jax
def test_shardings_memory_guard_counts_all_cpu_devices() -> None:
    # 10.8 GB per device passes a per-device check of 16 GB; the 8 devices share one RAM.
    args = ["-if", "8", "-b", "131072", "-d", "2048", "--memory_limit_gb", "16"]
    (proc,) = run_payload("shardings.py", args, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "estimated memory per process (8 CPU devices" in proc.stderr
    # MaxText's 10.77 GB per device, the weights gathered on CPU, and the runtime
    need = _per_process_gb(2048, 4, 131072, devices=8, shape=(8, 1), local=8)
    assert f"{need:.3f} GB exceeds the limit 16.000 GB" in proc.stderr
    assert 93 < need < 94


# ---------------------------------------------------------------- shardings.py, 4 processes


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
        assert "estimated memory of the 4 processes on this machine (2 CPU devices each" in p.stderr
    assert max(p.seconds for p in procs) < 30


def _per_process_gb(
    d: int, layers: int, b: int, devices: int, shape: tuple[int, int], local: int
) -> float:
    """What the guard estimates for one CPU process: its devices' need and its runtime."""
    params_b, acts_b = shardings.memory_bytes(d, layers, b * devices)
    mesh = {"fsdp": shape[0], "tensor": shape[1]}
    _, cpu = shardings.per_device_bytes(params_b, acts_b, mesh, devices)
    return (cpu * local + memory.RUNTIME_BYTES) / 1e9


@pytest.mark.jax
@pytest.mark.slow
def test_shardings_memory_guard_counts_the_processes_sharing_a_machine() -> None:
    """Four processes on one machine need four times what one does: a limit of 2.5 processes'
    worth is refused (each process alone fits, which is all the guard used to check)."""
    one = _per_process_gb(64, 2, 16, devices=8, shape=(4, 1), local=2)
    args = [*SMALL, "-dd", "2", "-if", "4"]
    procs = run_payload(
        "shardings.py",
        [*args, "--memory_limit_gb", f"{2.5 * one:.9f}"],
        processes=4,
        devices=2,
        timeout=90,
    )
    for p in procs:
        assert p.returncode == 2, p.stderr[-2000:]
        assert (
            "of the 4 processes on this machine (2 CPU devices each; all share its RAM) "
            f"{4 * one:.3f} GB exceeds the limit {2.5 * one:.3f} GB" in p.stderr
        )
        assert not parse_result_lines(p.stdout)
    fits = run_payload(
        "shardings.py",
        [*args, "--memory_limit_gb", f"{4.5 * one:.9f}"],
        processes=4,
        devices=2,
        timeout=90,
    )
    assert all(p.returncode == 0 for p in fits), fits[0].stderr[-2000:]
