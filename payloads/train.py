"""A small flax NNX + optax trainer over a (data, fsdp, tensor) mesh, for multi-host smoke tests.

Parameters carry partitioning annotations (FSDP on the embedding axis, Megatron-style tensor
parallelism on the hidden/head axis); model and optimizer state are created inside jit, so they
are born sharded. Data is synthetic but learnable, so the loss must fall. `--verify` checks one
SGD step against the same model run unsharded in float64 on the host CPU.
Run: python payloads/train.py --model transformer --steps 20
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import checkpoint
import memory
import meshing
import numpy as np
import verify

BATCH_AXES = ("data", "fsdp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Model, optimizer and mesh flags (ici fsdp defaults to -1: every device)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("mlp", "transformer"), default="transformer")
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--d_ff", type=int, default=1024)
    p.add_argument("--num_layers", type=int, default=2)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256, help="transformer vocabulary size")
    p.add_argument("--per_device_batch", type=int, default=8, help="sequences (rows) per device")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default=None, help="default adamw")
    p.add_argument("--lr", type=float, default=None, help="default 1e-3 adamw, 0.1 sgd")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="compute dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--checkpoint-dir",
        "--checkpoint_dir",
        dest="checkpoint_dir",
        default=None,
        help="save the training state here and, when a checkpoint is there, resume from its "
        "latest step (each process writes its own shards; see checkpoint.py)",
    )
    p.add_argument(
        "--checkpoint-every",
        "--checkpoint_every",
        dest="checkpoint_every",
        type=int,
        default=0,
        metavar="N",
        help="save every N steps (default 0: only after the last step)",
    )
    p.add_argument(
        "--step_sleep",
        type=float,
        default=0.0,
        metavar="S",
        help="sleep S seconds after each step (makes a tiny run last, e.g. to preempt it)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="check one SGD step against the model unsharded in float64 on the host, then exit",
    )
    p.add_argument(
        "--memory_limit_gb",
        type=float,
        default=None,
        help="memory limit for the guard: per machine on CPU (its processes' devices share its "
        "RAM; default: its available memory), per device elsewhere (env "
        "MULTIHOST_MEMORY_LIMIT_GB)",
    )
    meshing.add_mesh_flags(p, ici_fsdp_default=-1)
    args = p.parse_args(argv)
    for name in ("d_model", "d_ff", "num_layers", "num_heads", "seq_len", "vocab", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.per_device_batch < 1:
        p.error("--per_device_batch must be >= 1")
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, --steps={args.steps})")
    if args.d_model % args.num_heads:
        p.error(f"--d_model {args.d_model} is not divisible by --num_heads {args.num_heads}")
    if args.checkpoint_every < 0 or args.step_sleep < 0:
        p.error("--checkpoint-every and --step_sleep must be >= 0")
    if args.checkpoint_every and not args.checkpoint_dir:
        p.error("--checkpoint-every needs --checkpoint-dir")
    if args.checkpoint_dir and args.verify:
        p.error("--verify does not train: no --checkpoint-dir")
    if args.optimizer is None:
        args.optimizer = "sgd" if args.verify else "adamw"
    if args.verify and args.optimizer != "sgd":
        p.error("--verify checks one SGD step (adamw's first step is about sign(grad))")
    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == "adamw" else 0.1
    return args


def matmul_params(args: argparse.Namespace) -> int:
    """Parameters that take part in matmuls (embedding lookups excluded, unembedding kept)."""
    d, f, layers = args.d_model, args.d_ff, args.num_layers
    if args.model == "mlp":
        return layers * 2 * d * f + d * d
    return layers * (4 * d * d + 2 * d * f) + d * args.vocab


def tokens_per_step(args: argparse.Namespace, num_devices: int) -> int:
    """Tokens in the global batch: rows for the MLP, rows × seq_len for the transformer."""
    rows = args.per_device_batch * num_devices
    return rows if args.model == "mlp" else rows * args.seq_len


def attention_flop_per_token(args: argparse.Namespace, causal: bool = True) -> int:
    """QKᵀ and A·V: 2·S·d FLOP each forward per token and layer, ×3 with the backward pass,
    halved for the causal mask as MaxText counts (6·L·S·d); 12·L·S·d when causal=False."""
    if args.model == "mlp":
        return 0
    full = 12 * int(args.num_layers) * int(args.seq_len) * int(args.d_model)
    return full // 2 if causal else full


def step_flop(args: argparse.Namespace, num_devices: int, causal: bool = True) -> float:
    """FLOP per training step, whole job, by MaxText's definition
    (calculate_tflops_training_per_device): T·(6·N + 6·L·S·d).

    T = tokens per step, N = matmul parameters (L·(4d² + 2·d·d_ff) + d·V for the transformer,
    L·2·d·d_ff + d² for the MLP), L = layers, S = sequence length, d = d_model. 6·N: 2 forward
    + 4 backward FLOP per parameter and token. Attention: see attention_flop_per_token;
    causal=False gives the full-mask count the hardware executes (PaLM's, 12·L·S·d).
    """
    per_token = 6 * matmul_params(args) + attention_flop_per_token(args, causal)
    return tokens_per_step(args, num_devices) * per_token


def memory_bytes(args: argparse.Namespace, weight_shards: int) -> tuple[float, float]:
    """(parameter + gradient + optimizer state, activations) bytes per device, estimated.

    State is float32 and split over the fsdp × tensor devices (replicated over data): weights,
    gradients, and adamw's two moments (sgd keeps none). Activations kept for the backward
    pass, per token and layer: about 8·d + 2·d_ff values in the compute dtype, plus the
    attention scores and probabilities (2·heads·S float32) for the transformer; its logits
    add 2·V float32 per token.
    """
    state_copies = 4 if args.optimizer == "adamw" else 2
    embedding = 0 if args.model == "mlp" else args.vocab * args.d_model
    params = matmul_params(args) + embedding
    state = 4.0 * params * state_copies / weight_shards
    act_bytes = 2 if args.dtype == "bf16" else 4
    per_token_layer = (8 * args.d_model + 2 * args.d_ff) * act_bytes
    tokens = args.per_device_batch * (1 if args.model == "mlp" else args.seq_len)
    if args.model == "transformer":
        per_token_layer += 2 * args.num_heads * args.seq_len * 4
    acts = tokens * (args.num_layers * per_token_layer + (0 if embedding == 0 else 8 * args.vocab))
    return state, float(acts)


def build_model_classes() -> tuple[type, type]:
    """Define the NNX modules (after jax.distributed is up, so flax may import jax freely)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    init = nnx.initializers

    def dense(rngs: nnx.Rngs, n_in: int, n_out: int, names: tuple[Any, ...], dtype: Any) -> Any:
        kernel = nnx.with_partitioning(init.lecun_normal(), names)
        return nnx.Linear(n_in, n_out, use_bias=False, kernel_init=kernel, dtype=dtype, rngs=rngs)

    def norm(rngs: nnx.Rngs, d: int, dtype: Any) -> Any:
        return nnx.LayerNorm(
            d,
            dtype=dtype,
            scale_init=nnx.with_partitioning(init.ones_init(), (None,)),
            bias_init=nnx.with_partitioning(init.zeros_init(), (None,)),
            rngs=rngs,
        )

    class MlpBlock(nnx.Module):
        """Pre-norm feed-forward block: column-parallel up, row-parallel down."""

        def __init__(self, d: int, f: int, dtype: Any, rngs: nnx.Rngs) -> None:
            self.norm = norm(rngs, d, dtype)
            self.up = dense(rngs, d, f, ("fsdp", "tensor"), dtype)
            self.down = dense(rngs, f, d, ("tensor", "fsdp"), dtype)

        def __call__(self, x: jax.Array) -> jax.Array:
            h = jax.lax.with_sharding_constraint(self.norm(x), P(BATCH_AXES))
            return self.down(jax.nn.gelu(self.up(h)))

    class Attention(nnx.Module):
        """Causal multi-head self-attention; heads split over the tensor axis."""

        def __init__(self, d: int, heads: int, dtype: Any, rngs: nnx.Rngs) -> None:
            self.heads = heads
            self.norm = norm(rngs, d, dtype)
            self.q, self.k, self.v = (dense(rngs, d, d, ("fsdp", "tensor"), dtype) for _ in "qkv")
            self.o = dense(rngs, d, d, ("tensor", "fsdp"), dtype)

        def __call__(self, x: jax.Array) -> jax.Array:
            b, s, d = x.shape
            # Pin the normed input (and so its cotangent) batch-sharded: avoids a full remat.
            h = jax.lax.with_sharding_constraint(self.norm(x), P(BATCH_AXES))
            q, k, v = (
                f(h).reshape(b, s, self.heads, d // self.heads) for f in (self.q, self.k, self.v)
            )
            scores = jnp.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(d // self.heads)
            causal = jnp.tril(jnp.ones((s, s), dtype=bool))
            wide = jnp.promote_types(scores.dtype, jnp.float32)  # float64 in the reference
            scores = jnp.where(causal, scores.astype(wide), -1e30)
            probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
            return self.o(jnp.einsum("bhqk,bkhc->bqhc", probs, v).reshape(b, s, d))

    class MlpModel(nnx.Module):
        """Residual MLP regressor: x → x + Σ blocks → linear head."""

        def __init__(self, args: argparse.Namespace, dtype: Any, rngs: nnx.Rngs) -> None:
            d = args.d_model
            self.blocks = nnx.List(
                [MlpBlock(d, args.d_ff, dtype, rngs) for _ in range(args.num_layers)]
            )
            self.head = dense(rngs, d, d, ("fsdp", "tensor"), dtype)

        def __call__(self, x: jax.Array) -> jax.Array:
            for block in self.blocks:
                x = jax.lax.with_sharding_constraint(x + block(x), P(BATCH_AXES, None))
            return self.head(x)

    class Transformer(nnx.Module):
        """Decoder-only transformer with learned positions and an untied unembedding."""

        def __init__(self, args: argparse.Namespace, dtype: Any, rngs: nnx.Rngs) -> None:
            d = args.d_model
            embed_init = nnx.with_partitioning(init.normal(0.02), (None, "fsdp"))
            self.embed = nnx.Embed(args.vocab, d, embedding_init=embed_init, dtype=dtype, rngs=rngs)
            self.pos = nnx.Embed(args.seq_len, d, embedding_init=embed_init, dtype=dtype, rngs=rngs)
            self.attn = nnx.List(
                [Attention(d, args.num_heads, dtype, rngs) for _ in range(args.num_layers)]
            )
            self.mlp = nnx.List(
                [MlpBlock(d, args.d_ff, dtype, rngs) for _ in range(args.num_layers)]
            )
            self.final_norm = norm(rngs, d, dtype)
            self.unembed = dense(rngs, d, args.vocab, ("fsdp", "tensor"), dtype)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = self.embed(tokens) + self.pos(jnp.arange(tokens.shape[1]))
            for attn, mlp in zip(self.attn, self.mlp, strict=True):
                x = jax.lax.with_sharding_constraint(x + attn(x), P(BATCH_AXES, None, None))
                x = jax.lax.with_sharding_constraint(x + mlp(x), P(BATCH_AXES, None, None))
            logits = self.unembed(self.final_norm(x))
            return logits.astype(jnp.promote_types(logits.dtype, jnp.float32))

    return MlpModel, Transformer


def make_batch(args: argparse.Namespace, step: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole global batch for a step, identical on every process and for every layout."""
    rng = np.random.default_rng([args.seed, step])
    if args.model == "mlp":
        x = rng.standard_normal((rows, args.d_model), dtype=np.float32)
        teacher = np.random.default_rng([args.seed, 10**9]).standard_normal(
            (args.d_model, args.d_model), dtype=np.float32
        )
        # A fixed smooth teacher: something to learn.
        return x, np.sin(x @ teacher / np.sqrt(args.d_model)).astype(np.float32)
    # Arithmetic sequences mod vocab: the next token follows from the two before it.
    start = rng.integers(0, args.vocab, size=(rows, 1))
    stride = rng.integers(1, 8, size=(rows, 1))
    seq = (start + stride * np.arange(args.seq_len + 1)) % args.vocab
    return seq[:, :-1].astype(np.int32), seq[:, 1:].astype(np.int32)


def local_rows(sharding: Any, global_shape: tuple[int, ...]) -> slice:
    """The contiguous block of global rows this process's devices hold."""
    spans = set()
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        rows = index[0].indices(global_shape[0])
        spans.add((rows[0], rows[1]))
    ordered = sorted(spans)
    for (_, stop), (start, _) in itertools.pairwise(ordered):
        if start != stop:
            meshing.fail(f"this process's batch rows are not contiguous: {ordered}")
    return slice(ordered[0][0], ordered[-1][1])


def to_global(sharding: Any, array: np.ndarray) -> Any:
    """Give JAX only this process's rows; it assembles the global array."""
    import jax

    rows = local_rows(sharding, array.shape)
    return jax.make_array_from_process_local_data(sharding, array[rows], array.shape)


def loss_fn(model: Any, x: Any, y: Any, kind: str) -> Any:
    """MSE for the MLP, next-token cross-entropy for the transformer."""
    import jax.numpy as jnp
    import optax

    out = model(x)
    if kind == "mlp":
        return jnp.mean((out.astype(jnp.promote_types(out.dtype, jnp.float32)) - y) ** 2)
    return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()


def create_state(args: argparse.Namespace, mesh: Any) -> tuple[Any, Any, Any]:
    """Model and optimizer born sharded inside jit: (graphdef, state, state shardings)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    mlp_cls, transformer_cls = build_model_classes()
    model_cls = mlp_cls if args.model == "mlp" else transformer_cls
    dtype = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    tx = optax.adamw(args.lr) if args.optimizer == "adamw" else optax.sgd(args.lr)

    def create() -> Any:
        model = model_cls(args, dtype, nnx.Rngs(args.seed))
        return nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))

    graphdef, abstract = nnx.eval_shape(create)
    specs = nnx.get_partition_spec(abstract)
    shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, PartitionSpec)
    )
    state = jax.jit(lambda: create()[1], out_shardings=shardings)()
    return graphdef, state, shardings


def make_train_step(
    graphdef: Any, state_shardings: Any, batch_sharding: Any, kind: str
) -> Callable[[Any, Any, Any], tuple[Any, Any]]:
    """The jitted step: (state, x, y) → (loss, new state); state buffers are donated."""
    import jax
    from flax import nnx

    def step(state: Any, x: Any, y: Any) -> tuple[Any, Any]:
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y, kind)
        optimizer.update(model, grads)
        return loss, nnx.split((model, optimizer))[1]

    return jax.jit(
        step,
        in_shardings=(state_shardings, batch_sharding, batch_sharding),
        out_shardings=(None, state_shardings),
        donate_argnums=0,
    )


def leaves_by_name(tree: Any) -> dict[str, Any]:
    """{path: leaf} of a pytree, paths as jax.tree_util.keystr writes them."""
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def reference_grads(
    args: argparse.Namespace, params: Any, x: np.ndarray, y: np.ndarray
) -> tuple[float, Any]:
    """(loss, gradients) of the same model, unsharded, in float64 on this host's CPU.

    params: the gathered model state (numpy). Not an independent implementation: it checks the
    sharding, the collectives and the update, not the model's maths.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import Mesh

    cpu = jax.local_devices(backend="cpu")[0]
    one = Mesh(np.array([cpu]).reshape(1, 1, 1), meshing.AXES)
    mlp_cls, transformer_cls = build_model_classes()
    model_cls = mlp_cls if args.model == "mlp" else transformer_cls
    with jax.enable_x64(True), jax.default_device(cpu), jax.set_mesh(one):
        model = model_cls(args, jnp.float64, nnx.Rngs(args.seed))
        graphdef, _ = nnx.split(model)
        state = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float64), params)

        def grads(state: Any, x: Any, y: Any) -> Any:
            return nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, state), x, y, args.model)

        y_ref = jnp.asarray(y, dtype=jnp.float64) if args.model == "mlp" else jnp.asarray(y)
        loss, g = jax.jit(grads)(state, jnp.asarray(x), y_ref)
        return float(loss), jax.tree.map(np.asarray, g)


