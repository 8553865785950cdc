"""The pictures on docs/how-to/watch.md, from a real run: ``multihost top`` on a 16-host fleet
(``--local 16``, real multi-process JAX on CPU, one host sleeping before each step) as an SVG,
and ``multihost plot`` of the same run as a PNG.

Usage: ``python scripts/top_screenshot.py [--hosts 16] [--slow 5]``; writes
docs/img/top-16.svg and docs/img/steps-16.png. Takes a minute or two (16 JAX processes start
on this machine's cores).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import multihost  # noqa: E402
from multihost.cli.live import screen  # noqa: E402
from tests.helpers import free_port, wait_for  # noqa: E402
from tests.test_top_jax import SLOWHOST  # noqa: E402

IMG = ROOT / "docs" / "img"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--slow", type=int, default=5)
    ap.add_argument("--width", type=int, default=118)
    args = ap.parse_args()
    from rich.console import Console

    IMG.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        code, logs, stop = base / "code", base / "logs", base / "stop"
        code.mkdir()
        (code / "slowhost.py").write_text(SLOWHOST)
        run = f"top{args.hosts}"
        cmd = [
            sys.executable, "-m", "multihost", "run", "--local", str(args.hosts), "--detach",
            "--run-name", run, "--log-dir", str(logs), "--script-dir", str(code),
            "--coordinator-port", str(free_port()), "--env", "JAX_PLATFORMS=cpu",
            "--env", f"SLOW_PROCESS={args.slow}", "--env", f"STOP_FILE={stop}",
            "--cmd", "python slowhost.py",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, env={**os.environ, "HOME": str(base)})
        os.environ["HOME"] = str(base)  # the --local hosts live under it
        try:

            def stepping() -> multihost.FleetSnapshot | None:
                snap = multihost.top(run, log_dir=logs)
                ok = all(r.state == "stepping" and (r.steps or 0) >= 20 for r in snap.rows)
                return snap if ok and snap.straggler is not None else None

            snap = wait_for(stepping, 600, "every host stepping", interval=2)
            console = Console(record=True, width=args.width, height=30, file=io.StringIO())
            console.print(screen(snap, console))
            svg = IMG / f"top-{args.hosts}.svg"
            console.save_svg(str(svg), title=f"multihost top {run}")
            print(f"wrote {svg}")
            time.sleep(10)  # more steps for the picture
        finally:
            stop.touch()
        wait_for(lambda: multihost.status(run, log_dir=logs)[0].state.final, 300, "the run's end")
        png = multihost.plot(run, log_dir=logs, out=IMG / f"steps-{args.hosts}.png")
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
