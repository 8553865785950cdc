"""What a host holds of the locked environments, and pruning the unused (stdlib only; run with
the host's ``python3 -c``).

``python3 -c SOURCE PROBE list|prune|dry BASE AGE GONE``: PROBE is ``env_probe.py``'s source
(its ``state``: one check of an environment against its manifest), BASE the staging base.
Lists what the host holds under ``BASE/envs``; ``prune`` (under the exclusive lock of
``BASE/envs/.lock``, which a run's key report takes shared) also removes every environment that
no run directory under ``BASE/runs`` uses (its ``envkey`` or its ``job.sh`` names it) and that
was last used (``KEY.used``) more than AGE seconds ago, and build or unpack dirs older than AGE
and a day; ``dry`` says what ``prune`` would remove, removing nothing. GONE: run names, one a
line, to count as removed already. Prints one JSON object: ``{"now": the host's clock, "envs":
[{"key", "state" (complete, damaged; missing: only its archive is left; partial: a build or
unpack dir), "bytes" (the environment's files), "packed" (its archive: ``KEY.tar.zst`` or
``KEY.tar.gz``), "used" (last use), "runs": [[name, running]]}], "removed": [keys]}``; a run
is running (or preparing) until its directory has an ``exit`` file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

USES = re.compile(r"/envs/([0-9a-f]{32})(?![0-9a-f])")  # job.sh: export MULTIHOST_ENV=...
KEY = re.compile(r"^[0-9a-f]{32}$")
MARKER = ".multihost-complete"
PARTIAL_AGE = 86400.0  # a build or unpack dir younger than this may be in progress


@contextlib.contextmanager
def locked(envs: str, exclusive: bool) -> Any:
    """``ENVS/.lock``: exclusive while pruning, shared while listing."""
    fd = os.open(os.path.join(envs, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def users(runs: str, gone: set[str]) -> dict[str, list[list[object]]]:
    """Per key, the run directories that use it: [name, running (no exit file yet)]."""
    found: dict[str, list[list[object]]] = {}
    for root, dirs, files in os.walk(runs):
        name = os.path.relpath(root, runs)
        if name in gone:
            dirs[:] = []
            continue
        if not {"envkey", "job.sh", "exit"} & set(files):
            continue  # not a run's directory (a sweep's holds its points)
        dirs[:] = []  # a run's own files below it are no runs
        job = read(os.path.join(root, "job.sh")) if "job.sh" in files else ""
        keys = set(USES.findall(job))
        named = read(os.path.join(root, "envkey")).strip() if "envkey" in files else ""
        if KEY.match(named):
            keys.add(named)
        for k in keys:
            found.setdefault(k, []).append([name, "exit" not in files])
    return found


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return ""


def tree_bytes(path: str) -> int:
    """The apparent size of the regular files under ``path`` (links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                if not os.path.islink(os.path.join(root, f)):
                    total += st.st_size
    return total


def mtime(*paths: str) -> float | None:
    for p in paths:
        with contextlib.suppress(OSError):
            return os.lstat(p).st_mtime
    return None


def holdings(
    envs: str, used_by: dict[str, list[list[object]]], state: Callable[[str], str]
) -> list[dict[str, object]]:
    """Every environment under ``envs`` (and every temporary build or unpack dir)."""
    try:
        names = sorted(os.listdir(envs))
    except OSError:
        return []
    keys = sorted({n.split(".", 1)[0] for n in names if KEY.match(n.split(".", 1)[0])})
    out: list[dict[str, object]] = []
    for key in keys:
        env = os.path.join(envs, key)
        archives = [a for a in (env + ".tar.zst", env + ".tar.gz") if os.path.isfile(a)]
        found = state(env)
        out.append(
            {
                "key": key,
                "state": {"present": "complete", "absent": "missing"}.get(found, found),
                "bytes": tree_bytes(env) if os.path.isdir(env) else 0,
                "packed": sum(os.path.getsize(a) for a in archives),
                "used": mtime(env + ".used", os.path.join(env, MARKER), env, *archives),
                "runs": sorted(used_by.get(key, [])),
            }
        )
    for n in names:
        if n.startswith((".build.", ".incoming.")):
            path = os.path.join(envs, n)
            out.append(
                {
                    "key": n,
                    "state": "partial",
                    "bytes": tree_bytes(path),
                    "packed": 0,
                    "used": mtime(path),
                    "runs": [],
                }
            )
    return out


def remove(envs: str, key: str) -> None:
    path = os.path.join(envs, key)
    shutil.rmtree(path, ignore_errors=True)
    for suffix in (".tar.zst", ".tar.zst.sha256", ".tar.gz", ".tar.gz.sha256", ".used"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def forget(envs: str) -> None:
    """The warm check's caches (``.probe-LOCK``: env_probe.remember) that name an environment
    no longer here."""
    for n in os.listdir(envs):
        if n.startswith(".probe-"):
            said = read(os.path.join(envs, n)).splitlines()[2:3] or ["key="]
            key = said[0].split(" ", 1)[0].removeprefix("key=")
            if not (KEY.match(key) and os.path.isdir(os.path.join(envs, key))):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(envs, n))


def main(argv: list[str]) -> int:
    probe: dict[str, Any] = {"__name__": "env_probe"}
    exec(compile(argv[1], "env_probe", "exec"), probe)  # its state(), not its main
    mode, base = argv[2], os.path.abspath(os.path.expanduser(argv[3]))
    age = float(argv[4]) if len(argv) > 4 else 0.0
    gone = {g for g in (argv[5] if len(argv) > 5 else "").splitlines() if g}
    envs, runs = os.path.join(base, "envs"), os.path.join(base, "runs")
    removed: list[str] = []
    lock = contextlib.nullcontext() if not os.path.isdir(envs) else locked(envs, mode == "prune")
    with lock:
        now = time.time()
        held = holdings(envs, users(runs, gone), probe["state"])
        if mode in ("prune", "dry"):
            for h in held:
                floor = max(age, PARTIAL_AGE) if h["state"] == "partial" else age
                used = h["used"]
                if h["runs"] or (isinstance(used, float) and now - used < floor):
                    continue
                removed.append(str(h["key"]))
                if mode == "prune":
                    remove(envs, str(h["key"]))
        if mode == "prune" and os.path.isdir(envs):
            forget(envs)
    print(json.dumps({"now": now, "envs": held, "removed": removed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
