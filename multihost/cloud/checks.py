"""What the Cloud TPU API accepts in a request, checked here before any call: a queued
resource's name, the accelerator type (each generation's sizes), the zone, the capacity type
and the number of slices. ``up`` (``multihost.pods``) and ``job submit`` (``multihost.job``)
both check with these, so a type one accepts the other accepts too.

The sizes come from the Cloud TPU documentation's accelerator types and, for v5p, from the
topologies XPK (Google's launcher, ``src/xpk/core/system_characteristics.py``) lists: v2 and
v3 count TensorCores (two a chip, four chips a host), v4 and v5p too (slices of 2x2x1, 2x2x2,
2x2x4, 2x4x4 chips, or blocks of 4x4x4 chips; v4's longest side is 16), v5litepod and v6e
count chips (one host up to 8 chips, then hosts of 4). The price table
(``multihost/pods/prices.csv``) is checked against this one by the tests: every priced type
is a type here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import product

from multihost.errors import UsageError

# How capacity is asked for (on-demand: no flag). ``multihost.cloud.queued`` builds the flags.
CAPACITIES = ("on-demand", "spot", "reserved", "best-effort")
# Slices of one request: far more than any multislice job has been run with; the bound stops a
# typo (a million slices) here, before it reaches the cloud.
MAX_SLICES = 1024

_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_TYPE = re.compile(r"^([a-z0-9]+)-([0-9]+)$")


def _blocks(longest: int, most: int) -> tuple[int, ...]:
    """Sizes of A x B x C chips, each side a multiple of 4 up to ``longest``, counted in cores
    (two a chip), at most ``most``."""
    sides = range(4, longest + 1, 4)
    return tuple(
        sorted(s for s in {2 * a * b * c for a, b, c in product(sides, repeat=3)} if s <= most)
    )


@dataclass(frozen=True)
class Generation:
    """One TPU generation: the sizes its accelerator types come in (``v4-16``: 16), what the
    size counts, and how many of them one host (a TPU VM worker) has."""

    name: str
    sizes: tuple[int, ...]
    counts: str  # "cores" or "chips"
    per_host: int  # cores or chips of one host
    one_host_up_to: int = 0  # sizes up to this are one host (v5litepod-8, v6e-8)

    def hosts(self, size: int) -> int:
        if size <= self.one_host_up_to:
            return 1
        return max(1, size // self.per_host)


_V4 = (8, 16, 32, 64, *_blocks(16, 4096))
_V5P_TAIL: tuple[int, ...] = (8704, 8832, 8960, 9216, 9472, 9600, 9728, 9856, 9984, 10240)
_V5P_TAIL += (10368, 10496, 10752, 10880, 11008, 11136, 11264, 11520, 11648, 11776, 11904)
_V5P_TAIL += (12032, 12160)
_V5P = (8, 16, 32, 64, *range(128, 8449, 128), *_V5P_TAIL, 12288, 13824, 17920)
_EV = (1, 4, 8, 16, 32, 64, 128, 256)  # v5litepod and v6e: chips

GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v2", (8, 32, 128, 256, 512), "cores", 8),
        Generation("v3", (8, 32, 64, 128, 256, 512, 1024, 2048), "cores", 8),
        Generation("v4", _V4, "cores", 8),
        Generation("v5p", _V5P, "cores", 8),
        Generation("v5litepod", _EV, "chips", 4, one_host_up_to=8),
        Generation("v6e", _EV, "chips", 4, one_host_up_to=8),
    )
}


def _sizes(g: Generation) -> str:
    shown = [f"{g.name}-{s}" for s in g.sizes]
    return ", ".join(shown) if len(shown) <= 8 else f"{', '.join(shown[:6])}, ... {shown[-1]}"


def check_tpu_type(tpu_type: str) -> str:
    """A Cloud TPU accelerator type that exists: a generation and one of its sizes
    (``v4-16``, ``v5litepod-16``, ``v5p-8``, ``v6e-8``); else a UsageError that says which
    sizes the generation has."""
    m = _TYPE.match(tpu_type)
    gen = GENERATIONS.get(m[1]) if m else None
    if gen is None:
        known = ", ".join(GENERATIONS)
        raise UsageError(
            f"unknown TPU type {tpu_type!r}: expected GENERATION-SIZE, e.g. v4-16, "
            f"v5litepod-16 (generations: {known})"
        )
    assert m is not None
    if int(m[2]) not in gen.sizes:
        raise UsageError(
            f"unknown TPU type {tpu_type!r}: {gen.name} slices ({gen.counts}) are {_sizes(gen)}"
        )
    return tpu_type


def workers_per_slice(tpu_type: str) -> int:
    """TPU VM workers (hosts) in one slice of a checked type."""
    check_tpu_type(tpu_type)
    generation, _, size = tpu_type.rpartition("-")
    return GENERATIONS[generation].hosts(int(size))


def check_name(name: str, what: str = "pod") -> str:
    """A queued resource's name (and its nodes' prefix), the TPU API's rule; ``what`` names it
    in the message (a pod, a job)."""
    if not _NAME.match(name):
        raise UsageError(
            f"bad {what} name {name!r}: a lowercase letter, then lowercase letters, digits or "
            "'-' (at most 40, not ending in '-')"
        )
    return name


def check_zone(zone: str) -> str:
    """A zone's shape (``us-central2-b``); whether it exists is the API's to say."""
    if not _ZONE.match(zone):
        raise UsageError(f"bad zone {zone!r}: expected e.g. us-central2-b")
    return zone


def check_capacity(capacity: str) -> str:
    if capacity not in CAPACITIES:
        raise UsageError(f"unknown capacity {capacity!r}: one of {', '.join(CAPACITIES)}")
    return capacity


def check_slices(num_slices: int) -> int:
    if not 1 <= num_slices <= MAX_SLICES:
        raise UsageError(f"the number of slices must be 1 to {MAX_SLICES}, not {num_slices}")
    return num_slices
