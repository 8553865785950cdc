"""The fleet's flags: where to run (``--hosts/--local/--prefix``), the cloud's options
(project, zone, IAP, workers) and how to reach the hosts (user, keys, timeouts).

Part of the settings schema (``multihost.settings.schema`` re-exports every name here); the
run's own flags are declared there.
"""

from __future__ import annotations

from pathlib import Path

from multihost.defaults import DEFAULTS as D
from multihost.defaults import IP_MODES
from multihost.settings.flag import Flag, Group, OneOf
from multihost.settings.types import positive, workers

__all__ = [
    "CONNECT_LIMIT",
    "CONNECT_TIMEOUT",
    "EXCLUDE_WORKERS",
    "HOSTS",
    "HOST_KEYS",
    "IAP_PER_HOST",
    "IP",
    "LOCAL",
    "NO_ADD_KEY",
    "PREFIX",
    "PROFILE",
    "PROJECT",
    "QUICK_AUTH",
    "SOURCES",
    "SSH_CONFIG",
    "SUBSET",
    "TUNNEL_THROUGH_IAP",
    "USER",
    "VERBOSE",
    "WAIT",
    "WORKERS",
    "ZONE",
    "fleet",
]

# -- the fleet: where to run, and how to reach it --------------------------------------------
PROFILE = Flag(
    "profile",
    metavar="NAME",
    setting=False,
    help="defaults from this profile of the config files (see multihost config; default: none)",
    group="hosts",
)
HOSTS = Flag(
    "hosts",
    metavar="LIST|FILE",
    help="comma list of [user@]host[:port] with ranges (h[0-3], 10.0.0.[2-9]), a TOML "
    "inventory, or a file with one host per line",
    group="hosts",
)
LOCAL = Flag(
    "local",
    type=workers,
    metavar="N",
    help=f"N workers on this machine, no SSH (at most {D.local_max})",
    group="hosts",
)
PREFIX = Flag("prefix", help="Cloud TPU node or queued resource name", group="hosts")
SOURCES = ("hosts", "local", "prefix")  # one of them picks the fleet: one given replaces all
PROJECT = Flag("project", help="with --prefix: gcloud project (default: gcloud's)", group="cloud")
ZONE = Flag("zone", help="with --prefix: gcloud zone (default: gcloud's)", group="cloud")
IP = Flag(
    "ip",
    choices=IP_MODES,
    default="auto",
    help="with --prefix: address to connect to (default %(default)s: external if any)",
    group="cloud",
)
USER = Flag(
    "user", help="ssh user for every host (default: ssh config's, else yours)", group="connection"
)
SSH_CONFIG = Flag(
    "ssh-config",
    type=Path,
    metavar="FILE",
    help="ssh config file (default ~/.ssh/config)",
    group="connection",
)
HOST_KEYS = Flag(
    "host-keys",
    choices=("strict", "accept-new"),
    help="strict: known_hosts only; accept-new: trust on first use, refuse a "
    "changed key (default: strict, accept-new with --prefix)",
    group="connection",
)
CONNECT_TIMEOUT = Flag(
    "connect-timeout",
    type=positive(float),
    metavar="S",
    help="seconds per SSH handshake (default %(default)g s)",
    group="connection",
)
CONNECT_LIMIT = Flag(
    "connect-limit",
    type=positive(int),
    metavar="N",
    help="handshakes in flight at once (default %(default)s)",
    group="connection",
)
QUICK_AUTH = Flag(  # transport.quickauth: armed only on asyncssh code verified
    "quick-auth",
    kind="bool",
    help="public-key auth in one round trip after the key exchange instead of asyncssh's "
    "four, where the installed asyncssh's code is the code verified (elsewhere asyncssh's own "
    "course, said with --verbose) (default: yes; --no-quick-auth or MULTIHOST_QUICK_AUTH=0: "
    "asyncssh's own course)",
    group="connection",
)
VERBOSE = Flag(
    "verbose",
    kind="switch",
    setting=False,
    help="say on stderr how hosts are reached: which SSH authentication path ran, once "
    "(default: not said)",
    group="output",
)

WAIT = Flag(  # a queued resource still provisioning: wait for it instead of exit 2
    "wait",
    kind="optional",
    type=positive(float),
    const=float("inf"),
    metavar="SECONDS",
    setting=False,
    help="wait (at most SECONDS; bare: no limit) until every slice of a --prefix is READY and "
    "every host accepts connections (default: a queued resource not yet ACTIVE is exit 2)",
    group="cloud",
)
TUNNEL_THROUGH_IAP = Flag(  # workers with internal addresses only, reached through IAP
    "tunnel-through-iap",
    kind="switch",
    help="with --prefix: reach the workers at their internal addresses through IAP: one "
    "tunnel (gcloud start-iap-tunnel) per slice, the slice's other workers through its "
    "first worker's connection (default: connect directly)",
    group="cloud",
)
IAP_PER_HOST = Flag(
    "iap-per-host",
    kind="switch",
    help="with --tunnel-through-iap: a tunnel for every worker, for networks where workers "
    "cannot reach each other (default: one per slice)",
    group="cloud",
)

NO_ADD_KEY = Flag(  # first contact: the user's key added to the nodes as gcloud does
    "no-add-key",
    kind="switch",
    help="with --prefix: never add your key (~/.ssh/google_compute_engine) to the nodes' "
    "metadata or your OS Login profile (default: add it where it is missing, as gcloud does)",
    group="cloud",
)

WORKERS = Flag(
    "workers",
    metavar="SPEC",
    setting=False,
    help="only these hosts: process indices (0,2 or 0-3), labels as multihost prints them "
    "(s0/w3, s0/w[0-3], s1 for all of slice 1) or all; not for a JAX job, which needs every "
    "process (default: all)",
    group="hosts",
)
EXCLUDE_WORKERS = Flag(
    "exclude-workers",
    metavar="SPEC",
    setting=False,
    help="leave out these hosts (as --workers; like clush -x) (default: none)",
    group="hosts",
)
SUBSET: Group = (WORKERS, EXCLUDE_WORKERS)


def fleet(required: bool = True) -> Group:
    """``--hosts/--local/--prefix`` (one of them ``required``) and their options."""
    source = OneOf((HOSTS, LOCAL, PREFIX), required=required)
    return (
        PROFILE,
        source,
        PROJECT,
        ZONE,
        IP,
        USER,
        SSH_CONFIG,
        HOST_KEYS,
        CONNECT_TIMEOUT,
        CONNECT_LIMIT,
        QUICK_AUTH,
        WAIT,
        TUNNEL_THROUGH_IAP,
        IAP_PER_HOST,
        NO_ADD_KEY,
        VERBOSE,
    )
