"""Tests for payloads/train.py (flax NNX + optax) on CPU: layouts, 4 processes, FLOP formula."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from multihost.model import Host, State
from multihost.results.faces import payload_lines
from multihost.results.records import HostResult, RunResult

try:
    from tests.test_payload_shardings import (
        LAYOUTS,
        ROOT,
        base_env,
        parse_result_lines,
        run_ok,
        run_payload,
    )
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_payload_shardings import (  # type: ignore[no-redef]
        LAYOUTS,
        ROOT,
        base_env,
        parse_result_lines,
        run_ok,
        run_payload,
    )

# test_payload_shardings put payloads/ on sys.path; the payload is a script, not a package.
train = importlib.import_module("train")

TINY = [
    "--model",
    "transformer",
    "--d_model",
    "64",
    "--d_ff",
    "128",
    "--num_heads",
    "8",
    "--seq_len",
    "16",
    "--per_device_batch",
    "2",
    "--steps",
    "6",
    "--warmup",
    "1",
    "--dtype",
    "f32",
    "--lr",
    "3e-3",
]


def summary_head(result: dict[str, object]) -> str:
    """The run summary's headline for a payload result reported by process 0."""
    run = RunResult("p", (HostResult(Host("h0"), State.DONE, exit_code=0, reported=result),))
    return payload_lines(run)[0]


def _args(*argv: str) -> argparse.Namespace:
    return train.parse_args(list(argv))


def test_flop_formula_against_hand_count() -> None:
    a = _args(
        "--model",
        "transformer",
        "--d_model",
        "8",
        "--d_ff",
        "16",
        "--num_layers",
        "2",
        "--num_heads",
        "2",
        "--seq_len",
        "4",
        "--vocab",
        "10",
        "--per_device_batch",
        "3",
    )
    # Per layer: q, k, v, o (8×8 each) + up/down (8×16 each); plus the 8×10 unembedding.
    n = 2 * (4 * 64 + 2 * 128) + 80
    assert train.matmul_params(a) == n
    tokens = 3 * 2 * 4  # per_device_batch × devices × seq_len
    assert train.tokens_per_step(a, 2) == tokens
    # QKᵀ and AV: 2·S·d each forward per token and layer; ×3 for fwd+bwd (full mask) …
    full = 2 * (2 * 4 * 8) * 2 * 3
    assert train.step_flop(a, 2, causal=False) == tokens * (6 * n + full)
    # … and half of that with the causal mask, as MaxText's calculate_tflops_training_per_device
    # counts it: 4·B·S²·heads·head_dim / 2 per layer, ×3, i.e. 6·L·S·d per token.
    maxtext = 4 * 6 * 4**2 * 2 * 4 / 2 * 2 * 3  # B=6 rows, S=4, 2 heads × head_dim 4, 2 layers
    assert train.step_flop(a, 2) == tokens * 6 * n + maxtext
    m = _args(
        "--model",
        "mlp",
        "--d_model",
        "8",
        "--d_ff",
        "16",
        "--num_layers",
        "2",
        "--per_device_batch",
        "3",
    )
    assert train.step_flop(m, 2) == 6 * 6 * (2 * 2 * 8 * 16 + 64)
    assert train.step_flop(m, 2, causal=False) == train.step_flop(m, 2)


def test_verify_needs_sgd() -> None:
    assert _args("--verify").optimizer == "sgd"
    assert _args().optimizer == "adamw"
    with pytest.raises(SystemExit):
        _args("--verify", "--optimizer", "adamw")


def test_bad_flags_rejected() -> None:
    with pytest.raises(SystemExit):
        _args("--d_model", "10", "--num_heads", "3")
    with pytest.raises(SystemExit):
        _args("--steps", "2", "--warmup", "2")


