"""Shared payload plumbing: distributed start, mesh flags and builder, peak table, result line.

Imported by shardings.py and train.py (payloads/ is sys.path[0] when they run as scripts).
Nothing here touches a JAX backend at import time: `init_distributed` must come first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

AXES = ("data", "fsdp", "tensor")
SHORT = {"data": "d", "fsdp": "f", "tensor": "t"}
RESULT_PREFIX = "MULTIHOST_RESULT "
FAIL_BARRIER_S = 5.0  # how long a failing process waits for its peers to fail too

# Env vars that mean "a cluster JAX can detect by itself" (TPU VM pod, Slurm, Open MPI).
_AUTO_DETECT_MULTI = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "MEGASCALE_NUM_SLICES")

# Peak dense (no sparsity) bf16 TFLOP/s per JAX device; first substring match of device_kind
# wins, so the more specific names come first. Sources: Google Cloud TPU system architecture
# pages (per chip; v2/v3 expose two devices, one per core, per chip), NVIDIA datasheets
# (their "with sparsity" figures halved).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v6 lite", 918.0),  # v6e (Trillium), one device per chip
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5", 459.0),  # v5p reports "TPU v5"
    ("TPU v4", 275.0),  # one device per chip (megacore)
    ("TPU v3", 61.5),  # 123 per chip, two devices (cores) per chip
    ("TPU v2", 22.5),  # 45 per chip, two devices per chip
    ("H100 NVL", 835.0),  # H100 NVL datasheet: 1,671 with sparsity
    ("H100 PCIe", 756.0),  # H100 PCIe datasheet: 1,513 with sparsity
    ("H100", 989.0),  # H100 SXM datasheet: 1,979 with sparsity
    ("H200 NVL", 835.0),  # H200 NVL datasheet: 1,671 with sparsity
    ("H200", 989.0),  # H200 SXM datasheet: 1,979 with sparsity
    ("A100", 312.0),  # A100 datasheet: 624 with sparsity
    ("B200", 2250.0),  # HGX B200: 36 PFLOPS with sparsity over 8 GPUs
)


class MeshError(ValueError):
    """The requested parallelism does not fit the devices present."""


def _wait_for_peers(timeout_s: float) -> None:
    """Best effort: wait until every process reached fail(), so none dies mid-handshake."""
    if "jax" not in sys.modules:
        return
    try:
        from jax._src import distributed  # the public API has no barrier without devices

        client = distributed.global_state.client
        if client is None:
            return
        client.wait_at_barrier("multihost_payload_fail", int(timeout_s * 1000))
        if distributed.global_state.process_id == 0:
            time.sleep(0.3)  # the coordinator lives in process 0: let peers leave first
    except Exception:  # a peer that never fails, or an older jax: exit anyway
        return


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error on stderr and leave at once, without a traceback or a hang."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    if os.environ.get("MULTIHOST_WARM"):  # a warm process outlives its point: it stays
        raise SystemExit(code)
    _wait_for_peers(FAIL_BARRIER_S)
    # os._exit: a normal exit would wait in jax.distributed's shutdown barrier for peers.
    os._exit(code)


def _env_int(name: str, default: int) -> int:
    """An integer environment variable, failing with a clear message when malformed."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        fail(f"{name}={raw!r} is not an integer")


def _auto_cluster() -> bool:
    """True when env says JAX's own cluster detection will find several processes."""
    if "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
        return True
    if os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return True
    return any(_env_int(name, 1) > 1 for name in _AUTO_DETECT_MULTI)


def init_distributed() -> None:
    """Start jax.distributed from the runner's env, or let JAX detect a cluster; else no-op."""
    import jax

    count = _env_int("JAX_PROCESS_COUNT", 1)
    if count > 1:
        address = os.environ.get("JAX_COORDINATOR_ADDRESS", "")
        if not address or "JAX_PROCESS_ID" not in os.environ:
            fail("JAX_PROCESS_COUNT > 1 needs JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID")
        process_id = _env_int("JAX_PROCESS_ID", 0)
        if not 0 <= process_id < count:
            fail(f"JAX_PROCESS_ID={process_id} is outside 0..{count - 1}")
        jax.distributed.initialize(
            coordinator_address=address, num_processes=count, process_id=process_id
        )
    elif _auto_cluster():
        jax.distributed.initialize()


