"""The parsers of ``up``, ``down``, ``pods``, ``gc`` and ``autodown``, from the schema's groups
(``multihost.settings.schema``: their flags are declared there, once). No rich here: --help
stays light."""

from __future__ import annotations

from typing import Any

from multihost.cli.args import add, command
from multihost.settings import cloudcommands as s

NAME_HELP = "the pod's name: its queued resource (and its nodes' prefix), its record here"
POD_COMMANDS = ("up", "down", "pods", "gc", "autodown")


def add_pod_parsers(sub: Any) -> None:
    """The commands on a pod (:data:`POD_COMMANDS`)."""
    up = command(
        sub, "up", "create a pod (a queued resource) and wait until every worker accepts SSH"
    )
    up.add_argument("name", metavar="NAME", help=NAME_HELP)
    add(up, *s.UP_COMMAND)

    down = command(sub, "down", "delete a pod made by multihost (every slice)")
    down.add_argument("name", metavar="NAME", help=NAME_HELP)
    add(down, *s.DOWN_COMMAND)

    pods = command(sub, "pods", "the pods multihost made: state, price, cost so far, autodown")
    add(pods, *s.PODS_COMMAND)

    gc = command(sub, "gc", "delete the requests multihost made that can never run again")
    add(gc, *s.GC_COMMAND)

    auto = command(sub, "autodown", "change when an idle pod deletes itself")
    auto.add_argument("name", metavar="NAME", help=NAME_HELP)
    auto.add_argument(
        "duration",
        metavar="DURATION|off",
        help="idle time before the pod deletes itself, e.g. 30m; off stops it",
    )
    add(auto, *s.AUTODOWN_COMMAND)
