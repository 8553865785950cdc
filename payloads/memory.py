"""The memory guard: refuse a step that cannot fit, before it starts, in words.

Devices with their own memory (TPU, GPU) are checked one by one against what each reports.
CPU devices share their machine's RAM with every other process on that machine: ``--local
4`` puts four processes on one machine, a loopback fleet more. So on CPU the processes of the
job first tell each other which machine they are on (its boot id) and what they need; each
machine's processes together are checked against what that machine has available, and every
process reaches the same verdict (none starts a step the others refuse).
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

import meshing
import numpy as np


def device_memory_bytes(device: Any) -> int | None:
    """The device's reported memory limit in bytes, or None where it reports none (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        return None
    if not stats:
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def host_memory_bytes() -> int | None:
    """The memory this machine has for a new job: MemAvailable (free RAM plus what the kernel
    can reclaim), else its physical RAM; None where the OS says neither."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def machine_id() -> int:
    """This machine as a number below 2**23 (exact in float32): its kernel's boot id
    (containers on one kernel share its RAM), else its host name."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            text = f.read().strip()
    except OSError:
        text = socket.gethostname()
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:3], "big") >> 1


def machines(need: float, limit: float | None) -> np.ndarray:
    """Every process's (machine, bytes needed, bytes limit or -1), gathered (one row when
    alone; float32, as JAX gathers without x64: 7 digits are plenty)."""
    import jax

    mine = np.array([machine_id(), need, -1 if limit is None else limit], dtype=np.float32)
    if jax.process_count() == 1:
        return mine[None, :]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)


def verdict(rows: np.ndarray, me: int) -> tuple[int, int, float, float | None]:
    """The machine that fits worst: (its first process, its processes, bytes they need
    together, its limit or None); ``me``'s machine when nothing is over its limit."""
    worst = None
    for machine in dict.fromkeys(int(m) for m in rows[:, 0]):
        here = np.flatnonzero(rows[:, 0] == machine)
        need = float(rows[here, 1].sum())
        limits = [float(v) for v in rows[here, 2] if v >= 0]
        limit = min(limits) if limits else None
        over = need / limit if limit else 0.0
        if worst is None or over > worst[0] or (over == worst[0] and me in here):
            worst = (over, (int(here[0]), len(here), need, limit))
    assert worst is not None
    return worst[1]


RUNTIME_BYTES = 0.5e9  # a CPU JAX process before its arrays (peak RSS of a tiny step)


def check(
    per_device_bytes: float,
    cpu_per_device: float | None,
    override_gb: float | None,
    hint: str = "smaller -b/-d",
) -> None:
    """Exit(2), in words, when the estimate exceeds the memory it has to fit in (every
    process of a CPU job the same way). On CPU the need per device is ``cpu_per_device``
    when the payload knows it (else ``per_device_bytes``), plus each process's runtime."""
    import jax

    if override_gb is None:
        env = os.environ.get("MULTIHOST_MEMORY_LIMIT_GB")
        override_gb = float(env) if env else None
    local = jax.local_devices()
    device = local[0]
    if device.platform != "cpu":
        limit = override_gb * 1e9 if override_gb is not None else device_memory_bytes(device)
        if limit is not None and per_device_bytes > limit:
            meshing.fail(
                f"estimated memory per device {per_device_bytes / 1e9:.3f} GB exceeds "
                f"the limit {limit / 1e9:.3f} GB on {device.device_kind}; use {hint} "
                "or more devices"
            )
        return
    limit = override_gb * 1e9 if override_gb is not None else host_memory_bytes()
    need = (cpu_per_device or per_device_bytes) * len(local) + RUNTIME_BYTES
    rows = machines(need, limit)
    first, count, need, most = verdict(rows, jax.process_index())
    if most is None or need <= most:
        return
    where = (
        "this machine"
        if rows[first, 0] == rows[jax.process_index(), 0]
        else (f"the machine of process {first}")
    )
    what = (
        f"per process ({len(local)} CPU devices share this host's RAM)"
        if count == 1
        else f"of the {count} processes on {where} ({len(local)} CPU devices each; all share "
        "its RAM)"
    )
    meshing.fail(
        f"estimated memory {what} {need / 1e9:.3f} GB exceeds the limit "
        f"{most / 1e9:.3f} GB on {device.device_kind}; use {hint}, fewer processes "
        "per machine or more machines"
    )
