"""Start-up stays light: a one-host run imports only what a run needs (no cloud, pod, job,
sweep or trace modules, no jax, no rich markdown or emoji table) and ``--version`` imports
neither asyncssh nor rich. Set checks on ``sys.modules`` after a real run, not timings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Imported by a plain run before these changes, and needed by none of it: each one is CPU
# time at every start (benchmarks/startup_cpu.py measures it).
NOT_FOR_A_RUN = (
    "multihost.cloud",
    "multihost.pods",
    "multihost.job",
    "multihost.sweep",
    "multihost.diagnose",
    "multihost.secrets",
    "multihost.sources.tpu",
    "multihost.fleetops.contact.keys",
    "multihost.cli.trace",
    "multihost.runs.pull",
    "jax",
    "numpy",
    "rich.markdown",
    "rich._emoji_codes",
)
NOT_FOR_VERSION = ("asyncssh", "rich", "cryptography")

# The modules loaded by the end of ``multihost ARGS``, one a line, written at exit.
_DUMP = """
import atexit, sys
def dump():
    with open(sys.argv[1], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(dump)
from multihost.cli import main
main(sys.argv[2:])
"""


def _modules(tmp_path: Path, home: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.txt"
    res = subprocess.run(
        [sys.executable, "-c", _DUMP, str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path / "code",
        env={**os.environ, "HOME": str(home), "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    return set(out.read_text().split())


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_a_local_run_imports_only_what_a_run_needs(tmp_path: Path, home: Path, code: Path) -> None:
    modules = _modules(tmp_path, home, "run", "--local", "1", "--cmd", "true")
    assert "multihost.core.run" in modules  # it did run
    assert _loaded(modules, NOT_FOR_A_RUN) == []


def test_version_imports_neither_asyncssh_nor_rich(tmp_path: Path, home: Path, code: Path) -> None:
    modules = _modules(tmp_path, home, "--version")
    assert _loaded(modules, NOT_FOR_VERSION) == []
