"""The ``multihost job`` subcommands' arguments (no rich here: --help stays light)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multihost.defaults import DEFAULTS as D
from multihost.settings.environment import (
    ALL_EXTRAS,
    EXTRA,
    GROUP,
    NO_DEV,
    NO_SYNC,
    REQUIREMENTS,
)
from multihost.settings.types import count, port

Positive = Callable[[type[int] | type[float]], Callable[[str], int | float]]


def add_job_parser(sub: Any, positive: Positive, add: Callable[..., None]) -> None:
    """``multihost job SUBCOMMAND`` with its own subcommands; ``add`` declares schema flags."""
    job = sub.add_parser("job", help="production jobs: queued resources that run themselves")
    jsub = job.add_subparsers(dest="job_command", required=True, parser_class=type(job))

    submit = jsub.add_parser("submit", help="pack, upload, create the queued resource")
    submit.add_argument("name", metavar="NAME")
    submit.add_argument("--tpu-type", required=True, help="accelerator type, e.g. v4-16")
    submit.add_argument("--num-slices", type=positive(int), default=1)
    submit.add_argument("--runtime-version", required=True)
    submit.add_argument("--bucket", required=True, help="gs://BUCKET for code, logs, record")
    submit.add_argument("--zone")
    submit.add_argument("--project")
    cap = submit.add_mutually_exclusive_group()
    for flag in ("spot", "reserved", "best-effort"):
        cap.add_argument(f"--{flag}", dest="capacity", action="store_const", const=flag)
    submit.add_argument("--max-restarts", type=count, default=0, metavar="K",
                        help="re-create after up to K preemptions (default 0)")  # fmt: skip
    submit.add_argument("--script-dir", type=Path, default=Path("."))
    submit.add_argument("--exclude", action="append", default=[], metavar="PATTERN")
    submit.add_argument("--env", action="append", default=[], metavar="K=V",
                        help="set K=V in the job's environment (NOT secret: stored in the job "
                        "record and the startup script; use --secret)")  # fmt: skip
    submit.add_argument("--secret", action="append", default=[], metavar="KEY=NAME",
                        help="set KEY to Secret Manager secret NAME's latest version, read by "
                        "each host at start; the value is never stored")  # fmt: skip
    submit.add_argument("--log-interval", type=positive(int), default=10, metavar="S")
    submit.add_argument("--start-timeout", type=positive(float), default=600.0, metavar="S")
    submit.add_argument("--coordinator-port", type=port, default=D.coordinator_port,
                        metavar="PORT")  # fmt: skip
    submit.add_argument("--megascale-port", type=port, default=D.megascale_port,
                        metavar="PORT")  # fmt: skip
    submit.add_argument("--cmd", required=True, help="command run under sh -c on every worker")
    # the locked environment, as for run: process 0 builds it once, the bucket caches it
    add(submit, NO_SYNC, EXTRA, ALL_EXTRAS, GROUP, NO_DEV, REQUIREMENTS)
    submit.add_argument("--env-wait", type=positive(float), default=D.env_wait, metavar="S",
                        help="how long a worker waits for process 0 to put the locked "
                        f"environment in the bucket (default {D.env_wait:g})")  # fmt: skip
    submit.add_argument("--watch", action="store_true", help="follow the job at once")
    _watch_flags(submit, positive)

    watch = jsub.add_parser("watch", help="follow a job to its end; exit code = the job's")
    watch.add_argument("name", metavar="NAME")
    _watch_flags(watch, positive)

    status = jsub.add_parser("status", help="state, attempt, per-host state and exit codes")
    status.add_argument("name", metavar="NAME")
    status.add_argument("--json", action="store_true")

    logs = jsub.add_parser("logs", help="print (or --follow) a worker's log from the bucket")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("--attempt", type=count, help="default: the current attempt")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--host", default="0/0", metavar="SLICE/WORKER")
    which.add_argument("--all", action="store_true")
    logs.add_argument("--follow", action="store_true", help="print lines as they arrive")
    logs.add_argument("--json", action="store_true", help="one JSON object per line")
    logs.add_argument("--poll", type=positive(float), default=5.0, metavar="S")
    _patience_flag(logs, positive)

    stop = jsub.add_parser("stop", help="delete the queued resource; record the job stopped")
    stop.add_argument("name", metavar="NAME")

    ls = jsub.add_parser("ls", help="jobs submitted from here")
    ls.add_argument("--json", action="store_true")


def _watch_flags(p: argparse.ArgumentParser, positive: Positive) -> None:
    p.add_argument("--keep", action="store_true", help="keep the queued resource on success")
    p.add_argument("--poll", type=positive(float), default=5.0, metavar="S",
                   help="seconds between polls (default 5)")  # fmt: skip
    _patience_flag(p, positive)
    p.add_argument(
        "--resubmit", action="store_true",
        help="once, when the queued resource is deleted or vanishes before it is ever ACTIVE "
        "(not a preemption), create a new attempt (default: fail)",
    )  # fmt: skip
    p.add_argument("--detach", action="store_true",
                   help="watch in the background, without a terminal (output: the job's "
                   "watch.log; a systemd user unit: docs/how-to/jobs.md)")  # fmt: skip


def _patience_flag(p: argparse.ArgumentParser, positive: Positive) -> None:
    p.add_argument(
        "--control-plane-timeout", type=positive(float), default=D.control_plane_timeout,
        metavar="S", help="retry failing gcloud calls (5xx, resets, timeouts) for up to S "
        f"seconds before giving up (default {D.control_plane_timeout:g})",
    )  # fmt: skip
