"""shardings.py's training step, twice (compiler collectives and hand-written shard_map), and
its float64 numpy reference.

The step: per layer M1 = sigmoid(x @ EMB2FF.T), M2 = sigmoid(M1 @ FF2EMB); loss = sum of the
last activations; SGD p - lr·grad. `Hooks` are the seams where a test injects a bug into a copy
of the step (a skipped layer, a wrong activation, a dropped psum, ...); the defaults are the
real step, which is what the CLI runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IMPLS = ("jit", "shard_map")
ACT_SPEC = (("data", "fsdp"), "tensor")  # activations: batch over data×fsdp, features over tensor
LAYER_SPEC = ("tensor", "fsdp")  # weights (4D, D): rows over tensor, columns over fsdp
NAMES = ("EMB2FF", "FF2EMB")

Layers = list[dict[str, Any]]


def _identity(value: Any) -> Any:
    return value


def _sigmoid(z: Any) -> Any:
    import jax

    return jax.nn.sigmoid(z)


def _sgd(layer: int, name: str, p: Any, g: Any, lr: float) -> Any:
    del layer, name
    return p - lr * g


def _psum(value: Any, axis: str) -> Any:
    import jax

    return jax.lax.psum(value, axis)


@dataclass(frozen=True)
class Hooks:
    """Where the step can be changed; the defaults are the real step."""

    inputs: Callable[[Any], Any] = _identity  # global x → x, before the layers
    act: Callable[[Any], Any] = _sigmoid  # the activation
    order: tuple[str, str] = NAMES  # which leaf is used as M1's and which as M2's matrix
    skip: frozenset[int] = field(default_factory=frozenset)  # layers left out of the forward
    update: Callable[[int, str, Any, Any, float], Any] = _sgd  # (layer, name, p, g, lr) → p'
    outputs: Callable[[Layers], Layers] = _identity  # global new layers → layers
    psum: Callable[[Any, str], Any] = _psum  # shard_map: the data-parallel gradient reduction


REAL = Hooks()


@functools.lru_cache(maxsize=64)
def make_step(
    mesh: Any, impl: str = "jit", lr: float = 1e-4, hooks: Hooks = REAL
) -> Callable[[Any, Layers], tuple[Any, Layers]]:
    """The jitted step (x, layers) → (loss, updated layers), sharded as MaxText shards it; one
    per (mesh, impl, lr, hooks), so that a process that runs the payload again (``sweep
    --warm``, a session) runs the step it compiled then."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    act_sharding = NamedSharding(mesh, P(*ACT_SPEC))
    layer_sharding = NamedSharding(mesh, P(*LAYER_SPEC))
    if impl == "jit":
        inner = _jit_body(act_sharding, lr, hooks)
    elif impl == "shard_map":
        inner = _shard_map_body(mesh, lr, hooks)
    else:
        raise ValueError(f"unknown impl {impl!r}; expected one of {IMPLS}")

    def step(x: Any, layers: Layers) -> tuple[Any, Layers]:
        loss, new = inner(hooks.inputs(x), layers)
        return loss, hooks.outputs(new)

    return jax.jit(
        step,
        in_shardings=(act_sharding, layer_sharding),
        out_shardings=(None, layer_sharding),
    )


def _jit_body(act_sharding: Any, lr: float, hooks: Hooks) -> Callable[[Any, Layers], Any]:
    """MaxText's step: the compiler places the collectives from the sharding constraints."""
    import jax
    import jax.numpy as jnp

    def layer(x: Any, w: dict[str, Any]) -> Any:
        w1, w2 = (w[name] for name in hooks.order)
        with jax.named_scope("M1"):
            m1 = jax.lax.with_sharding_constraint(hooks.act(x @ w1.T), act_sharding)
        with jax.named_scope("M2"):
            return jax.lax.with_sharding_constraint(hooks.act(m1 @ w2), act_sharding)

    def loss_fn(x: Any, layers: Layers) -> Any:
        for i, w in enumerate(layers):
            if i not in hooks.skip:
                x = layer(x, w)
        return jnp.sum(x)

    def body(x: Any, layers: Layers) -> Any:
        loss, grads = jax.value_and_grad(loss_fn, argnums=1)(x, layers)
        new = [
            {name: hooks.update(i, name, w[name], g[name], lr) for name in NAMES}
            for i, (w, g) in enumerate(zip(layers, grads, strict=True))
        ]
        return loss, new

    return body


