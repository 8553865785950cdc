"""One locked environment on every host vs what people do today.

Same local index (tests/pyindex.py on 127.0.0.1: 12 small wheels and one of 20 MiB), same
fleet, one after the other, for each host count:

- ``multihost cold (auto)``: ``multihost run`` with the default staging on hosts without the
  environment (one host builds it with uv; ``auto`` picks how the pack reaches the others);
- ``multihost cold, --stage-via peer``: the same, the builder serving the pack to the others;
- ``multihost warm`` and ``--no-sync``: the same command on hosts that have the environment,
  alternating with a ``--no-sync`` run of it (the hosts' own Python), so that what the warm
  environment phase adds is measured in the same rounds;
- ``uv sync (every host)``: every host runs ``uv sync --frozen`` at once, each with an empty
  uv cache (uv pre-placed on every host, not timed);
- ``pip -r (every host)``: every host runs ``pip install -r requirements.txt`` at once into
  its own fresh directory (``--target``, no cache).

Recorded: wall time of the whole ``multihost run`` (median of the rounds, and the range),
requests to the index (simple pages and files, the last round), bytes the runner sent for the
environment, the load average before and after each host count. Each host count's rows are
kept in ``--rows`` (a JSON file), so that the grid can be run one host count at a time, each
under /tmp/mh-ssh.lock: ``python benchmarks/envsync.py --hosts 8``, ``... --hosts 64``, then
``python benchmarks/envsync.py --write`` (no ``--hosts``: the table from the kept rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import multihost
from benchmarks.results import markers, write_section
from multihost.envsync.uvbin import uv_binary
from multihost.events import Note
from tests import fleet as loopback
from tests.pyindex import Index

SMALL = 12
ROWS = Path(tempfile.gettempdir()) / "multihost-envsync-rows.json"
# The command of every multihost row: it runs with the environment and without (--no-sync).
COMMAND = "python3 -c pass"
CHECK = "python3 -c 'import big, small0'"  # once after each cold run: the environment works


@dataclass(frozen=True)
class Row:
    """One method at one host count."""

    hosts: int
    method: str
    walls: tuple[float, ...]
    pages: int
    files: int
    sent: str
    via: str = ""
    load: tuple[float, float] = (0.0, 0.0)  # 1-min load average before and after the count

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)


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
    subprocess.run([uv_binary() or "uv", "lock", "-q"], cwd=root, env=env, check=True, timeout=120)
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
        cmd,
        hosts=hosts,
        ssh_config=fleet.ssh_config,
        script_dir=proj,
        log_dir=logs,
        stream="none",
        on_event=lambda e: notes.append(e.text) if isinstance(e, Note) else None,
        **kw,
    )
    wall = time.monotonic() - t
    if not res.ok:
        raise SystemExit(f"{cmd[:40]}: failed: {[h.error for h in res.hosts if h.error][:2]}")
    said = next((x for x in notes if x.startswith("environment from uv.lock")), "")
    return wall, said


def _part(said: str, prefix: str) -> str:
    for part in said.split("; "):
        if prefix in part:
            return part.split(prefix, 1)[1]
    return ""


def _sent(said: str) -> str:
    return _part(said, "the runner sent ") or "0"


def _via(said: str, asked: str) -> str:
    """How the pack went: what auto chose (the note says it), else what was asked."""
    chose = _part(said, " via ")
    return chose.split(" (", 1)[0] if chose else asked


def bench(n: int, rounds: int, warm_rounds: int, work: Path) -> list[Row]:
    fleet = loopback.load()
    if len(fleet.hosts) < n:
        raise SystemExit(f"the fleet has {len(fleet.hosts)} hosts: fleet.py up {n} first")
    idx = _index(work / "index")
    load0 = os.getloadavg()[0]
    out: list[tuple[str, list[float], int, int, str, str]] = []
    with idx.serving():
        proj = _project(work / "proj", idx)
        logs = work / "logs"

        def requests() -> tuple[int, int]:
            pages = sum(c for p, c in idx.hits.items() if p.startswith("/simple/"))
            return pages, idx.downloads()

        def cold(asked: str, **kw: object) -> None:
            walls, sent, via = [], "", ""
            for _ in range(rounds):
                _clear(fleet, n, "envs", "uv-cache", "bin")
                idx.hits.clear()
                wall, said = _run(fleet, n, proj, COMMAND, logs, **kw)
                walls.append(wall)
                sent, via = _sent(said), _via(said, asked)
                pages, files = requests()
                _run(fleet, n, proj, CHECK, logs)  # the environment works everywhere
            out.append((f"multihost cold ({asked})", walls, pages, files, sent, via))

        cold("auto")
        cold("peer", stage_via="peer")
        warm: list[float] = []
        bare: list[float] = []
        idx.hits.clear()
        said = ""
        for _ in range(warm_rounds):  # alternating, so that both see the same load
            wall, said = _run(fleet, n, proj, COMMAND, logs)
            warm.append(wall)
            bare.append(_run(fleet, n, proj, COMMAND, logs, no_sync=True)[0])
        pages, files = requests()
        out.append(("multihost warm", warm, pages, files, _sent(said), ""))
        out.append(("multihost --no-sync", bare, 0, 0, "0", ""))

        def every_host(method: str, prepare: Callable[[], None], cmd: str) -> None:
            walls = []
            for _ in range(rounds):
                prepare()
                idx.hits.clear()
                walls.append(_run(fleet, n, proj, cmd, logs, no_sync=True)[0])
            pages, files = requests()
            out.append((method, walls, pages, files, "0", ""))

        def fresh_uv() -> None:
            _clear(fleet, n, "envs", "uv-cache", "bench-venv")
            _place_uv(fleet, n)

        every_host(
            "uv sync --frozen (every host)",
            fresh_uv,
            "UV_CACHE_DIR=$HOME/.multihost/uv-cache UV_PYTHON_DOWNLOADS=never "
            "UV_PROJECT_ENVIRONMENT=$HOME/bench-venv UV_LINK_MODE=copy "
            "$HOME/.multihost/bin/uv sync -q --frozen --no-install-project",
        )
        pip = (
            "python3 -m pip install -q --no-cache-dir --disable-pip-version-check "
            f"--index-url {idx.url} --target $HOME/bench-pip -r requirements.txt"
        )
        every_host("pip install -r (every host)", lambda: _clear(fleet, n, "bench-pip"), pip)
        _clear(fleet, n, "bench-pip", "bench-venv", "envs", "uv-cache", "bin")  # as it found them
    load = (load0, os.getloadavg()[0])
    return [Row(n, m, tuple(w), p, f, s, v, load) for m, w, p, f, s, v in out]


def _kept(path: Path) -> list[Row]:
    if not path.exists():
        return []
    rows = []
    for r in json.loads(path.read_text()):
        r["walls"], r["load"] = tuple(r["walls"]), tuple(r["load"])
        rows.append(Row(**r))
    return rows


def _ratio(rows: list[Row], n: int, a: str, b: str) -> float | None:
    got = {r.method: r.wall for r in rows if r.hosts == n}
    return got[a] / got[b] if a in got and b in got else None


def _paired(rows: list[Row], n: int) -> float | None:
    """Median over rounds of (warm - no-sync), each pair run back to back."""
    got = {r.method: r.walls for r in rows if r.hosts == n}
    if "multihost warm" not in got:
        return None
    pairs = zip(got["multihost warm"], got["multihost --no-sync"], strict=True)
    return statistics.median(w - b for w, b in pairs)


def table(rows: list[Row], notes: str) -> str:
    counts = sorted({r.hosts for r in rows})
    lines = []
    for r in sorted(rows, key=lambda r: r.hosts):
        spread = f"{min(r.walls):.2f}–{max(r.walls):.2f}"
        lines.append(
            f"| {r.hosts} | {r.method} | {r.wall:.2f} | {spread} | {len(r.walls)} | "
            f"{r.pages} | {r.files} | {r.sent} | {r.via} |"
        )
    derived = []
    for n in counts:
        cold = _ratio(rows, n, "multihost cold (auto)", "pip install -r (every host)")
        peer = _ratio(rows, n, "multihost cold (peer)", "pip install -r (every host)")
        uv = _ratio(rows, n, "multihost cold (auto)", "uv sync --frozen (every host)")
        add = _paired(rows, n)
        load = next(r.load for r in rows if r.hosts == n)
        parts = [f"{n} hosts: load {load[0]:.1f} → {load[1]:.1f}"]
        if cold is not None and peer is not None:
            parts.append(f"cold/pip {cold:.2f}× (auto), {peer:.2f}× (peer)")
        if uv is not None:
            parts.append(f"cold/every-host uv {uv:.2f}×")
        if add is not None:
            parts.append(f"warm − no-sync {add:+.2f} s (median of paired rounds)")
        derived.append("- " + "; ".join(parts))
    begin, end = markers("envsync")
    return "\n".join(
        [
            begin,
            "## One environment on every host: `benchmarks/envsync.py`",
            "",
            "13 wheels (12 small, one of 20 MiB) on a local index (127.0.0.1); the real sshd "
            "fleet on loopback (2 cores, shared by every host and by other work). Wall: the whole "
            f"`multihost run` of `{COMMAND}`, median and range of the rounds. Index pages/files: "
            "requests in one run (the last round; every cold round starts with no environment, no "
            "uv cache and no uv on any host). Warm and `--no-sync` rounds alternate, back to back. "
            "Each host count is its own command under the fleet's lock (8: 1.5 min, 32: 4, "
            "64: 6.5).",
            "",
            notes,
            "",
            *derived,
            "",
            "| hosts | method | wall s (median) | range s | rounds | index pages | index files "
            "| runner sent (env) | pack via |",
            "|---|---|---|---|---|---|---|---|---|",
            *lines,
            end,
        ]
    )


NOTES = (
    "Read: the grid of 2026-11-27, 03:07–03:20 UTC (8, 32, 64 hosts one after another, "
    "nothing else running; the load below is mostly the benchmark's own processes), with the "
    "code of that time (aea261f). **All three targets met on this machine.** **One index "
    "request per file** — 13 file requests per cold run at 8, 32 and 64 hosts, auto or peer, "
    "no simple page (uv takes the URLs from the lock); every host running uv sync: 13 per host "
    "(839 instead of 832 at 64: uv retried downloads under the load), pip: 13 pages and 13 "
    "files per host. **Cold at 32 hosts in at most half the time of every-host pip** — 0.37× "
    "(auto), 0.39× (peer); 0.40×/0.34× in the grid of 02:06 UTC; 0.35–0.38× in two runs of the "
    "32-host row alone (load 8–16), against 0.47× and 0.53× for the code before the cut that "
    "did it: the pack is zstd (`tar -I 'zstd -q -T0 -3'`) when the host that packs it and every "
    "host that takes it have zstd (gzip otherwise, and always through a bucket). Per step "
    "(/usr/bin/time) on this benchmark's pack (20 MiB of random bytes and small files): packing "
    "0.54 s of CPU with gzip, 0.07 s with zstd; unpacking 0.12 s vs 0.04 s per host, about the "
    "same size; on a compressible tree (1.4 GB of site-packages) 41.7 s vs 6.2 s to pack, "
    "10.0 s vs 3.6 s to unpack, 392 vs 360 MB. **A warm run adds at most 0.2 s at 64 hosts** "
    "— +0.17 s (median of 7 back-to-back warm/--no-sync pairs; the same in the grid of 02:06 "
    "UTC), +0.09 s at 32, +0.04 s at 8; the margin at 64 hosts is small on 2 shared cores. "
    "Runs of the 64-host warm rows alone (7 pairs each, load up to 45 at their end): the code "
    "before the cuts +0.49 s (last session's grid: +0.57 s); the check in plain sh on a channel "
    "of its own +0.31 s; on the staging's channel +0.16 s (and +0.19, +0.20 s); one find for "
    "the fingerprint and the manifest +0.16, +0.19 s; no subshells +0.14, +0.12 s. The cuts: "
    "the check starts no Python on a host whose python3, uv and C library are the files they "
    "were at its last full check (the key is kept; one flock, one find, one awk: 4.4 ms of CPU "
    "per host against 12–13 ms for env_probe.py, measured by running the template 50 times); "
    "it runs on the channel that stages the code (or claims the run's directory) instead of a "
    "channel and a phase of its own. The floor, the check replaced by reading its cache: "
    "+0.02 s at 64 hosts — what is left is 64 × (flock 0.9 ms + find and awk 2.5 ms) on 2 "
    "cores. Auto: 8 hosts × 20 MiB is under the 256 MiB threshold, so the runner carried the "
    "pack (176.7 MiB: 7 × 20 MiB and uv to the builder); at 32 and 64 auto chose peer and the "
    "runner sent only uv (36.6 MiB). At 8 hosts the cold run is 0.92× every-host pip and, in "
    "this grid, 1.40× every-host uv sync (0.53× at 02:06: the 8-host uv rows vary 1.9–5.1 s). "
    "Noise: see the ranges (every-host uv sync at 32 hosts: 16.5–33.8 s)."
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="*", default=[], help="host counts to run")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of each cold/every-host row")
    ap.add_argument("--warm-repeat", type=int, default=7, help="warm/--no-sync pairs")
    ap.add_argument("--rows", type=Path, default=ROWS, help="where each count's rows are kept")
    ap.add_argument("--write", action="store_true", help="write the table into RESULTS.md")
    args = ap.parse_args()
    rows = _kept(args.rows)
    for n in args.hosts:
        with tempfile.TemporaryDirectory() as d:
            new = bench(n, args.repeat, args.warm_repeat, Path(d))
        rows = [r for r in rows if r.hosts != n] + new
        args.rows.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        for r in new:
            print(
                f"{n} {r.method}: {r.wall:.2f} s {r.walls} pages {r.pages} files {r.files} "
                f"sent {r.sent} {r.via} load {r.load}",
                flush=True,
            )
    block = table(rows, NOTES)
    if args.write:
        write_section("envsync", block)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
