"""A host's locked environments (stdlib only; run with the host's ``python3 -c``).

``python3 -c SOURCE probe ENVS LOCK RUNNER_UV UV [RUN]``: ENVS is the envs dir
(``<base>/envs``), LOCK the hash of the lock and the selection, RUNNER_UV the uv version a host
without one gets, UV the host's uv (a path, or empty), RUN the run's claimed directory. Prints
one line of ``name=value`` words: ``key`` (this host's environment key), ``state``
(``present``; ``absent``; ``damaged``: a marker without a matching manifest, or a half-finished
unpack), ``python`` (version), ``exe`` (the interpreter), ``envs`` (the envs dir, absolute),
``uv`` (``host`` or ``none``), ``os``, ``machine`` and ``libc`` (what a uv binary must fit).
Under a shared lock of ``ENVS/.lock`` it writes the key to ``RUN/envkey`` (the run uses it
from now on) and stamps the environment's last use (``ENVS/KEY.used``).

``python3 -c SOURCE list|prune|dry BASE AGE GONE``: what the host holds under ``BASE/envs``,
and with ``prune`` (under the exclusive lock) the removal of every environment that no run
directory under ``BASE/runs`` uses (its ``envkey`` or its ``job.sh`` names it) and that was
last used more than AGE seconds ago; ``dry`` says what ``prune`` would remove, removing
nothing. GONE: run names, one a line, to count as removed already. Prints one JSON object:
``{"now": host clock, "envs": [{"key", "state" (complete, damaged, missing: an archive
without its environment, partial: a build or unpack in progress or killed), "bytes"
(the environment's files), "packed" (its archive), "used" (last use), "runs": [[name,
running]]}], "removed": [keys]}``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

MARKER = ".multihost-complete"
MANIFEST = ".multihost-manifest"
USES = re.compile(r"/envs/([0-9a-f]{32})(?![0-9a-f])")  # job.sh: export MULTIHOST_ENV=...
KEY = re.compile(r"^[0-9a-f]{32}$")
PARTIAL_AGE = 86400.0  # a temporary build or unpack dir younger than this may be in progress


def uv_version(uv: str) -> str:
    if not uv:
        return ""
    try:
        out = subprocess.run([uv, "--version"], capture_output=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    words = out.stdout.decode(errors="replace").split()
    return words[1] if len(words) > 1 else ""


def state(env: str) -> str:
    """present, absent or damaged (the manifest's files, each of its size)."""
    if not os.path.lexists(env):
        return "absent"
    try:
        with open(os.path.join(env, MANIFEST)) as f:
            lines = f.read().splitlines()
        if not os.path.exists(os.path.join(env, MARKER)):
            return "damaged"
        for line in lines:
            size, _, name = line.partition(" ")
            path = os.path.join(env, name)
            if size == "l":
                if not os.path.islink(path):
                    return "damaged"
            elif os.lstat(path).st_size != int(size):
                return "damaged"
    except (OSError, ValueError):
        return "damaged"
    return "present"


@contextlib.contextmanager
def locked(envs: str, how: int) -> Iterator[None]:
    """``ENVS/.lock``: shared while a run takes an environment, exclusive while pruning."""
    os.makedirs(envs, exist_ok=True)
    fd = os.open(os.path.join(envs, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def stamp(envs: str, key: str) -> None:
    """The environment's last use is now."""
    path = os.path.join(envs, key + ".used")
    with open(path, "a"):
        pass
    os.utime(path)


def probe(argv: list[str]) -> int:
    envs, lock, runner_uv, uv = argv[0], argv[1], argv[2], argv[3]
    run = argv[4] if len(argv) > 4 else ""
    envs = os.path.abspath(os.path.expanduser(envs))
    version = uv_version(uv)
    libc = "-".join(platform.libc_ver()) or "unknown"
    exe = os.path.realpath(sys.executable)
    facts = {
        "lock": lock,
        "python": [sys.implementation.name, platform.python_version(), exe],
        "platform": [sys.platform, platform.machine(), libc],
        "uv": version or runner_uv,
    }
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]
    with locked(envs, fcntl.LOCK_SH):
        if run and os.path.isdir(os.path.expanduser(run)):
            with open(os.path.join(os.path.expanduser(run), "envkey"), "w") as f:
                f.write(key + "\n")
        found = state(os.path.join(envs, key))
        if found != "absent":
            stamp(envs, key)
    words = {
        "key": key,
        "state": found,
        "python": platform.python_version(),
        "impl": sys.implementation.name,
        "exe": exe,
        "machine": platform.machine(),
        "envs": envs,
        "uv": "host" if version else "none",
        "os": sys.platform,
        "libc": libc,
    }
    print(" ".join(f"{k}={v}" for k, v in words.items()))
    return 0


# -- what a host holds, and pruning ------------------------------------------------------------
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


def holdings(envs: str, used_by: dict[str, list[list[object]]]) -> list[dict[str, object]]:
    """Every environment under ``envs`` (and every temporary build or unpack dir)."""
    try:
        names = sorted(os.listdir(envs))
    except OSError:
        return []
    keys = sorted({n.split(".", 1)[0] for n in names if KEY.match(n.split(".", 1)[0])})
    out: list[dict[str, object]] = []
    for key in keys:
        env = os.path.join(envs, key)
        archive = env + ".tar.gz"
        found = state(env)
        out.append({
            "key": key,
            "state": {"present": "complete", "absent": "missing"}.get(found, found),
            "bytes": tree_bytes(env) if os.path.isdir(env) else 0,
            "packed": os.path.getsize(archive) if os.path.isfile(archive) else 0,
            "used": mtime(env + ".used", os.path.join(env, MARKER), env, archive),
            "runs": sorted(used_by.get(key, [])),
        })  # fmt: skip
    for n in names:
        if n.startswith((".build.", ".incoming.")):
            path = os.path.join(envs, n)
            out.append({"key": n, "state": "partial", "bytes": tree_bytes(path), "packed": 0,
                        "used": mtime(path), "runs": []})  # fmt: skip
    return out


def remove(envs: str, key: str) -> None:
    path = os.path.join(envs, key)
    shutil.rmtree(path, ignore_errors=True)
    for suffix in (".tar.gz", ".used"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def store(mode: str, argv: list[str]) -> int:
    base = os.path.abspath(os.path.expanduser(argv[0]))
    age = float(argv[1]) if len(argv) > 1 else 0.0
    gone = {g for g in (argv[2] if len(argv) > 2 else "").splitlines() if g}
    envs, runs = os.path.join(base, "envs"), os.path.join(base, "runs")
    removed: list[str] = []
    lock = fcntl.LOCK_EX if mode == "prune" else fcntl.LOCK_SH
    with locked(envs, lock) if os.path.isdir(envs) else contextlib.nullcontext():
        now = time.time()
        held = holdings(envs, users(runs, gone))
        if mode in ("prune", "dry"):
            for h in held:
                floor = max(age, PARTIAL_AGE) if h["state"] == "partial" else age
                used = h["used"]
                if h["runs"] or (isinstance(used, float) and now - used < floor):
                    continue
                removed.append(str(h["key"]))
                if mode == "prune":
                    remove(envs, str(h["key"]))
    print(json.dumps({"now": now, "envs": held, "removed": removed}))
    return 0


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "probe":
        return probe(argv[2:])
    if mode in ("list", "prune", "dry"):
        return store(mode, argv[2:])
    print(f"env_probe: unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