def _shard_map_body(mesh: Any, lr: float, hooks: Hooks) -> Callable[[Any, Layers], Any]:
    """The same step per device with explicit collectives, forward and backward by hand.

    FSDP: each layer's weights are all-gathered over fsdp before use and their gradients
    reduce-scattered back, then summed over data. Tensor: M1 is column-parallel (x gathered
    over tensor, 4D split), M2 row-parallel (partial sums reduce-scattered over tensor).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    gather = jax.lax.all_gather
    scatter = jax.lax.psum_scatter

    def local(x: Any, layers: Layers) -> Any:
        saved: list[tuple[Any, ...] | None] = []
        for i, w in enumerate(layers):
            if i in hooks.skip:
                saved.append(None)
                continue
            w1, w2 = (gather(w[name], "fsdp", axis=1, tiled=True) for name in hooks.order)
            xg = gather(x, "tensor", axis=1, tiled=True)  # [b, D]
            m1, vjp1 = jax.vjp(hooks.act, xg @ w1.T)  # [b, 4D/t]
            z2 = scatter(m1 @ w2, "tensor", scatter_dimension=1, tiled=True)  # [b, D/t]
            x, vjp2 = jax.vjp(hooks.act, z2)
            saved.append((xg, w1, m1, vjp1, w2, vjp2))
        loss = jax.lax.psum(jnp.sum(x, dtype=jnp.float32), ("data", "fsdp", "tensor"))

        def reduce(g: Any) -> Any:  # [4D/t, D] partial over the local batch → [4D/t, D/f]
            return hooks.psum(scatter(g, "fsdp", scatter_dimension=1, tiled=True), "data")

        dx = jnp.ones_like(x)  # d loss / d last activations
        grads: list[dict[str, Any]] = []
        for i in reversed(range(len(layers))):
            record = saved[i]
            if record is None:
                grads.append({name: jnp.zeros_like(layers[i][name]) for name in NAMES})
                continue
            xg, w1, m1, vjp1, w2, vjp2 = record
            (dz2,) = vjp2(dx)
            dz2g = gather(dz2, "tensor", axis=1, tiled=True)  # [b, D]
            dw2 = m1.T @ dz2g
            (dz1,) = vjp1(dz2g @ w2.T)  # [b, 4D/t]
            dw1 = dz1.T @ xg
            dx = scatter(dz1 @ w1, "tensor", scatter_dimension=1, tiled=True)
            grads.append(dict(zip(hooks.order, (reduce(dw1), reduce(dw2)), strict=True)))
        grads.reverse()
        new = [
            {name: hooks.update(i, name, w[name], g[name], lr) for name in NAMES}
            for i, (w, g) in enumerate(zip(layers, grads, strict=True))
        ]
        return loss.astype(x.dtype), new

    act, layer = P(*ACT_SPEC), P(*LAYER_SPEC)
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(act, layer),
        out_specs=(P(), layer),
        check_vma=False,  # hooks may drop a collective; verify, not tracing, must catch it
    )


# ---------------------------------------------------------------- float64 host reference


def reference_step(
    x: np.ndarray, layers: list[dict[str, np.ndarray]], lr: float
) -> tuple[float, list[dict[str, np.ndarray]]]:
    """The step in float64 numpy, unsharded: (loss, updates = new - initial per leaf)."""
    h = np.asarray(x, dtype=np.float64)
    saved = []
    for w in layers:
        w1, w2 = (np.asarray(w[n], dtype=np.float64) for n in NAMES)
        m1 = 1.0 / (1.0 + np.exp(-(h @ w1.T)))
        m2 = 1.0 / (1.0 + np.exp(-(m1 @ w2)))
        saved.append((h, w1, m1, w2, m2))
        h = m2
    loss = float(h.sum())
    dh = np.ones_like(h)
    updates: list[dict[str, np.ndarray]] = []
    for h0, w1, m1, w2, m2 in reversed(saved):
        dz2 = dh * m2 * (1.0 - m2)
        dw2 = m1.T @ dz2
        dz1 = (dz2 @ w2.T) * m1 * (1.0 - m1)
        dw1 = dz1.T @ h0
        dh = dz1 @ w1
        updates.append({"EMB2FF": -lr * dw1, "FF2EMB": -lr * dw2})
    updates.reverse()
    return loss, updates
