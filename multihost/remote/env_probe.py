"""What a host has for a locked environment (stdlib only; run with the host's ``python3 -c``).

``python3 -c SOURCE ENVS LOCK RUNNER_UV UV [RUN]``: ENVS is the envs dir (``<base>/envs``), LOCK
the hash of the lock and the selection, RUNNER_UV the uv version a host without one gets, UV the
host's uv (a path, or empty), RUN the run's claimed directory. Prints one line of ``name=value``
words: ``key`` (this host's environment key), ``state`` (``present``; ``absent``; ``damaged``:
a marker without a matching manifest, or a half-finished unpack), ``python`` (version),
``exe`` (the interpreter), ``envs`` (the envs dir, absolute), ``uv`` (``host`` or ``none``),
``os`` and ``libc`` (with ``machine``: what a uv binary must fit), ``zstd`` (``yes`` when
an executable ``zstd`` is on PATH: the pack it takes or hands on may then be zstd). Under a
shared lock of ``ENVS/.lock`` (``env_store.py`` prunes under the exclusive one) it writes the
key to ``RUN/envkey``, so the run uses that environment from now on, and stamps its last use
(``ENVS/KEY.used``) when it is there.

Every host runs it before every run's gate, so it imports only what it needs (``json``,
``platform`` and ``subprocess`` only where the common case cannot do without them: about half
the CPU of importing them all, 11 ms instead of 25 ms here; benchmarks/envsync.py measures it).
"""

from __future__ import annotations

import os
import sys

MARKER = ".multihost-complete"
MANIFEST = ".multihost-manifest"


def uv_version(uv: str) -> str:
    if not uv:
        return ""
    import subprocess

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


def python_version() -> str:
    """``platform.python_version()`` (the first word of ``sys.version``), without importing
    platform where that word is plain."""
    word = sys.version.split(" ", 1)[0]
    if word.count(".") == 2 and all(c.isalnum() or c in "._+" for c in word):
        return word
    import platform

    return platform.python_version()


def libc_version() -> str:
    """``"-".join(platform.libc_ver())``: what platform asks first (the C library itself),
    without importing platform where it answers."""
    try:
        parts = (os.confstr("CS_GNU_LIBC_VERSION") or "").split(maxsplit=1)
    except (AttributeError, ValueError, OSError):
        parts = []
    if len(parts) == 2:
        return "-".join(parts)
    import platform

    return "-".join(platform.libc_ver()) or "unknown"


def dumps(facts: dict[str, str | list[str]]) -> str:
    """``json.dumps(facts, sort_keys=True)`` (the key's input), json imported only when a
    string needs escaping."""
    out = []
    for name in sorted(facts):
        value = facts[name]
        strings = value if isinstance(value, list) else [value]
        if not all(_plain(s) for s in (name, *strings)):
            import json

            return json.dumps(facts, sort_keys=True)
        text = ", ".join(f'"{s}"' for s in strings)
        out.append(f'"{name}": ' + (f"[{text}]" if isinstance(value, list) else text))
    return "{" + ", ".join(out) + "}"


def _plain(s: str) -> bool:
    return s.isascii() and s.isprintable() and '"' not in s and "\\" not in s


def on_path(name: str) -> bool:
    """Whether an executable ``name`` is on PATH (``shutil.which``, without importing it)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return True
    return False


def take(envs: str, key: str, run: str) -> str:
    """The environment's state; under the shared lock, ``run`` (when given) records that it
    uses ``key``, and a present or damaged environment's last use is now."""
    import fcntl

    os.makedirs(envs, exist_ok=True)
    fd = os.open(os.path.join(envs, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if run and os.path.isdir(os.path.expanduser(run)):
            with open(os.path.join(os.path.expanduser(run), "envkey"), "w") as f:
                f.write(key + "\n")
        found = state(os.path.join(envs, key))
        if found != "absent":
            used = os.path.join(envs, key + ".used")
            with open(used, "a"):
                pass
            os.utime(used)
        return found
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    from hashlib import sha256

    envs, lock, runner_uv, uv = argv[1], argv[2], argv[3], argv[4]
    envs = os.path.abspath(os.path.expanduser(envs))
    version = uv_version(uv)
    libc = libc_version()
    exe = os.path.realpath(sys.executable)
    facts: dict[str, str | list[str]] = {
        "lock": lock,
        "python": [sys.implementation.name, python_version(), exe],
        "platform": [sys.platform, os.uname().machine, libc],
        "uv": version or runner_uv,
    }
    key = sha256(dumps(facts).encode()).hexdigest()[:32]
    found = take(envs, key, argv[5] if len(argv) > 5 else "")
    words = {
        "key": key,
        "state": found,
        "python": python_version(),
        "impl": sys.implementation.name,
        "exe": exe,
        "machine": os.uname().machine,
        "envs": envs,
        "uv": "host" if version else "none",
        "os": sys.platform,
        "libc": libc,
        "zstd": "yes" if on_path("zstd") else "no",
    }
    said = " ".join(f"{k}={v}" for k, v in words.items() if k != "state")
    remember(envs, lock, runner_uv, uv, said)
    print(said.replace(" ", f" state={found} ", 1))
    return 0


def libc_path() -> str:
    """The C library this Python runs on, as the kernel mapped it ("" when none is seen)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                name = path.rpartition("/")[2]
                if path and (name.startswith("libc.so") or name.startswith("libc-")):
                    return "/" + path
    except OSError:
        pass
    return ""


def fingerprint(runner_uv: str, files: list[str]) -> str:
    """What the PROBE template's warm path compares: ``RUNNER_UV|`` then, per file, what its
    ``find -H … -printf '%D.%i.%s.%Ts '`` says (device, inode, size, mtime: the very file)."""
    out = [runner_uv + "|"]
    for path in files:
        st = os.stat(path)
        out.append(f"{st.st_dev}.{st.st_ino}.{st.st_size}.{st.st_mtime_ns // 1_000_000_000} ")
    return "".join(out)


def remember(envs: str, lock: str, runner_uv: str, uv: str, said: str) -> None:
    """``ENVS/.probe-LOCK`` for the template's warm path: the C library's path, the
    fingerprint, this host's words (all but ``state``); nothing when the C library is not
    seen or a file cannot be read (the warm path is then never taken: this probe runs)."""
    libc = libc_path()
    if not libc or not lock.isalnum():
        return
    path = os.path.join(envs, ".probe-" + lock)
    try:
        files = [sys.executable, *([uv] if uv else []), libc]
        text = f"{libc}\n{fingerprint(runner_uv, files)}\n{said}\n"
    except OSError:
        return
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        try:  # noqa: SIM105 (contextlib: one import more before every run)
            os.unlink(tmp)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
