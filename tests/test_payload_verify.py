"""shardings.py --verify: the real step passes on every layout and impl, and each class of bug
injected into a copy of the step (through steps.Hooks) makes it fail.

The matrix runs in one child process with 8 forced CPU devices (this file run as a script:
one JAX start, one jit per case); the tests read its json lines. A few runs of the CLI in 2
and 4 processes check the multi-process path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payloads"))

import steps  # noqa: E402
import verify  # noqa: E402

D, B, L = 64, 16, 2  # per-device batch B; 8 devices
LAYOUTS = {  # (data, fsdp, tensor) over 8 devices, as -id/-if/-it
    "fsdp8": (1, 8, 1),
    "fsdp4xtensor2": (1, 4, 2),
    "data2xfsdp4": (2, 4, 1),
    "data2xfsdp2xtensor2": (2, 2, 2),
}
MUTATION_LAYOUT = "data2xfsdp2xtensor2"  # every axis > 1, so every collective matters


def mutations() -> dict[str, steps.Hooks]:
    """One injected bug per class the seed's checksum missed (plus the ones it caught)."""
    import jax
    import jax.numpy as jnp

    def sgd(i: int, name: str, p: Any, g: Any, lr: float) -> Any:
        return p - lr * g

    def swap_halves(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # With fsdp = 2 the columns are two shards: put them in the wrong order.
        return [{k: jnp.roll(v, v.shape[1] // 2, axis=1) for k, v in w.items()} for w in layers]

    return {
        "skipped_layer": steps.Hooks(skip=frozenset({0})),
        "zeroed_input_shard": steps.Hooks(inputs=lambda x: x.at[: x.shape[0] // 8].set(0)),
        "zeroed_input": steps.Hooks(inputs=jnp.zeros_like),
        "flipped_update": steps.Hooks(update=lambda i, n, p, g, lr: p + lr * g),
        "update_only_last_layer": steps.Hooks(
            update=lambda i, n, p, g, lr: sgd(i, n, p, g, lr) if i == L - 1 else p
        ),
        "no_update": steps.Hooks(update=lambda i, n, p, g, lr: p),
        "shards_in_wrong_order": steps.Hooks(outputs=swap_halves),
        "swapped_matrices": steps.Hooks(order=("FF2EMB", "EMB2FF")),
        "dropped_psum": steps.Hooks(psum=lambda v, axis: v),  # shard_map only
        "averaged_psum": steps.Hooks(psum=jax.lax.pmean),
        "corrupted_init": steps.REAL,  # run_matrix corrupts the initial weights instead
        "activation_x(1+2^-6)": steps.Hooks(act=lambda z: jax.nn.sigmoid(z) * (1 + 2**-6)),
        "activation_x(1+2^-7)": steps.Hooks(act=lambda z: jax.nn.sigmoid(z) * (1 + 2**-7)),
    }


# Where each mutation is injected: both impls where each has its own code for it; one impl
# where the hooked code is the shared jit wrapper (inputs, outputs) or for the smallest error.
IMPLS_OF = {
    "zeroed_input_shard": ("jit",),
    "zeroed_input": ("jit",),
    "no_update": ("shard_map",),
    "shards_in_wrong_order": ("shard_map",),
    "dropped_psum": ("shard_map",),  # the compiler writes that reduction in the jit step
    "averaged_psum": ("shard_map",),
    "corrupted_init": ("jit",),
    "activation_x(1+2^-7)": ("jit",),
}


def run_matrix() -> None:
    """Child process: every layout × impl unmodified, then every mutation; json lines."""
    import jax
    import meshing
    import shardings

    def report(kind: str, name: str, impl: str, layout: str, hooks: steps.Hooks) -> None:
        args = shardings.parse_args(["-d", str(D), "-b", str(B), "-n", str(L), "--verify"])
        for axis, size in zip(("data", "fsdp", "tensor"), LAYOUTS[layout], strict=True):
            setattr(args, f"ici_{axis}_parallelism", size)
        mesh, _ = meshing.mesh_from_args(args)
        with jax.set_mesh(mesh):
            x, params = shardings.make_inputs(mesh, 0, B * 8, D, L, args.init_scale)
            if name == "corrupted_init":  # one layer's weight shards in the wrong order
                first = params[0]["EMB2FF"]
                params[0]["EMB2FF"] = jax.numpy.roll(first, first.shape[1] // 2, axis=1)
            verdict, lr = shardings.run_verify(mesh, impl, x, params, expected, hooks)
        row = {"kind": kind, "name": name, "impl": impl, "layout": layout, "lr": lr}
        row.update(verdict.fields(), line=verdict.line())
        print("CASE " + json.dumps(row), flush=True)

    expected = shardings.host_inputs(0, B * 8, D, L, D**-0.5)
    for layout in LAYOUTS:
        for impl in steps.IMPLS:
            report("real", "unmodified", impl, layout, steps.REAL)
    for name, hooks in mutations().items():
        for impl in IMPLS_OF.get(name, steps.IMPLS):
            report("mutation", name, impl, MUTATION_LAYOUT, hooks)


@pytest.fixture(scope="module")
def matrix() -> dict[tuple[str, str, str], dict[str, Any]]:
    """Run the child once; {(name, impl, layout): case}."""
    from tests.helpers import JAX_TEST_ENV  # here: the child runs this file as a script

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(JAX_TEST_ENV, JAX_NUM_CPU_DEVICES="8")
    proc = subprocess.run(
        [sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = [json.loads(ln[5:]) for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
    return {(c["name"], c["impl"], c["layout"]): c for c in cases}


@pytest.mark.jax
@pytest.mark.parametrize("impl", steps.IMPLS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_real_step_verifies(matrix: dict[Any, dict[str, Any]], layout: str, impl: str) -> None:
    case = matrix[("unmodified", impl, layout)]
    assert case["verify_ok"], case["line"]
    assert case["line"].startswith("verify: ok (max rel err ")
    # Far from the tolerance: the margin the tolerance claims.
    assert case["verify_max_rel_err"] < case["verify_tolerance"] / 3


@pytest.mark.jax
@pytest.mark.parametrize(
    ("name", "impl"),
    [
        (name, impl)
        for name in [
            "skipped_layer",
            "zeroed_input_shard",
            "zeroed_input",
            "flipped_update",
            "update_only_last_layer",
            "no_update",
            "shards_in_wrong_order",
            "swapped_matrices",
            "dropped_psum",
            "averaged_psum",
            "corrupted_init",
            "activation_x(1+2^-6)",
            "activation_x(1+2^-7)",
        ]
        for impl in IMPLS_OF.get(name, steps.IMPLS)
    ],
)
def test_mutation_caught(matrix: dict[Any, dict[str, Any]], name: str, impl: str) -> None:
    case = matrix[(name, impl, MUTATION_LAYOUT)]
    assert not case["verify_ok"], case["line"]
    # A bug in the inputs is named as one, a bug in the step as the step's.
    assert case["verify_worst_leaf"].startswith("init.") == (name == "corrupted_init")
    assert case["line"].startswith("verify: FAILED: worst leaf ")
    assert case["verify_worst_leaf"] in case["line"]


# ---------------------------------------------------------------- the reference and the rules


def test_reference_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    d, rows, layers = 3, 5, 2
    x = rng.uniform(size=(rows, d))
    params = [{n: rng.normal(scale=d**-0.5, size=(4 * d, d)) for n in steps.NAMES}]
    params *= layers
    params = [{n: w.copy() for n, w in p.items()} for p in params]
    loss, updates = steps.reference_step(x, params, lr=1.0)  # update = −grad
    h = 1e-6
    for i, name, idx in [(0, "EMB2FF", (2, 1)), (1, "FF2EMB", (7, 0)), (0, "FF2EMB", (11, 2))]:
        plus = [{n: w.copy() for n, w in p.items()} for p in params]
        plus[i][name][idx] += h
        minus = [{n: w.copy() for n, w in p.items()} for p in params]
        minus[i][name][idx] -= h
        numeric = steps.reference_step(x, plus, 1.0)[0] - steps.reference_step(x, minus, 1.0)[0]
        assert -updates[i][name][idx] == pytest.approx(numeric / (2 * h), rel=1e-6)
    assert loss > 0


def test_rel_err_and_verdict() -> None:
    ref = np.array([1.0, -2.0, 2.0])
    assert verify.rel_err(ref, ref) == 0.0
    assert verify.rel_err(ref * (1 + 1e-3), ref) == pytest.approx(1e-3)
    assert verify.rel_err(np.zeros(3), np.zeros(3)) == 0.0
    assert verify.rel_err(ref, np.zeros(3)) == float("inf")
    assert verify.rel_err(ref[:2], ref) == float("inf")
    good = verify.compare({"a": ref, "loss": 3.0}, {"a": ref, "loss": 3.0 + 1e-4}, 1e-3, "r")
    assert good.ok
    assert good.line().startswith("verify: ok (max rel err 3.33e-05 in loss, tolerance 0.001")
    nan = verify.compare({"a": ref * np.nan}, {"a": ref}, 1e-3, "r")
    assert not nan.ok
    assert nan.line().startswith("verify: FAILED: worst leaf a rel err nan")
    bad = verify.compare({"a": ref, "b": -ref}, {"a": ref, "b": ref}, 1e-3, "r")
    assert (bad.ok, bad.worst, bad.max_err) == (False, "b", 2.0)
    assert bad.fields()["verify_worst_leaf"] == "b"


def test_update_lr_makes_updates_dominate() -> None:
    w = {"a": np.array([0.5, -0.25]), "b": np.array([1.0])}
    g = {"a": np.array([1e-3, 0.0]), "b": np.array([3.0])}
    lr = verify.update_lr(w, g)
    assert lr == 2048.0  # 4·0.5/1e-3 = 2000 → next power of two
    for name in w:
        assert lr * np.max(np.abs(g[name])) >= 4 * np.max(np.abs(w[name]))


if __name__ == "__main__":
    run_matrix()