def add_mesh_flags(parser: argparse.ArgumentParser, ici_fsdp_default: int = 4) -> None:
    """Add MaxText's --{dcn,ici}_{data,fsdp,tensor}_parallelism flags (-1 = fill the rest)."""
    for net, letter in (("dcn", "d"), ("ici", "i")):
        for axis in AXES:
            default = ici_fsdp_default if (net, axis) == ("ici", "fsdp") else 1
            parser.add_argument(
                f"--{net}_{axis}_parallelism",
                f"-{letter}{SHORT[axis]}",
                type=int,
                default=default,
                help=f"{axis} parallelism over {net.upper()} (default {default}; -1 fills)",
            )


@dataclass(frozen=True)
class MeshPlan:
    """Resolved per-axis sizes and how devices are grouped into DCN granules."""

    dcn: tuple[int, int, int]
    ici: tuple[int, int, int]
    granule: str  # "none" | "slice" | "process" | "process_group"

    @property
    def shape(self) -> dict[str, int]:
        """Mesh axis sizes: dcn × ici per axis."""
        return {a: d * i for a, d, i in zip(AXES, self.dcn, self.ici, strict=True)}


def _fmt(sizes: Sequence[int]) -> str:
    """Format axis sizes as data=.., fsdp=.., tensor=.."""
    return ", ".join(f"{a}={s}" for a, s in zip(AXES, sizes, strict=True))


