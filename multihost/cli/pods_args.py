"""The arguments of ``up``, ``down``, ``pods``, ``gc``, ``autodown``, and the pod flags of
``run``/``sweep`` (``--up``, ``--down`` and up's own flags). No rich here: --help stays light."""

from __future__ import annotations

import argparse
from typing import Any

from multihost.cli.args import Parser, add, command
from multihost.defaults import DEFAULTS as D
from multihost.settings import schema as s
from multihost.settings.flag import Flag
from multihost.settings.types import positive

NAME_HELP = "the pod's name: its queued resource (and its nodes' prefix), its record here"
# run/sweep flags that are a pod's (their dests): any of them given routes the run through
# ``multihost.pods.ops.around``, which uses each or refuses it, never ignores it
POD_FLAGS = (
    "up",
    "down",
    "autodown",
    "tpu_type",
    "runtime_version",
    "num_slices",
    "capacity",
    "zones",
    "queue_timeout",
)


def wants_pod(args: argparse.Namespace) -> bool:
    """Whether a run or a sweep was given any of a pod's flags."""
    return any(getattr(args, dest, None) not in (None, False) for dest in POD_FLAGS)


def _workers(*flags: Flag) -> tuple[Flag, ...]:
    """--prefix's flags as the commands on a pod show them: about its workers (these commands
    have no --prefix)."""
    return tuple(
        f.but(
            help=(f.help or "")
            .replace("with --prefix: ", "")
            .replace(" with --prefix)", " for a pod's workers)")
        )
        for f in flags
    )


def request_flags(p: Parser, *, zone: bool) -> None:
    """What a pod is made of: the same names as ``job submit``."""
    cloud = p.at("cloud")
    cloud.add_argument(
        "--tpu-type",
        metavar="TYPE",
        help="accelerator type, e.g. v4-16, v5litepod-16 (default: none, required to create a pod)",
    )
    cloud.add_argument(
        "--num-slices",
        type=positive(int),
        metavar="N",
        help="slices (multislice when 2 or more; default 1)",
    )
    cloud.add_argument(
        "--runtime-version",
        metavar="V",
        help="TPU VM software version, e.g. "
        "tpu-ubuntu2204-base (default: none, required to create a pod)",
    )
    cap = cloud.add_mutually_exclusive_group()
    for flag in ("spot", "reserved", "best-effort"):
        cap.add_argument(
            f"--{flag}",
            dest="capacity",
            action="store_const",
            const=flag,
            help=f"{flag} capacity (default: on-demand)",
        )
    if zone:
        cloud.add_argument(
            "--zone", help="the zone to ask in (default: gcloud's default zone; or --zones)"
        )
        cloud.add_argument("--project", help="gcloud project (default: gcloud's)")
    cloud.add_argument(
        "--zones", metavar="A,B,C", help="zones to try in order (failover; default: --zone alone)"
    )
    cloud.add_argument(
        "--queue-timeout",
        metavar="DURATION",
        help="how long one zone's request may wait for capacity before the next "
        "zone is tried; also the request's --valid-until-duration (default "
        f"{D.queue_timeout:g}s)",
    )
    cloud.add_argument(
        "--autodown",
        metavar="DURATION|off",
        help="the pod deletes itself once idle this long, e.g. 30m, 3600; off stops it "
        "(default: off)",
    )


def labelled_flags(p: Parser) -> None:
    """``pods``/``gc``: look in zones for requests labelled by multihost (made from any
    machine), not only at the records kept here."""
    cloud = p.at("cloud")
    cloud.add_argument(
        "--zones",
        metavar="A,B",
        help="also list the requests labelled by "
        "multihost in these zones, made from any machine (default: only "
        "those recorded here)",
    )
    cloud.add_argument("--project", help="gcloud project (default: gcloud's)")


POD_COMMANDS = ("up", "down", "pods", "gc", "autodown")


def add_pod_parsers(sub: Any) -> None:
    """The commands on a pod (:data:`POD_COMMANDS`)."""
    up = command(
        sub, "up", "create a pod (a queued resource) and wait until every worker accepts SSH"
    )
    up.add_argument("name", metavar="NAME", help=NAME_HELP)
    request_flags(up, zone=True)
    add(
        up,
        *_workers(s.IP),
        s.USER,
        s.SSH_CONFIG,
        *_workers(s.HOST_KEYS),
        s.CONNECT_TIMEOUT,
        s.CONNECT_LIMIT,
        *_workers(s.TUNNEL_THROUGH_IAP, s.NO_ADD_KEY),
    )

    down = command(sub, "down", "delete a pod made by multihost (every slice)")
    down.add_argument("name", metavar="NAME", help=NAME_HELP)
    cloud = down.at("cloud")
    cloud.add_argument(
        "--async",
        dest="no_wait",
        action="store_true",
        help="send the delete and return (default: wait until it is gone)",
    )
    cloud.add_argument(
        "--zone",
        help="where to look for a pod with no record here, by its "
        "label (default: the record's zone)",
    )
    cloud.add_argument("--project", help="gcloud project (default: gcloud's)")

    pods = command(sub, "pods", "the pods multihost made: state, price, cost so far, autodown")
    add(pods, s.JSON, s.SSH_CONFIG, *_workers(s.HOST_KEYS, s.IP, s.TUNNEL_THROUGH_IAP), s.USER)
    labelled_flags(pods)

    gc = command(sub, "gc", "delete the requests multihost made that can never run again")
    add(gc, s.DRY_RUN.but(help="say what would be deleted"))
    labelled_flags(gc)

    auto = command(sub, "autodown", "change when an idle pod deletes itself")
    auto.add_argument("name", metavar="NAME", help=NAME_HELP)
    auto.add_argument(
        "duration",
        metavar="DURATION|off",
        help="idle time before the pod deletes itself, e.g. 30m; off stops it",
    )
    add(
        auto,
        s.SSH_CONFIG,
        *_workers(s.HOST_KEYS, s.NO_ADD_KEY, s.IP, s.TUNNEL_THROUGH_IAP),
        s.USER,
    )


def add_run_pod_flags(p: Parser) -> None:
    """``run``/``sweep --prefix NAME --up/--down``: one command, one ephemeral pod."""
    cloud = p.at("cloud")
    cloud.add_argument(
        "--up",
        action="store_true",
        help="with --prefix NAME: create the pod first when it does not exist "
        "(up's flags: --tpu-type, --runtime-version, --zones...); an existing pod is used, "
        "its flags checked against it",
    )
    cloud.add_argument(
        "--down",
        action="store_true",
        help="with --prefix NAME: delete the pod when the run ends (success, "
        "failure, Ctrl-C or SIGTERM)",
    )
    request_flags(p, zone=False)
