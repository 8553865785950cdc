"""Compare a sharded step's result with a float64 host reference, with a stated tolerance.

Errors are normwise relative errors, ‖got − ref‖₂ / ‖ref‖₂ per leaf (each update, the loss):
rounding noise of independent elements averages out in the norm, a real bug (a wrong shard, a
missing reduction, a scaled activation) does not. Floats are never compared exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

EPS_BF16 = 2.0**-7  # bf16 spacing at 1.0: 8 significant bits
EPS_F32 = 2.0**-23


@dataclass(frozen=True)
class Verdict:
    """The outcome: per-leaf errors, the worst leaf and the tolerance they were held to."""

    errors: dict[str, float]
    tolerance: float
    rule: str  # how the tolerance was derived, printed beside it

    @property
    def worst(self) -> str:
        """The leaf with the largest error."""
        return max(self.errors, key=lambda k: self.errors[k])

    @property
    def max_err(self) -> float:
        """The largest error over all leaves."""
        return self.errors[self.worst]

    @property
    def ok(self) -> bool:
        """True when every leaf is within the tolerance (NaN fails)."""
        return all(err <= self.tolerance for err in self.errors.values())

    def line(self) -> str:
        """`verify: ok (...)` or `verify: FAILED ...`, one line."""
        stats = f"max rel err {self.max_err:.3g} in {self.worst}, tolerance {self.tolerance:.3g}"
        if self.ok:
            return f"verify: ok ({stats} = {self.rule})"
        bad = sorted((k for k, e in self.errors.items() if not e <= self.tolerance), key=str)
        return (
            f"verify: FAILED: worst leaf {self.worst} rel err {self.max_err:.3g} > tolerance "
            f"{self.tolerance:.3g} ({self.rule}); {len(bad)} of {len(self.errors)} leaves "
            f"out: {', '.join(bad[:6])}{' …' if len(bad) > 6 else ''}"
        )

    def fields(self) -> dict[str, Any]:
        """For the MULTIHOST_RESULT line."""
        finite = math.isfinite(self.max_err)
        return {
            "verify_ok": self.ok,
            "verify_max_rel_err": self.max_err if finite else None,
            "verify_worst_leaf": self.worst,
            "verify_tolerance": self.tolerance,
            "verify_rule": self.rule,
        }


def rel_err(got: Any, ref: Any) -> float:
    """‖got − ref‖₂ / ‖ref‖₂ in float64; inf when ref is 0 and got is not, NaN stays NaN."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        return math.inf
    diff = float(np.linalg.norm((g - r).ravel()))
    scale = float(np.linalg.norm(r.ravel()))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def compare(got: Mapping[str, Any], ref: Mapping[str, Any], tolerance: float, rule: str) -> Verdict:
    """Every leaf of got against the same leaf of ref."""
    if set(got) != set(ref):
        raise ValueError(f"leaves differ: {sorted(set(got) ^ set(ref))}")
    return Verdict({k: rel_err(got[k], ref[k]) for k in got}, tolerance, rule)


def update_lr(weights: Mapping[str, Any], grads: Mapping[str, Any], factor: float = 4.0) -> float:
    """A power-of-two learning rate that makes every leaf's largest update >= factor × its
    largest weight, so that rounding the new weights is relative to the update, not to the
    weights, and new − initial can be compared within a few ulps of the update."""
    need = 1e-30
    for name, g in grads.items():
        top = float(np.max(np.abs(g))) if np.size(g) else 0.0
        if top > 0:
            need = max(need, factor * float(np.max(np.abs(weights[name]))) / top)
    return float(2.0 ** math.ceil(math.log2(need)))


def host_copy(tree: Any) -> Any:
    """Every (global, sharded) array of the tree as a whole float64 numpy array, on every
    process; a collective, so all processes must call it."""
    import jax
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(lambda a: np.asarray(a).astype(np.float64), gathered)


def fingerprint(tree: Any) -> float:
    """Sum of every element, in float64 on the host, over the gathered global arrays.

    A fingerprint, not a check: equal weights give an equal value whatever the layout (the
    gathered arrays are in global index order, so the summation order is fixed); it cannot
    tell a correct step from a wrong one (`--verify` does that).
    """
    import jax

    return float(sum(np.sum(leaf, dtype=np.float64) for leaf in jax.tree.leaves(host_copy(tree))))