def tolerance(args: argparse.Namespace) -> tuple[float, str]:
    """The verify tolerance: (value, how it is derived).

    The normwise error per leaf grows about linearly with depth. Measured on CPU (d 64,
    L 1..4, several layouts): bf16 up to 0.8·eps_bf16·(L+1) for the transformer (softmax and
    layer norm in bf16), 0.3·eps_bf16·(L+1) for the MLP; float32 up to 3·eps_f32·(L+1).
    The tolerances leave a margin of >= 4x over that.
    """
    layers = args.num_layers + 1
    if args.dtype == "bf16":
        rule = f"3·eps_bf16·(L+1), eps_bf16 = 2^-7, L = {args.num_layers}"
        return 3 * verify.EPS_BF16 * layers, rule
    return 16 * verify.EPS_F32 * layers, f"16·eps_f32·(L+1), eps_f32 = 2^-23, L = {args.num_layers}"


def run_verify(args: argparse.Namespace, mesh: Any) -> tuple[verify.Verdict, float]:
    """Step 0 sharded against reference_grads: (verdict, learning rate used)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rows = args.per_device_batch * jax.device_count()
    batch_sharding = NamedSharding(mesh, P(BATCH_AXES))
    x_np, y_np = make_batch(args, 0, rows)
    _, state, _ = create_state(args, mesh)
    init = leaves_by_name(verify.host_copy(state[0]))
    ref_loss, ref_grads = reference_grads(args, verify.host_copy(state[0]), x_np, y_np)
    grads = leaves_by_name(ref_grads)
    lr = verify.update_lr(init, grads)
    sgd = argparse.Namespace(**{**vars(args), "lr": lr})
    graphdef, state, shardings = create_state(sgd, mesh)
    step = make_train_step(graphdef, shardings, batch_sharding, args.model)
    loss, new = step(state, to_global(batch_sharding, x_np), to_global(batch_sharding, y_np))
    after = leaves_by_name(verify.host_copy(new[0]))
    got: dict[str, Any] = {"loss": float(loss)}
    ref: dict[str, Any] = {"loss": ref_loss}
    for name, before in init.items():
        got[name] = after[name] - before
        ref[name] = -lr * grads[name]
    tol, rule = tolerance(args)
    return verify.compare(got, ref, tol, rule), lr


def resume(args: argparse.Namespace, state: Any) -> tuple[int, Any]:
    """(first step to run, state): from the newest checkpoint every process has, if any."""
    if not args.checkpoint_dir:
        return 0, state
    directory = Path(args.checkpoint_dir)
    found = checkpoint.agreed_step(directory)
    if found is None:
        print(f"checkpoint: none in {directory}, starting at step 0", flush=True)
        return 0, state
    print(f"checkpoint: resuming at step {found} from {directory}", flush=True)
    return found, checkpoint.restore(directory, found, state)


def train(args: argparse.Namespace, mesh: Any) -> tuple[list[float], list[float], Any, int]:
    """Run the steps; (losses, step seconds, final state, the step it started from)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rows = args.per_device_batch * jax.device_count()
    batch_sharding = NamedSharding(mesh, P(BATCH_AXES))
    graphdef, state, shardings = create_state(args, mesh)
    first, state = resume(args, state)
    step = make_train_step(graphdef, shardings, batch_sharding, args.model)
    losses, times = [], []
    for i in range(first, args.steps):
        # annotated, so that a trace (multihost trace) shows each step and its time
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            x_np, y_np = make_batch(args, i, rows)
            x, y = to_global(batch_sharding, x_np), to_global(batch_sharding, y_np)
            start = time.perf_counter()
            loss, state = step(state, x, y)
            loss = float(jax.block_until_ready(loss))
            times.append(time.perf_counter() - start)
        losses.append(loss)
        print(f"step {i}: loss {loss:.6f}, time {times[-1]:.4f} s", flush=True)
        done = i + 1
        every = args.checkpoint_every
        if args.checkpoint_dir and (done == args.steps or (every and done % every == 0)):
            path = checkpoint.save(Path(args.checkpoint_dir), done, state)
            print(f"checkpoint: step {done} saved ({path.parent})", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    return losses, times, state, first


def main(argv: list[str] | None = None) -> None:
    """Build the mesh, train, print per-step lines and the MULTIHOST_RESULT line."""
    args = parse_args(argv)
    meshing.init_distributed()  # before any other JAX call

    import jax

    mesh, plan = meshing.mesh_from_args(args)
    n_dev = jax.device_count()
    print(f"Devices: {n_dev} in {jax.process_count()} processes", flush=True)
    print(f"Decided on mesh shape: {plan.shape} (dcn {plan.dcn}, ici {plan.ici})", flush=True)
    state_b, acts_b = memory_bytes(args, plan.shape["fsdp"] * plan.shape["tensor"])
    print(
        f"estimated per device: {(state_b + acts_b) / 1e9:.3f} GB (parameters, gradients and "
        f"optimizer state {state_b / 1e9:.3f} GB, activations {acts_b / 1e9:.3f} GB)",
        flush=True,
    )
    memory.check(state_b + acts_b, None, args.memory_limit_gb, "a smaller model or batch")
    if args.verify:
        with jax.set_mesh(mesh):
            verdict, lr = run_verify(args, mesh)
        print(verdict.line(), flush=True)
        fields = meshing.result_fields("train", mesh, None)
        fields.update(model=args.model, dtype=args.dtype, verify_lr=lr, **verdict.fields())
        meshing.print_result(fields)
        if not verdict.ok:
            meshing.fail("verify failed", code=1)
        return
    with jax.set_mesh(mesh):
        losses, times, state, first = train(args, mesh)
        finger = verify.fingerprint(state[0])
    if not times:  # resumed from the checkpoint of the last step: nothing left to run
        fields = meshing.result_fields("train", mesh, None)
        fields.update(model=args.model, losses=[], first_step=first, fingerprint=finger)
        meshing.print_result(fields)
        return
    warmup = min(args.warmup, len(times) - 1)  # a resumed run may have few steps left
    stats = meshing.timing_stats(times[warmup:])
    mean = stats["mean_s"]
    tflop = step_flop(args, n_dev) / n_dev / 1e12
    tflop_full = step_flop(args, n_dev, causal=False) / n_dev / 1e12
    print(f"time is {mean} seconds, TFLOP is {tflop}, TFLOP/s is {tflop / mean}")
    print(
        f"  (time: {meshing.mean_of(len(times) - warmup, warmup)}, median "
        f"{stats['median_s']:.6g} s, min {stats['min_s']:.6g} s, max {stats['max_s']:.6g} s; "
        f"TFLOP as MaxText counts it, causal attention at half; full-mask hardware count "
        f"{tflop_full:.6g} TFLOP, {tflop_full / mean:.6g} TFLOP/s)",
        flush=True,
    )
    fields = meshing.result_fields("train", mesh, tflop / mean)
    fields.update(
        model=args.model,
        optimizer=args.optimizer,
        dtype=args.dtype,
        matmul_params=matmul_params(args),
        tokens_per_step=tokens_per_step(args, n_dev),
        losses=losses,
        step_times_s=times,
        step_time_s=mean,
        timed_steps=len(times) - warmup,  # step_time_s is the mean of the last ones
        warmup_steps=warmup,
        step_time_median_s=stats["median_s"],
        step_time_min_s=stats["min_s"],
        step_time_max_s=stats["max_s"],
        tflop_per_device=tflop,
        tflops_per_device=tflop / mean,
        tflop_per_device_full_mask=tflop_full,
        tflops_per_device_full_mask=tflop_full / mean,
        first_step=first,
        fingerprint=finger,
        checksum=finger,  # old name of the fingerprint, kept for existing readers
    )
    meshing.print_result(fields)


if __name__ == "__main__":
    main()
