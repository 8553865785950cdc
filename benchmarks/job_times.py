"""``multihost job`` on the stand-in: submit → all hosts running, preemption → attempt 1 running.

The stand-in of multihost/sandbox/standin/ (the real gcloud CLI, fake GCS, the TPU API
stand-in, startup scripts on the loopback SSH fleet). Each trial submits a v4-16 job (2
workers) with ``--watch``, takes the last worker's ``.started`` time minus the moment the
submit command was started (submit → all running), preempts the queued resource and takes
attempt 1's last ``.started`` time minus the preemption (preemption → attempt 1 running); the
watcher then sees attempt 1 finish. ``.started`` holds whole seconds (``date +%s`` on the
worker): ±1 s per figure.

Usage: ``python benchmarks/job_times.py [--repeat 5] [--polls 2,5]`` (root: the fleet). Hold
the fleet lock. Writes its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from tests import fleet as loopback  # noqa: E402
from tests.cloud.fixture import Cloud, standin  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.test_job_cloud import started_times, submit_args  # noqa: E402

CMD = 'echo "attempt=$MULTIHOST_ATTEMPT"; if [ "$MULTIHOST_ATTEMPT" = 0 ]; then sleep 300; fi'


def trial(cloud: Cloud, name: str, code: Path, poll: float) -> tuple[float, float]:
    """(submit → all running, preemption → attempt 1 running) in seconds."""
    argv = submit_args(name, code, CMD, "--max-restarts", "1", "--watch")
    argv[argv.index("--poll") + 1] = str(poll)
    t0 = time.time()
    watch = subprocess.Popen(
        [sys.executable, "-m", "multihost", "job", *argv],
        env=cloud.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = wait_for(lambda: started_times(cloud, name, 0, 2), 180, "attempt 0")
        preempted = time.time()
        cloud.preempt(f"{name}-a0")
        second = wait_for(lambda: started_times(cloud, name, 1, 2), 180, "attempt 1")
        _, err = watch.communicate(timeout=180)
    finally:
        watch.kill()
    if watch.returncode != 0:
        raise RuntimeError(f"job {name} failed: {err[-2000:]}")
    return max(first) - t0, max(second) - preempted


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--polls", default="2,5", help="watch --poll values to compare")
    args = p.parse_args()
    polls = [float(x) for x in args.polls.split(",")]
    fleet = loopback.up(8)
    rows = []
    with standin(fleet) as cloud, tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "main.py").write_text("print('hello')\n")
        for poll in polls:
            submit, preempt = [], []
            load_before = os.getloadavg()[0]
            for i in range(args.repeat):
                cloud.tpu.reset()
                a, b = trial(cloud, f"bench-{int(poll * 10)}-{i}", code, poll)
                submit.append(a)
                preempt.append(b)
                print(
                    f"poll {poll:g}: submit→running {a:.1f}s, preemption→running {b:.1f}s",
                    file=sys.stderr,
                )
            rows.append((poll, submit, preempt, load_before, os.getloadavg()[0]))
    write(rows, args)


def write(
    rows: list[tuple[float, list[float], list[float], float, float]], args: argparse.Namespace
) -> None:
    gcloud = subprocess.run(["gcloud", "version"], capture_output=True, text=True).stdout
    version = gcloud.splitlines()[0] if gcloud else "?"
    lines = [
        "<!-- job_times:begin -->",
        "## Production jobs on the stand-in: submit → running, preemption → attempt 1 running",
        "",
        f"Machine: 2 cores, {version}, Python {sys.version.split()[0]}, "
        f"{datetime.date.today()}. Every cloud call is the real gcloud CLI (about 1–2 s of CPU "
        'each) against fake GCS and the TPU API stand-in; the "TPU VMs" are loopback SSH '
        "hosts on the same 2 cores, so load from other work inflates every figure. "
        "`.started` holds whole seconds: ±1 s per figure.",
        "",
        f"Command: `python benchmarks/job_times.py --repeat {args.repeat} --polls {args.polls}`",
        "",
        "| watch --poll (s) | trials | submit → both workers running (s), median (range) "
        "| preemption → attempt 1 running (s), median (range) | load before / after |",
        "|---:|---:|---|---|---|",
    ]
    for poll, submit, preempt, before, after in rows:
        lines.append(
            f"| {poll:g} | {len(submit)} | {spread(submit)} | {spread(preempt)} "
            f"| {before:.1f} / {after:.1f} |"
        )
    lines.append("<!-- job_times:end -->")
    section = "\n".join(lines) + "\n"
    write_section("job_times", section)
    print(section)


if __name__ == "__main__":
    main()
