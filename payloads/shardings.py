"""MaxText's sharding benchmark (pedagogical_examples/shardings.py) on today's JAX.

A stack of sigmoid matmul layers trained one SGD step at a time over a (data, fsdp, tensor)
mesh; prints MaxText's lines and one MULTIHOST_RESULT line.
Run: python payloads/shardings.py -d 2048 -b 131072 -if 4
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable
from typing import Any

import meshing

Layers = list[dict[str, Any]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """MaxText's flags plus --tries, --warmup, --seed and --memory_limit_gb."""
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
        "--memory_limit_gb",
        type=float,
        default=None,
        help="per-device memory limit for the guard (env MULTIHOST_MEMORY_LIMIT_GB)",
    )
    args = p.parse_args(argv)
    for name in ("embedding_dimension", "batch_size", "num_layers", "tries"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
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


def gen_layers(key: Any, d: int, layers: int) -> Layers:
    """Layer weights (4D, D) bf16, 1e-4·normal; key i → EMB2FF of layer i//2 etc."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(key, 2 * layers)
    return [
        {
            "EMB2FF": 1e-4 * jax.random.normal(keys[2 * i], (4 * d, d), dtype=jnp.bfloat16),
            "FF2EMB": 1e-4 * jax.random.normal(keys[2 * i + 1], (4 * d, d), dtype=jnp.bfloat16),
        }
        for i in range(layers)
    ]


def gen_data(key: Any, global_batch: int, d: int) -> Any:
    """Input activations uniform in [0, 1), bf16."""
    import jax
    import jax.numpy as jnp

    return jax.random.uniform(key, (global_batch, d), dtype=jnp.bfloat16)


def split_key(seed: int) -> tuple[Any, Any]:
    """(data key, params key) from the seed; the test's reference uses the same split."""
    import jax

    data_key, params_key = jax.random.split(jax.random.key(seed))
    return data_key, params_key


def make_step(act_sharding: Any, layer_sharding: Any) -> Callable[[Any, Layers], Any]:
    """The jitted training step: (x, layers) → (loss, layers - 1e-4·grad)."""
    import jax
    import jax.numpy as jnp

    def layer(x: Any, w: dict[str, Any]) -> Any:
        with jax.named_scope("M1"):
            m1 = jax.nn.sigmoid(x @ w["EMB2FF"].T)
            m1 = jax.lax.with_sharding_constraint(m1, act_sharding)
        with jax.named_scope("M2"):
            m2 = jax.nn.sigmoid(m1 @ w["FF2EMB"])
            return jax.lax.with_sharding_constraint(m2, act_sharding)

    def loss_fn(x: Any, layers: Layers) -> Any:
        for w in layers:
            x = layer(x, w)
        return jnp.sum(x)

    def step(x: Any, layers: Layers) -> tuple[Any, Layers]:
        loss, grads = jax.value_and_grad(loss_fn, argnums=1)(x, layers)
        return loss, jax.tree.map(lambda p, g: p - 1e-4 * g, layers, grads)

    return jax.jit(
        step,
        in_shardings=(act_sharding, layer_sharding),
        out_shardings=(None, layer_sharding),
    )


def time_steps(run: Callable[[], Any], warmup: int, tries: int) -> tuple[list[float], Any]:
    """Run warmup untimed calls then tries timed ones; returns (seconds each, last output)."""
    import jax

    out = None
    for _ in range(warmup):
        out = jax.block_until_ready(run())
    timings = []
    for _ in range(tries):
        start = time.perf_counter()
        out = jax.block_until_ready(run())
        timings.append(time.perf_counter() - start)
    return timings, out


def checksum(layers: Layers) -> float:
    """Sum of all weights in float32, comparable across layouts."""
    import jax
    import jax.numpy as jnp

    total = jax.jit(lambda t: sum(jnp.sum(a.astype(jnp.float32)) for a in jax.tree.leaves(t)))
    return float(total(layers))


def main(argv: list[str] | None = None) -> None:
    """Build the mesh, check memory, time the step, print MaxText's lines and the result."""
    args = parse_args(argv)
    meshing.init_distributed()  # before any other JAX call

    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

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
    # Weights are replicated over "data"; activations are split over every device.
    weight_shards = plan.shape["fsdp"] * plan.shape["tensor"]
    meshing.check_memory(
        params_b / weight_shards + acts_b / n_dev, args.memory_limit_gb, jax.devices()[0]
    )

    act_sharding = NamedSharding(mesh, P(("data", "fsdp"), "tensor"))
    layer_sharding = NamedSharding(mesh, P("tensor", "fsdp"))
    data_key, params_key = split_key(args.seed)
    with jax.set_mesh(mesh):
        # Born sharded: created inside jit straight into their out_shardings.
        x = jax.jit(gen_data, static_argnums=(1, 2), out_shardings=act_sharding)(
            data_key, global_batch, d
        )
        params = jax.jit(gen_layers, static_argnums=(1, 2), out_shardings=layer_sharding)(
            params_key, d, layers
        )
        step = make_step(act_sharding, layer_sharding)
        if args.profiler_path:
            jax.profiler.start_trace(args.profiler_path)
        timings, (loss, new_params) = time_steps(lambda: step(x, params), args.warmup, args.tries)
        if args.profiler_path:
            jax.profiler.stop_trace()
        total = checksum(new_params)

    step_time = meshing.median(timings)
    tflop = tflop_per_device(d, layers, b)
    print(f"average time: {sum(timings) / len(timings)}, timings (seconds) {timings}", flush=True)
    print(f"time is {step_time} seconds, TFLOP is {tflop}, TFLOP/s is {tflop / step_time}")
    fields = meshing.result_fields("shardings", mesh, tflop / step_time)
    fields.update(
        embedding_dimension=d,
        batch_size_per_device=b,
        num_layers=layers,
        step_time_s=step_time,
        timings_s=timings,
        tflop_per_device=tflop,
        tflops_per_device=tflop / step_time,
        loss=float(loss),
        checksum=total,
        finished_utc=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    meshing.print_result(fields)


if __name__ == "__main__":
    main()