def _fill(sizes: Sequence[int], total: int, net: str) -> tuple[int, int, int]:
    """Replace at most one -1 in sizes so that their product is total."""
    if any(s == 0 or s < -1 for s in sizes):
        raise MeshError(f"{net} parallelism ({_fmt(sizes)}) must be positive or -1")
    if list(sizes).count(-1) > 1:
        raise MeshError(f"{net} parallelism ({_fmt(sizes)}): at most one axis may be -1")
    if -1 not in sizes:
        return (sizes[0], sizes[1], sizes[2])
    known = math.prod(s for s in sizes if s != -1)
    if total % known:
        raise MeshError(
            f"{net} parallelism ({_fmt(sizes)}): "
            f"cannot fill -1, {total} is not divisible by {known}"
        )
    filled = [total // known if s == -1 else s for s in sizes]
    return (filled[0], filled[1], filled[2])


def plan_mesh(
    dcn: Sequence[int], ici: Sequence[int], num_devices: int, num_processes: int, num_slices: int
) -> MeshPlan:
    """Check and resolve the requested parallelism against the device/process/slice counts."""
    multislice = num_slices > 1
    units = num_slices if multislice else num_processes
    unit_name = "slices" if multislice else "processes"
    dcn_r = _fill(dcn, units, "dcn")
    n_dcn = math.prod(dcn_r)
    where = (
        f"{num_devices} devices in {num_processes} processes and {num_slices} slice(s); "
        f"dcn ({_fmt(dcn_r)}), ici ({_fmt(ici)})"
    )
    if multislice and n_dcn != num_slices:
        raise MeshError(
            f"dcn product {n_dcn} must equal the number of slices {num_slices}: {where}"
        )
    if not multislice and num_processes % n_dcn:
        raise MeshError(
            f"dcn product {n_dcn} must divide the number of {unit_name} {units} "
            f"(no multislice: DCN groups are groups of processes): {where}"
        )
    if num_devices % n_dcn:
        raise MeshError(f"dcn product {n_dcn} does not divide the device count: {where}")
    ici_r = _fill(ici, num_devices // n_dcn, "ici")
    if n_dcn * math.prod(ici_r) != num_devices:
        raise MeshError(
            f"dcn product {n_dcn} × ici product {math.prod(ici_r)} = "
            f"{n_dcn * math.prod(ici_r)} != {num_devices} devices: {where}"
        )
    if n_dcn == 1:
        granule = "none"
    elif multislice:
        granule = "slice"
    elif n_dcn == num_processes:
        granule = "process"
    else:
        granule = "process_group"
    return MeshPlan(dcn=dcn_r, ici=ici_r, granule=granule)


def _grouped_mesh(plan: MeshPlan, devices: Sequence[Any], num_processes: int) -> np.ndarray:
    """Hybrid mesh whose DCN granules are runs of consecutive processes."""
    from jax.experimental import mesh_utils

    n_dcn = math.prod(plan.dcn)
    per_group = num_processes // n_dcn
    groups: list[list[Any]] = [[] for _ in range(n_dcn)]
    for dev in sorted(devices, key=lambda d: (d.process_index, d.id)):
        groups[dev.process_index // per_group].append(dev)
    blocks = np.empty((n_dcn, *plan.ici), dtype=object)
    for g, members in enumerate(groups):
        blocks[g] = mesh_utils.create_device_mesh(plan.ici, members)
    # (d0,d1,d2,i0,i1,i2) → (d0·i0, d1·i1, d2·i2): the same block layout as np.block.
    blocks = blocks.reshape(*plan.dcn, *plan.ici).transpose(0, 3, 1, 4, 2, 5)
    return blocks.reshape(tuple(plan.shape.values()))


def device_array(plan: MeshPlan, devices: Sequence[Any], num_processes: int) -> np.ndarray:
    """Arrange devices into the planned (data, fsdp, tensor) device array."""
    from jax.experimental import mesh_utils

    shape = tuple(plan.shape.values())
    if plan.granule == "none":
        return mesh_utils.create_device_mesh(shape, devices)
    if plan.granule == "slice":
        return mesh_utils.create_hybrid_device_mesh(plan.ici, plan.dcn, devices)
    if plan.granule == "process":
        return mesh_utils.create_hybrid_device_mesh(
            plan.ici, plan.dcn, devices, process_is_granule=True
        )
    return _grouped_mesh(plan, devices, num_processes)


def num_slices(devices: Sequence[Any]) -> int:
    """Distinct slice_index values (1 on CPU/GPU, where it is absent or always 0)."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def mesh_from_args(args: argparse.Namespace) -> tuple[Any, MeshPlan]:
    """Build an Auto-axes Mesh from parsed flags, or exit(2) naming all sizes."""
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    dcn = [getattr(args, f"dcn_{a}_parallelism") for a in AXES]
    ici = [getattr(args, f"ici_{a}_parallelism") for a in AXES]
    try:
        plan = plan_mesh(dcn, ici, len(devices), jax.process_count(), num_slices(devices))
        # Mesh(devices, names) keeps Auto axes; jax.make_mesh's Explicit axes break the model.
        mesh = Mesh(device_array(plan, devices, jax.process_count()), AXES)
    except (MeshError, ValueError, AssertionError, NotImplementedError) as err:
        fail(f"bad mesh: {err}")
    return mesh, plan


def peak_tflops(device_kind: str) -> float | None:
    """Peak dense bf16 TFLOP/s per device for a device_kind, or None when unknown."""
    for key, peak in PEAK_TFLOPS:
        if key.lower() in device_kind.lower():
            return peak
    return None


def result_fields(payload: str, mesh: Any, tflops_per_device: float | None) -> dict[str, Any]:
    """Common MULTIHOST_RESULT fields: payload, topology, peak and utilization."""
    import jax

    kind = jax.devices()[0].device_kind
    peak = peak_tflops(kind)
    util = tflops_per_device / peak if (peak and tflops_per_device is not None) else None
    return {
        "payload": payload,
        "process_index": jax.process_index(),
        "num_processes": jax.process_count(),
        "num_devices": jax.device_count(),
        "mesh": {name: int(size) for name, size in mesh.shape.items()},
        "device_kind": kind,
        "peak_tflops": peak,
        "utilization": util,
    }


def print_result(fields: dict[str, Any]) -> None:
    """Print the one machine-readable result line and flush."""
    print(RESULT_PREFIX + json.dumps(fields, sort_keys=True), flush=True)


def parse_result_lines(text: str) -> list[dict[str, Any]]:
    """All MULTIHOST_RESULT payloads found in some output text."""
    found = []
    for line in text.splitlines():
        _, sep, rest = line.partition(RESULT_PREFIX)
        if sep:
            found.append(json.loads(rest))
    return found


def timing_stats(values: Sequence[float]) -> dict[str, float]:
    """mean (MaxText's "time is"), median, min and max of a non-empty list of seconds."""
    arr = np.asarray(values, dtype=np.float64)
    return {
        "mean_s": float(arr.mean()),
        "median_s": float(np.median(arr)),
        "min_s": float(arr.min()),
        "max_s": float(arr.max()),
    }


def mean_of(timed: int, warmup: int) -> str:
    """What the step time is the mean of, in the words the run's summary uses too
    (``mean of 18 steps after 2 warm-up``): the result's ``timed_steps`` and ``warmup_steps``."""
    return f"mean of {timed} steps" + (f" after {warmup} warm-up" if warmup else "")
