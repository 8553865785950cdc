"""The ``multihost job`` subcommands' arguments (no rich here: --help stays light)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multihost.cli.args import Parser, add, command
from multihost.defaults import DEFAULTS as D
from multihost.settings.environment import (
    ALL_EXTRAS,
    EXTRA,
    GROUP,
    NO_DEV,
    NO_SYNC,
    REQUIREMENTS,
)
from multihost.settings.schema import COMPILE_CACHE, COMPILE_CACHE_MAX
from multihost.settings.types import count, port, positive

NAME_HELP = "the job's name: its queued resource, its folder in the bucket, its record here"


def add_job_parser(sub: Any) -> None:
    """``multihost job SUBCOMMAND`` with its own subcommands."""
    job = command(sub, "job", "production jobs: queued resources that run themselves")
    jsub = job.add_subparsers(dest="job_command", required=True, parser_class=Parser)

    submit = command(jsub, "submit", "pack, upload, create the queued resource", under="job")
    submit.add_argument(
        "name", metavar="NAME", help=NAME_HELP + " (lowercase letters, digits, '-')"
    )
    cloud = submit.at("cloud")
    cloud.add_argument(
        "--tpu-type", required=True, metavar="TYPE", help="accelerator type, e.g. v4-16"
    )
    cloud.add_argument(
        "--num-slices",
        metavar="N",
        type=positive(int),
        default=1,
        help="slices of --tpu-type, one queued resource (default %(default)s)",
    )
    cloud.add_argument(
        "--runtime-version",
        metavar="VERSION",
        required=True,
        help="TPU software version, e.g. tpu-ubuntu2204-base",
    )
    cloud.add_argument(
        "--bucket", required=True, metavar="GS_URL", help="gs://BUCKET for code, logs, record"
    )
    cloud.add_argument("--zone", metavar="ZONE", help="gcloud zone (default: gcloud's)")
    cloud.add_argument("--project", metavar="PROJECT", help="gcloud project (default: gcloud's)")
    cap = cloud.add_mutually_exclusive_group()
    for flag, what in (
        ("spot", "spot capacity: cheaper, may be preempted"),
        ("reserved", "your reservation's capacity"),
        ("best-effort", "best-effort capacity (gcloud alpha)"),
    ):
        cap.add_argument(
            f"--{flag}",
            dest="capacity",
            action="store_const",
            const=flag,
            help=f"{what} (default: on-demand)",
        )
    launch = submit.at("launch")
    launch.add_argument(
        "--max-restarts",
        type=count,
        default=0,
        metavar="K",
        help="re-create after up to K preemptions (default 0)",
    )
    staging = submit.at("staging")
    staging.add_argument(
        "--script-dir",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="code to pack and upload (default: the current directory)",
    )
    staging.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave out of the packed code (glob; repeatable)",
    )
    env = submit.at("environment")
    env.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set K=V in the job's environment (NOT secret: stored in the job "
        "record and the startup script; use --secret)",
    )
    env.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="KEY=NAME",
        help="set KEY to Secret Manager secret NAME's latest version, read by "
        "each host at start; the value is never stored",
    )
    out = submit.at("output")
    out.add_argument(
        "--log-interval",
        type=positive(int),
        default=10,
        metavar="S",
        help="seconds between each worker's log uploads to the bucket (default %(default)s)",
    )
    launch.add_argument(
        "--start-timeout",
        type=positive(float),
        default=600.0,
        metavar="S",
        help="fail (and delete the queued resource) when a worker has not "
        "started S seconds after it is ACTIVE (default %(default)g)",
    )
    launch.add_argument(
        "--coordinator-port",
        type=port,
        default=D.coordinator_port,
        metavar="PORT",
        help="JAX coordinator port (default %(default)s)",
    )
    launch.add_argument(
        "--megascale-port",
        type=port,
        default=D.megascale_port,
        metavar="PORT",
        help="Megascale port (default %(default)s)",
    )
    launch.add_argument("--cmd", required=True, help="command run under sh -c on every worker")
    # the locked environment, as for run: process 0 builds it once, the bucket caches it
    add(submit, NO_SYNC, EXTRA, ALL_EXTRAS, GROUP, NO_DEV, REQUIREMENTS)
    env.add_argument(
        "--env-wait",
        type=positive(float),
        default=D.env_wait,
        metavar="S",
        help="how long a worker waits for process 0 to put the locked "
        f"environment in the bucket (default {D.env_wait:g})",
    )
    add(
        submit,
        COMPILE_CACHE.but(
            help="keep each worker's compiled JAX programs in a persistent cache, kept in the "
            "bucket across attempts (jobs/NAME/compile-cache/): an attempt after a preemption "
            "compiles nothing an earlier one did; a JAX_COMPILATION_CACHE_DIR of yours wins "
            "(default: yes)"
        ),
        COMPILE_CACHE_MAX,
    )
    out.add_argument("--watch", action="store_true", help="follow the job at once")
    _watch_flags(submit)

    watch = command(jsub, "watch", "follow a job to its end; exit code = the job's", under="job")
    watch.add_argument("name", metavar="NAME", help=NAME_HELP)
    _watch_flags(watch)

    status = command(jsub, "status", "state, attempt, per-host state and exit codes", under="job")
    status.add_argument("name", metavar="NAME", help=NAME_HELP)
    status.at("output").add_argument("--json", action="store_true", help="JSON, not a table")

    logs = command(jsub, "logs", "print (or --follow) a worker's log from the bucket", under="job")
    logs.add_argument("name", metavar="NAME", help=NAME_HELP)
    which = logs.at("hosts").add_mutually_exclusive_group()
    which.add_argument(
        "--host",
        default="0/0",
        metavar="SLICE/WORKER",
        help="this worker's log (default %(default)s)",
    )
    which.add_argument("--all", action="store_true", help="every worker's log, prefixed")
    out = logs.at("output")
    out.add_argument("--attempt", type=count, help="default: the current attempt")
    out.add_argument("--follow", action="store_true", help="print lines as they arrive")
    out.add_argument("--json", action="store_true", help="one JSON object per line")
    out.add_argument(
        "--poll",
        type=positive(float),
        default=5.0,
        metavar="S",
        help="with --follow: seconds between reads (default %(default)g)",
    )
    _patience_flag(logs)

    stop = command(jsub, "stop", "delete the queued resource; record the job stopped", under="job")
    stop.add_argument("name", metavar="NAME", help=NAME_HELP)

    ls = command(jsub, "ls", "jobs submitted from here", under="job")
    ls.at("output").add_argument("--json", action="store_true", help="JSON, not a table")


def _watch_flags(p: Parser) -> None:
    watch = p.at("cloud")
    watch.add_argument("--keep", action="store_true", help="keep the queued resource on success")
    watch.add_argument(
        "--poll",
        type=positive(float),
        default=5.0,
        metavar="S",
        help="seconds between polls (default 5)",
    )
    _patience_flag(p)
    watch.add_argument(
        "--resubmit",
        action="store_true",
        help="once, when the queued resource is deleted or vanishes before it is ever ACTIVE "
        "(not a preemption), create a new attempt (default: fail)",
    )
    p.at("output").add_argument(
        "--detach",
        action="store_true",
        help="watch in the background, without a terminal (output: the job's "
        "watch.log; a systemd user unit: docs/how-to/jobs.md)",
    )


def _patience_flag(p: Parser) -> None:
    p.at("cloud").add_argument(
        "--control-plane-timeout",
        type=positive(float),
        default=D.control_plane_timeout,
        metavar="S",
        help="retry failing gcloud calls (5xx, resets, timeouts) for up to S "
        f"seconds before giving up (default {D.control_plane_timeout:g})",
    )
