"""MaxText's sharding benchmark (pedagogical_examples/shardings.py) on today's JAX.

A stack of sigmoid matmul layers trained one SGD step at a time over a (data, fsdp, tensor)
mesh; prints MaxText's lines and one MULTIHOST_RESULT line. `--verify` instead checks one step
against a float64 numpy reference and prints `verify: ok (...)` or `verify: FAILED ...`.
Run: python payloads/shardings.py -d 2048 -b 131072 -if 4
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable
from typing import Any

import memory
import meshing
import numpy as np
import steps
import verify

Layers = list[dict[str, Any]]
SEED_INIT_SCALE = 1e-4  # MaxText's initialisation: every bf16 activation rounds to 0.5
VERIFY_MAX_BYTES = 2e9  # the float64 host reference keeps about this much at most


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """MaxText's flags plus --tries, --warmup, --seed, --impl, --verify and the guards."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embedding_dimension", "-d", type=int, default=2048)
    p.add_argument("--batch_size", "-b", type=int, default=131072, help="per device")
    p.add_argument("--num_layers", "-n", type=int, default=4)
    p.add_argument("--profiler_path", "-p", default="", help="write a trace here if set")
    meshing.add_mesh_flags(p, ici_fsdp_default=4)
    p.add_argument("--tries", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--impl",
        choices=steps.IMPLS,
        default="jit",
        help="jit: the compiler places the collectives (MaxText); shard_map: hand-written ones",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="check one step against a float64 numpy reference instead of timing (small sizes)",
    )
    p.add_argument(
        "--init_scale",
        type=float,
        default=None,
        help=f"weights = scale·normal (default {SEED_INIT_SCALE} as MaxText; 1/sqrt(d) with "
        "--verify, where the seed's scale makes every activation 0.5)",
    )
    p.add_argument(
        "--memory_limit_gb",
        type=float,
        default=None,
        help="memory limit for the guard: per machine on CPU (its processes' devices share its "
        "RAM; default: its available memory), per device elsewhere (env "
        "MULTIHOST_MEMORY_LIMIT_GB)",
    )
    args = p.parse_args(argv)
    for name in ("embedding_dimension", "batch_size", "num_layers", "tries"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.init_scale is None:
        args.init_scale = args.embedding_dimension**-0.5 if args.verify else SEED_INIT_SCALE
    if not args.init_scale > 0:
        p.error("--init_scale must be > 0")
    return args


def num_params(d: int, layers: int) -> int:
    """Parameter count: two (4D, D) matrices per layer."""
    return 2 * 4 * d * d * layers


def tflop_per_device(d: int, layers: int, batch_per_device: int) -> float:
    """TFLOP per device per step: 6 × params × global batch / devices = 48·D²·L·b / 1e12."""
    return 6 * num_params(d, layers) * batch_per_device / 1e12


def memory_bytes(d: int, layers: int, global_batch: int) -> tuple[float, float]:
    """Total (params, activations) bytes in bf16, MaxText's accounting (5·D kept per row)."""
    return 2.0 * num_params(d, layers), 2.0 * global_batch * 5 * d * layers


def per_device_bytes(
    params_b: float, acts_b: float, shape: dict[str, int], n_dev: int
) -> tuple[float, float]:
    """(MaxText's per-device need, the need on CPU). Weights are replicated over "data" and
    activations split over every device. On CPU, XLA also keeps each layer's all-gathered
    weights for the backward pass and the float32 gradient before its reduce-scatter: about 3x
    the weights on every device, split only over "tensor" (peak RSS measured within 25%, d
    512-2048, 2-8 devices, fsdp and tensor meshes)."""
    maxtext = params_b / (shape["fsdp"] * shape["tensor"]) + acts_b / n_dev
    return maxtext, maxtext + 3 * params_b / shape["tensor"]


def gen_layers(key: Any, d: int, layers: int, scale: float = SEED_INIT_SCALE) -> Layers:
    """Layer weights (4D, D) bf16, scale·normal; key i → EMB2FF of layer i//2 etc."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(key, 2 * layers)
    return [
        {
            "EMB2FF": scale * jax.random.normal(keys[2 * i], (4 * d, d), dtype=jnp.bfloat16),
            "FF2EMB": scale * jax.random.normal(keys[2 * i + 1], (4 * d, d), dtype=jnp.bfloat16),
        }
        for i in range(layers)
    ]


def gen_data(key: Any, global_batch: int, d: int) -> Any:
    """Input activations uniform in [0, 1), bf16."""
    import jax
    import jax.numpy as jnp

    return jax.random.uniform(key, (global_batch, d), dtype=jnp.bfloat16)


def split_key(seed: int) -> tuple[Any, Any]:
    """(data key, params key) from the seed."""
    import jax

    data_key, params_key = jax.random.split(jax.random.key(seed))
    return data_key, params_key


def make_inputs(mesh: Any, seed: int, global_batch: int, d: int, layers: int, scale: float) -> Any:
    """(x, layers), born sharded: created inside jit straight into their shardings."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    data_key, params_key = split_key(seed)
    act = NamedSharding(mesh, P(*steps.ACT_SPEC))
    layer = NamedSharding(mesh, P(*steps.LAYER_SPEC))
    x = jax.jit(gen_data, static_argnums=(1, 2), out_shardings=act)(data_key, global_batch, d)
    params = jax.jit(gen_layers, static_argnums=(1, 2, 3), out_shardings=layer)(
        params_key, d, layers, scale
    )
    return x, params


def host_inputs(
    seed: int, global_batch: int, d: int, layers: int, scale: float
) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
    """The same x and initial weights, generated unsharded on this host's CPU, in float64."""
    import jax

    cpu = jax.local_devices(backend="cpu")[0]
    with jax.default_device(cpu):
        data_key, params_key = split_key(seed)
        x = jax.jit(gen_data, static_argnums=(1, 2))(data_key, global_batch, d)
        params = jax.jit(gen_layers, static_argnums=(1, 2, 3))(params_key, d, layers, scale)
    return _f64(x), [{name: _f64(w[name]) for name in steps.NAMES} for w in params]


def _f64(array: Any) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def time_steps(run: Callable[[], Any], warmup: int, tries: int) -> tuple[list[float], Any]:
    """Run warmup untimed calls then tries timed ones; returns (seconds each, last output)."""
    import jax

    out = None
    for i in range(warmup):  # each step annotated: a trace (multihost trace) shows step times
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            out = jax.block_until_ready(run())
    timings = []
    for i in range(warmup, warmup + tries):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            start = time.perf_counter()
            out = jax.block_until_ready(run())
            timings.append(time.perf_counter() - start)
    return timings, out


def tolerance(layers: int) -> tuple[float, str]:
    """The verify tolerance for a depth: (value, how it is derived).

    Each layer rounds two activations forward and two cotangents backward to bf16, and the
    new weights are bf16: the normwise error grows about linearly with depth. Measured on CPU
    (d 64..256, L 1..8, 1..4 processes, both impls): 0.2..0.3·eps_bf16 per layer. One eps_bf16
    per layer plus one for the final rounding leaves a margin of >= 3x.
    """
    return verify.EPS_BF16 * (layers + 1), f"eps_bf16·(L+1), eps_bf16 = 2^-7, L = {layers}"


def run_verify(
    mesh: Any,
    impl: str,
    x: Any,
    params: Layers,
    expected: tuple[np.ndarray, list[dict[str, np.ndarray]]],
    hooks: steps.Hooks = steps.REAL,
) -> tuple[verify.Verdict, float]:
    """One step against the float64 numpy reference: (verdict, learning rate used).

    The sharded inputs are first checked against `expected` (host_inputs: the same values
    generated unsharded), then the step's updates and loss against `steps.reference_step` of
    the sharded inputs. The step is `steps.make_step` as the timing path builds it (hooks
    inject test bugs); all processes call this (it gathers) and get the same verdict.
    """
    x_h, p_h = verify.host_copy((x, params))
    got: dict[str, Any] = {"init.x": x_h}
    ref: dict[str, Any] = {"init.x": expected[0]}
    for i, (w_got, w_ref) in enumerate(zip(p_h, expected[1], strict=True)):
        for name in steps.NAMES:
            got[f"init.layer{i}.{name}"] = w_got[name]
            ref[f"init.layer{i}.{name}"] = w_ref[name]
    _, minus_grads = steps.reference_step(x_h, p_h, 1.0)
    names = [(i, n) for i in range(len(p_h)) for n in steps.NAMES]
    lr = verify.update_lr(
        {f"{i}.{n}": p_h[i][n] for i, n in names}, {f"{i}.{n}": minus_grads[i][n] for i, n in names}
    )
    ref_loss, ref_updates = steps.reference_step(x_h, p_h, lr)
    loss, new = steps.make_step(mesh, impl, lr, hooks)(x, params)
    loss_h, new_h = verify.host_copy((loss, new))
    got["loss"], ref["loss"] = float(loss_h), ref_loss
    for i, (before, after, upd) in enumerate(zip(p_h, new_h, ref_updates, strict=True)):
        for name in steps.NAMES:
            got[f"layer{i}.{name}"] = after[name] - before[name]
            ref[f"layer{i}.{name}"] = upd[name]
    tol, rule = tolerance(len(params))
    return verify.compare(got, ref, tol, rule), lr


def main(argv: list[str] | None = None) -> None:
    """Build the mesh, check memory, time (or verify) the step, print MaxText's lines."""
    args = parse_args(argv)
    meshing.init_distributed()  # before any other JAX call

    import jax

    mesh, plan = meshing.mesh_from_args(args)
    d, layers, b = args.embedding_dimension, args.num_layers, args.batch_size
    n_dev = jax.device_count()
    global_batch = b * n_dev
    print(f"Devices: {jax.devices()} (num_devices: {n_dev})", flush=True)
    print(f"Decided on mesh shape: {plan.shape} (dcn {plan.dcn}, ici {plan.ici})", flush=True)

    params_b, acts_b = memory_bytes(d, layers, global_batch)
    print(
        f"total {(params_b + acts_b) / 1e9:.3f} GB, parameters {params_b / 1e9:.3f} GB, "
        f"activations {acts_b / 1e9:.3f} GB",
        flush=True,
    )
    memory.check(*per_device_bytes(params_b, acts_b, plan.shape, n_dev), args.memory_limit_gb)
    if args.verify and 4 * (params_b + acts_b) > VERIFY_MAX_BYTES:
        meshing.fail(
            f"--verify keeps the whole step in float64 on each host, "
            f"{4 * (params_b + acts_b) / 1e9:.1f} GB here (limit {VERIFY_MAX_BYTES / 1e9:.0f}"
            " GB): use a smaller -d/-b/-n"
        )

    fields: dict[str, Any] = dict(
        impl=args.impl,
        embedding_dimension=d,
        batch_size_per_device=b,
        num_layers=layers,
        init_scale=args.init_scale,
    )
    if args.verify:
        expected = host_inputs(args.seed, global_batch, d, layers, args.init_scale)
    with jax.set_mesh(mesh):
        x, params = make_inputs(mesh, args.seed, global_batch, d, layers, args.init_scale)
        if args.verify:
            verdict, lr = run_verify(mesh, args.impl, x, params, expected)
            print(verdict.line(), flush=True)
            fields.update(verdict.fields(), verify_lr=lr)
            meshing.print_result({**meshing.result_fields("shardings", mesh, None), **fields})
            if not verdict.ok:
                meshing.fail("verify failed", code=1)
            return
        step = steps.make_step(mesh, args.impl)
        if args.profiler_path:
            jax.profiler.start_trace(args.profiler_path)
        timings, (loss, new_params) = time_steps(lambda: step(x, params), args.warmup, args.tries)
        if args.profiler_path:
            jax.profiler.stop_trace()
        finger = verify.fingerprint(new_params)

    stats = meshing.timing_stats(timings)
    mean = stats["mean_s"]
    tflop = tflop_per_device(d, layers, b)
    print(f"average time: {mean}, timings (seconds) {timings}", flush=True)
    print(f"time is {mean} seconds, TFLOP is {tflop}, TFLOP/s is {tflop / mean}")
    print(
        f"  (time is the {meshing.mean_of(len(timings), args.warmup)}, as MaxText's; median "
        f"{stats['median_s']:.6g} s, min {stats['min_s']:.6g} s, max {stats['max_s']:.6g} s)",
        flush=True,
    )
    fields.update(
        meshing.result_fields("shardings", mesh, tflop / mean),
        step_time_s=mean,
        timed_steps=len(timings),  # timings_s holds only these: the warm-up is not timed
        warmup_steps=args.warmup,
        step_time_median_s=stats["median_s"],
        step_time_min_s=stats["min_s"],
        step_time_max_s=stats["max_s"],
        timings_s=timings,
        tflop_per_device=tflop,
        tflops_per_device=tflop / mean,
        tflops_per_device_median=tflop / stats["median_s"],
        loss=float(loss),
        fingerprint=finger,
        checksum=finger,  # old name of the fingerprint, kept for existing readers
        finished_utc=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    meshing.print_result(fields)


if __name__ == "__main__":
    main()
