"""Issue 27: one locked environment on every host vs what people do today.

Same local index (tests/pyindex.py on 127.0.0.1: 12 small wheels and one of 20 MB), same
fleet, one after the other, for each host count:

- ``multihost cold``: ``multihost run`` on hosts without the environment (one host builds it
  with uv, the runner carries the pack to the others);
- ``multihost cold, --stage-via peer``: the same, the builder serving the pack to the others;
- ``multihost warm``: the same run again;
- ``uv sync (every host)``: every host runs ``uv sync --frozen`` at once, each with an empty
  uv cache (uv pre-placed on every host, not timed);
- ``pip -r (every host)``: every host runs ``pip install -r requirements.txt`` at once into
  its own fresh directory (``--target``, no cache).

Recorded: wall time of the whole ``multihost run`` (median of ``--repeat``), requests to the
index (simple pages and files), and bytes the runner sent for the environment. Run under
/tmp/mh-ssh.lock: ``python benchmarks/envsync.py --hosts 8``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import multihost
from benchmarks.results import markers, write_section
from multihost.envsync import uv_binary
from multihost.runstate import Note
from tests import fleet as loopback
from tests.pyindex import Index

SMALL = 12
NOTES = (
    "Read: one index request per file however many hosts (13 at 8 and at 32; every-host "
    "uv and pip: 13 per host). With --stage-via peer the runner sends only uv (37 MiB, to"
    " a builder without one) instead of the 20 MiB pack per host. On this loopback "
    "machine the index costs nothing and the 2 cores are shared by every host, so wall "
    "times are noisy (every-host uv sync at 32 hosts took 6.8 s in an earlier run of the "
    "same script, 13.2 s here). Cold at 32 hosts: 6.5 s vs 13.1 s for every-host pip "
    "(0.49x; 0.58x in the earlier run: the half-time target is at the edge here). Warm: "
    "nothing built, nothing sent, no index request; every host checks its manifest; what "
    "that adds over a --no-sync run was not measured separately. 64 hosts: not run.",
)


def _index(root: Path) -> Index:
    idx = Index(root)
    for i in range(SMALL):
        idx.add(f"small{i}", "1.0", {f"small{i}/__init__.py": f"N = {i}\n".encode()})
    idx.add("big", "1.0", {"big/__init__.py": b"", "big/blob.bin": os.urandom(20 << 20)})
    return idx


def _project(root: Path, idx: Index) -> Path:
    root.mkdir()
    deps = ", ".join([*(f'"small{i}"' for i in range(SMALL)), '"big"'])
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "bench"\nversion = "0.1"\nrequires-python = ">=3.9"\n'
        f"dependencies = [{deps}]\n[tool.uv]\npackage = false\n"
        f'[[tool.uv.index]]\nurl = "{idx.url}"\ndefault = true\n'
    )
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(root.parent / "uvc"))
    subprocess.run(["uv", "lock", "-q"], cwd=root, env=env, check=True, timeout=120)
    pins = [f"small{i}==1.0" for i in range(SMALL)] + ["big==1.0"]
    (root / "requirements.txt").write_text("\n".join(pins) + "\n")
    return root


def _clear(fleet: loopback.Fleet, n: int, *names: str) -> None:
    for h in fleet.hosts[:n]:
        for name in names:
            shutil.rmtree(h.home / ".multihost" / name, ignore_errors=True)
            shutil.rmtree(h.home / name, ignore_errors=True)


def _place_uv(fleet: loopback.Fleet, n: int) -> None:
    uv = uv_binary()
    assert uv is not None
    for h in fleet.hosts[:n]:
        target = h.home / ".multihost" / "bin" / "uv"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(uv, target)
        for p in (h.home / ".multihost", target.parent, target):
            shutil.chown(p, h.user, h.user)


def _run(
    fleet: loopback.Fleet, n: int, proj: Path, cmd: str, logs: Path, **kw: object
) -> tuple[float, str]:
    notes: list[str] = []
    hosts = ",".join(h.alias for h in fleet.hosts[:n])
    t = time.monotonic()
    res = multihost.run(
        cmd, hosts=hosts, ssh_config=fleet.ssh_config, script_dir=proj, log_dir=logs,
        stream="none", on_event=lambda e: notes.append(e.text) if isinstance(e, Note) else None,
        **kw,
    )  # fmt: skip
    wall = time.monotonic() - t
    if not res.ok:
        raise SystemExit(f"{cmd[:40]}: failed: {[h.error for h in res.hosts if h.error][:2]}")
    said = next((x for x in notes if x.startswith("environment from uv.lock")), "")
    return wall, said


def _sent(said: str) -> str:
    for part in said.split("; "):
        if part.startswith("the runner sent"):
            return part.removeprefix("the runner sent ")
    return "0"


def bench(n: int, repeat: int, work: Path) -> list[tuple[str, float, int, int, str]]:
    fleet = loopback.load()
    idx = _index(work / "index")
    rows: list[tuple[str, float, int, int, str]] = []
    with idx.serving():
        proj = _project(work / "proj", idx)
        logs = work / "logs"

        def requests() -> tuple[int, int]:
            pages = sum(c for p, c in idx.hits.items() if p.startswith("/simple/"))
            return pages, idx.downloads()

        walls, sent = [], ""
        for _ in range(repeat):
            _clear(fleet, n, "envs", "uv-cache", "bin")
            idx.hits.clear()
            wall, said = _run(fleet, n, proj, "python -c 'import big, small0'", logs)
            walls.append(wall)
            sent = _sent(said)
        pages, files = requests()
        rows.append(("multihost cold", statistics.median(walls), pages, files, sent))
        walls = []
        for _ in range(repeat):
            _clear(fleet, n, "envs", "uv-cache", "bin")
            idx.hits.clear()
            wall, said = _run(fleet, n, proj, "python -c 'import big, small0'", logs,
                              stage_via="peer")  # fmt: skip
            walls.append(wall)
            sent = _sent(said)
        pages, files = requests()
        rows.append(("multihost cold, --stage-via peer", statistics.median(walls), pages, files,
                     sent))  # fmt: skip
        walls = []
        idx.hits.clear()
        for _ in range(repeat):
            wall, said = _run(fleet, n, proj, "python -c 'import big, small0'", logs)
            walls.append(wall)
        pages, files = requests()
        rows.append(("multihost warm", statistics.median(walls), pages // repeat,
                     files // repeat, _sent(said)))  # fmt: skip
        walls = []
        for _ in range(repeat):
            _clear(fleet, n, "envs", "uv-cache", "bench-venv")
            _place_uv(fleet, n)
            idx.hits.clear()
            cmd = ('UV_CACHE_DIR=$HOME/.multihost/uv-cache UV_PYTHON_DOWNLOADS=never '
                   'UV_PROJECT_ENVIRONMENT=$HOME/bench-venv UV_LINK_MODE=copy '
                   '$HOME/.multihost/bin/uv sync -q --frozen --no-install-project')  # fmt: skip
            wall, _ = _run(fleet, n, proj, cmd, logs, no_sync=True)
            walls.append(wall)
        pages, files = requests()
        rows.append(("uv sync --frozen (every host)", statistics.median(walls), pages, files, "0"))
        walls = []
        for _ in range(repeat):
            _clear(fleet, n, "bench-pip")
            idx.hits.clear()
            cmd = (
                f"python3 -m pip install -q --no-cache-dir --disable-pip-version-check "
                f"--index-url {idx.url} --target $HOME/bench-pip -r requirements.txt"
            )
            wall, _ = _run(fleet, n, proj, cmd, logs, no_sync=True)
            walls.append(wall)
        pages, files = requests()
        rows.append(("pip install -r (every host)", statistics.median(walls), pages, files, "0"))
        _clear(fleet, n, "bench-pip", "bench-venv")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the table into RESULTS.md")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    lines = []
    for n in args.hosts:
        with tempfile.TemporaryDirectory() as d:
            rows = bench(n, args.repeat, Path(d))
        for name, wall, pages, files, sent in rows:
            lines.append(f"| {n} | {name} | {wall:.2f} | {pages} | {files} | {sent} |")
            print(lines[-1], flush=True)
    begin, end = markers("envsync")
    block = "\n".join([
        begin,
        "## One environment on every host (issue 27): `benchmarks/envsync.py`",
        "",
        f"13 wheels (12 small, one of 20 MiB) on a local index; median of {args.repeat} "
        f"runs each; load average {load:.1f} at the start (2 cores, shared). Requests: "
        "simple pages and files asked of the index in one run (the last repeat; every cold "
        "repeat starts with no environment and no uv cache on any host).",
        "",
        " ".join(NOTES),
        "",
        "| hosts | method | wall s | index pages | index files | runner sent (env) |",
        "|---|---|---|---|---|---|",
        *lines,
        end,
    ])  # fmt: skip
    if args.write:
        write_section("envsync", block)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