@pytest.mark.jax
@pytest.mark.slow
def test_train_layouts_agree_and_match_unsharded() -> None:
    layouts = {k: LAYOUTS[k] for k in ("fsdp4xtensor2", "data2xfsdp4")}  # --verify does the rest
    results = {name: run_ok("train.py", TINY + flags)[0] for name, flags in layouts.items()}
    # Unsharded: one device, the same global batch (2 rows × 8 devices).
    (single,) = run_ok("train.py", [*TINY, "--per_device_batch", "16"], devices=1)
    assert single["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
    for name, res in results.items():
        assert res["losses"] == pytest.approx(single["losses"], rel=1e-4), name
        assert res["fingerprint"] == pytest.approx(single["fingerprint"], rel=1e-4), name
        assert res["tokens_per_step"] == 16 * 16
    assert single["losses"][-1] < single["losses"][0]


@pytest.mark.jax
def test_train_verify_transformer_bf16() -> None:
    flags = [a for a in TINY if a not in ("--dtype", "f32", "--lr", "3e-3")]
    (proc,) = run_payload("train.py", [*flags, "-if", "4", "-it", "2", "--verify"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verify: ok (max rel err " in proc.stdout
    assert "tolerance 0.0703 = 3·eps_bf16·(L+1)" in proc.stdout
    res = proc.result()
    assert res["verify_ok"] is True
    assert res["verify_max_rel_err"] < res["verify_tolerance"] / 3


@pytest.mark.jax
@pytest.mark.slow
def test_train_verify_two_processes_mlp_f32() -> None:
    mlp = ["--model", "mlp", "--d_model", "64", "--d_ff", "128", "--dtype", "f32"]
    procs = run_payload(
        "train.py",
        [*mlp, "-dd", "2", "-if", "2", "-it", "2", "--verify"],
        processes=2,
        devices=4,
        timeout=180,
    )
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
        assert "verify: ok (max rel err " in p.stdout
        assert "16·eps_f32·(L+1)" in p.stdout
    assert [p.result()["verify_ok"] for p in procs] == [True, True]


# train.py with its batch's first device shard zeroed before the step (a bug the reference,
# which gets the batch straight from make_batch, does not share).
ZEROED_SHARD = """
import sys
sys.path.insert(0, "payloads")
import train
real = train.to_global
def to_global(sharding, array):
    bad = array.copy()
    bad[: len(bad) // 8] = 0
    return real(sharding, bad)
train.to_global = to_global
train.main(sys.argv[1:])
"""


@pytest.mark.jax
@pytest.mark.slow
def test_train_verify_catches_a_zeroed_input_shard() -> None:
    mlp = ["--model", "mlp", "--d_model", "64", "--d_ff", "128", "--dtype", "f32"]
    proc = subprocess.run(
        [sys.executable, "-c", ZEROED_SHARD, *mlp, "-if", "8", "--verify"],
        cwd=ROOT,
        env=base_env(8),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "verify: FAILED: worst leaf " in proc.stdout
    assert "error: verify failed" in proc.stderr


@pytest.mark.jax
@pytest.mark.slow
def test_train_mlp_loss_falls_bf16() -> None:
    (proc,) = run_payload(
        "train.py",
        [
            "--model",
            "mlp",
            "--d_model",
            "64",
            "--d_ff",
            "128",
            "--per_device_batch",
            "4",
            "--steps",
            "12",
            "-if",
            "4",
            "-it",
            "2",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = proc.result()
    assert res["dtype"] == "bf16"
    assert res["losses"][-1] < 0.8 * res["losses"][0]
    assert res["tflops_per_device"] > 0
    assert res["utilization"] is None
    timed = res["step_times_s"][2:]  # default --warmup 2
    assert res["step_time_s"] == pytest.approx(sum(timed) / len(timed))
    # one definition of what the step time is the mean of: the payload's line and the run's
    # summary say the same number of steps
    assert (res["timed_steps"], res["warmup_steps"]) == (10, 2)
    assert "(time: mean of 10 steps after 2 warm-up," in proc.stdout
    assert summary_head(res).startswith(
        f"{res['step_time_s']:.3g} s/step (mean of 10 steps after 2 warm-up), "
    )
    assert res["tflops_per_device_full_mask"] == res["tflops_per_device"]  # no attention


@pytest.mark.jax
@pytest.mark.slow
def test_train_four_processes_agree() -> None:
    results = run_ok(
        "train.py", [*TINY, "-dd", "2", "-if", "4"], processes=4, devices=2, timeout=240
    )
    first = results[0]
    assert first["num_processes"] == 4
    assert first["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    for res in results:
        assert res["fingerprint"] == first["fingerprint"]  # the same gathered weights
        assert res["losses"] == first["losses"]
    assert first["losses"][-1] < first["losses"][0]


@pytest.mark.jax
@pytest.mark.slow
def test_train_four_processes_bad_mesh_all_exit() -> None:
    procs = run_payload(
        "train.py", [*TINY, "-dd", "2", "-if", "2"], processes=4, devices=2, timeout=60
    )
    for p in procs:
        assert p.returncode == 2, p.stderr[-2000:]
        assert "4 != 8 devices" in p.stderr
        assert "Traceback" not in p.stderr
    assert max(p.seconds for p in procs) < 30


def test_memory_estimate_hand_count() -> None:
    a = _args(
        "--model",
        "mlp",
        "--d_model",
        "4",
        "--d_ff",
        "8",
        "--num_layers",
        "1",
        "--per_device_batch",
        "3",
        "--dtype",
        "f32",
        "--optimizer",
        "sgd",
    )
    state, acts = train.memory_bytes(a, 2)
    params = 2 * 4 * 8 + 4 * 4  # up and down, plus the output projection
    assert state == 4 * params * 2 / 2  # weights and gradients in f32, over 2 shards
    assert acts == 3 * (8 * 4 + 2 * 8) * 4  # 3 rows × one layer × (8·d + 2·d_ff) f32 values


def test_train_memory_guard() -> None:
    (proc,) = run_payload("train.py", [*TINY, "--memory_limit_gb", "0.00001"])
    assert proc.returncode != 0
    assert "estimated memory per process (8 CPU devices" in proc.stderr
    assert "a smaller model or batch" in proc.stderr


# Train 6 steps saving every 2, lose the last save (as if preempted while writing it), train
# again: one interpreter, so JAX is imported once.
RESUME = """
import sys
from pathlib import Path
sys.path.insert(0, "payloads")
import train
flags, ckpt = sys.argv[1:], Path(sys.argv[sys.argv.index("--checkpoint-dir") + 1])
train.main(flags)
print("SAVED", " ".join(sorted(p.name for p in ckpt.iterdir())), flush=True)
(ckpt / "step-00000006.process-0.npz").unlink()
train.main(flags)
"""


@pytest.mark.jax
def test_train_resumes_from_its_newest_complete_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flags = [
        "--model",
        "mlp",
        "--d_model",
        "32",
        "--d_ff",
        "64",
        "--num_layers",
        "1",
        "--dtype",
        "f32",
        "--steps",
        "6",
        "--warmup",
        "0",
        "-if",
        "2",
        "--checkpoint-dir",
        str(tmp_path),
        "--checkpoint-every",
        "2",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", RESUME, *flags],
        cwd=ROOT,
        env=base_env(2),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SAVED step-00000004.process-0.npz step-00000006.process-0.npz" in proc.stdout
    assert "checkpoint: none in" in proc.stdout
    assert "checkpoint: resuming at step 4 from" in proc.stdout
    full, resumed = parse_result_lines(proc.stdout)
    assert (full["first_step"], resumed["first_step"]) == (0, 4)
    assert resumed["losses"] == full["losses"][4:]
    assert resumed["fingerprint"] == full["fingerprint"]  # bit for bit where it would have been


def test_checkpoint_flags_checked() -> None:
    with pytest.raises(SystemExit):
        _args("--checkpoint-every", "2")
    with pytest.raises(SystemExit):
        _args("--checkpoint-dir", "d", "--checkpoint-every", "-1")
    assert _args("--checkpoint_dir", "d").checkpoint_every == 0
