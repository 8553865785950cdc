"""Save and restore a sharded training state, each process its own shards, atomically.

Layout: ``DIR/step-00000012.process-1.npz`` holds every distinct shard process 1 can address
(raw bytes, with a JSON manifest of leaf path, global index, dtype and shape). A file appears
under its final name only once it is complete (written to a temporary name, fsynced, renamed),
so a preemption in the middle of a save leaves the previous checkpoint as the latest. Each
process keeps its last ``KEEP`` steps; on restore the processes agree on the newest step they
all have (an all-gather), so a save that only some processes finished is skipped. Restoring
needs the same process count and mesh as the save (the same job, a later attempt).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

KEEP = 2
_FILE = re.compile(r"^step-([0-9]{8})\.process-([0-9]+)\.npz$")
Index = tuple[tuple[int, int], ...]


def _index(index: tuple[slice, ...], shape: tuple[int, ...]) -> Index:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def _file(directory: Path, step: int, process: int) -> Path:
    # One flat directory: processes running as different users need no shared subdirectory.
    return directory / f"step-{step:08d}.process-{process}.npz"


def steps_here(directory: Path, process: int) -> list[int]:
    """Steps this process has a complete file for, oldest first."""
    if not directory.is_dir():
        return []
    names = (_FILE.match(p.name) for p in directory.iterdir())
    return sorted(int(m[1]) for m in names if m and int(m[2]) == process)


def save(directory: Path, step: int, state: Any) -> Path:
    """Write this process's shards of ``state`` as the checkpoint of ``step`` (the next step to
    run); then drop this process's files older than the last ``KEEP``."""
    import jax

    process = jax.process_index()
    arrays: dict[str, np.ndarray] = {}
    manifest = []
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    for path, leaf in flat:
        seen: set[Index] = set()
        for shard in leaf.addressable_shards:
            where = _index(shard.index, leaf.shape)
            if where in seen:
                continue
            seen.add(where)
            data = np.array(shard.data, order="C")  # (ascontiguousarray makes 0-d 1-d)
            name = f"a{len(arrays)}"
            arrays[name] = np.frombuffer(data.tobytes(), dtype=np.uint8)
            manifest.append(
                {
                    "leaf": jax.tree_util.keystr(path),
                    "index": where,
                    "array": name,
                    "dtype": str(data.dtype),
                    "shape": list(data.shape),
                }
            )
    meta = {"step": step, "processes": jax.process_count(), "shards": manifest}
    final = _file(directory, step, process)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, manifest=np.array(json.dumps(meta)), **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    for old in steps_here(directory, process)[:-KEEP]:
        _file(directory, old, process).unlink()
    return final


def agreed_step(directory: Path) -> int | None:
    """The newest step every process has a complete file for (None: start from scratch)."""
    import jax
    from jax.experimental import multihost_utils

    mine = steps_here(directory, jax.process_index())[-KEEP:]
    padded = np.full(KEEP, -1, dtype=np.int64)
    padded[: len(mine)] = mine
    every = np.asarray(multihost_utils.process_allgather(padded)).reshape(-1, KEEP)
    common = set.intersection(*({int(s) for s in row if s >= 0} for row in every))
    return max(common) if common else None


def restore(directory: Path, step: int, like: Any) -> Any:
    """``like`` (a state of the same structure, shapes and shardings) filled from ``step``."""
    import jax
    import jax.numpy as jnp

    with np.load(_file(directory, step, jax.process_index())) as npz:
        meta = json.loads(str(npz["manifest"]))
        if meta["processes"] != jax.process_count():
            raise ValueError(
                f"checkpoint step {step} was saved by {meta['processes']} processes, "
                f"not {jax.process_count()}"
            )
        shards: dict[tuple[str, Index], np.ndarray] = {}
        for s in meta["shards"]:
            raw = npz[s["array"]]
            key = (s["leaf"], tuple(tuple(p) for p in s["index"]))
            shards[key] = raw.view(jnp.dtype(s["dtype"])).reshape(s["shape"])

    def fill(path: Any, leaf: Any) -> Any:
        name = jax.tree_util.keystr(path)

        def data(index: tuple[slice, ...]) -> np.ndarray:
            return shards[name, _index(index, leaf.shape)]

        return jax.make_array_from_callback(leaf.shape, leaf.sharding, data)

    return jax.tree_util.tree_map_with_path(fill, like)
