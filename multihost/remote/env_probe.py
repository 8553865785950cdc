"""What a host has for a locked environment (stdlib only; run with the host's ``python3 -c``).

``python3 -c SOURCE ENVS LOCK RUNNER_UV UV``: ENVS is the envs dir (``<base>/envs``), LOCK the
hash of the lock and the selection, RUNNER_UV the runner's uv version (the one the host gets
when it has none), UV the host's uv (a path, or empty). Prints one line of ``name=value``
words: ``key`` (this host's environment key), ``state`` (``present``; ``absent``; ``damaged``:
a marker without a matching manifest, or a half-finished unpack), ``python`` (version),
``exe`` (the interpreter), ``envs`` (the envs dir, absolute), ``uv`` (``host`` or ``none``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys

MARKER = ".multihost-complete"
MANIFEST = ".multihost-manifest"


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


def main(argv: list[str]) -> int:
    envs, lock, runner_uv, uv = argv[1], argv[2], argv[3], argv[4]
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
    words = {
        "key": key,
        "state": state(os.path.join(envs, key)),
        "python": platform.python_version(),
        "impl": sys.implementation.name,
        "exe": exe,
        "machine": platform.machine(),
        "envs": envs,
        "uv": "host" if version else "none",
    }
    print(" ".join(f"{k}={v}" for k, v in words.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
