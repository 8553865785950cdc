"""The parsers of ``multihost job SUBCOMMAND``, from the schema's groups
(``multihost.settings.schema``: their flags are declared there, once). No rich here: --help
stays light."""

from __future__ import annotations

from typing import Any

from multihost.cli.args import Parser, add, command
from multihost.settings import cloudcommands as c
from multihost.settings import schema as s
from multihost.settings.flag import OneOf

NAME_HELP = "the job's name: its queued resource, its folder in the bucket, its record here"


def add_job_parser(sub: Any) -> None:
    """``multihost job SUBCOMMAND`` with its own subcommands."""
    job = command(sub, "job", "production jobs: queued resources that run themselves")
    jsub = job.add_subparsers(dest="job_command", required=True, parser_class=Parser)

    submit = command(jsub, "submit", "pack, upload, create the queued resource", under="job")
    submit.add_argument(
        "name", metavar="NAME", help=NAME_HELP + " (lowercase letters, digits, '-')"
    )
    add(submit, *c.JOB_SUBMIT)

    watch = command(jsub, "watch", "follow a job to its end; exit code = the job's", under="job")
    watch.add_argument("name", metavar="NAME", help=NAME_HELP)
    add(watch, *c.JOB_WATCH)

    status = command(jsub, "status", "state, attempt, per-host state and exit codes", under="job")
    status.add_argument("name", metavar="NAME", help=NAME_HELP)
    add(status, s.JSON.but(help="JSON, not a table"))

    logs = command(jsub, "logs", "print (or --follow) a worker's log from the bucket", under="job")
    logs.add_argument("name", metavar="NAME", help=NAME_HELP)
    add(
        logs,
        OneOf((s.JOB_HOST, s.ALL_HOSTS)),
        s.ATTEMPT,
        s.FOLLOW,
        s.JSON.but(help="one JSON object per line"),
        s.POLL.but(help="with --follow: seconds between reads (default %(default)g)"),
        s.CONTROL_PLANE_TIMEOUT,
    )

    stop = command(jsub, "stop", "delete the queued resource; record the job stopped", under="job")
    stop.add_argument("name", metavar="NAME", help=NAME_HELP)

    ls = command(jsub, "ls", "jobs submitted from here", under="job")
    add(ls, s.JSON.but(help="JSON, not a table"))
