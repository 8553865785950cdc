"""The commands on a pod and on a job: which of the schema's flags each takes (``up``,
``down``, ``pods``, ``gc``, ``autodown``, ``job submit``, ``job watch``), some shown with the
help that command gives them. Their dests are the keywords of ``multihost.up``, ``pods``,
``submit_job``... (``multihost.api.keywords``); the flags themselves are declared in the
schema (``multihost.settings.schema``, a pod's and a job's in ``cloudflags``)."""

from __future__ import annotations

from multihost.defaults import DEFAULTS as D
from multihost.settings.environment import ENVIRONMENT
from multihost.settings.flag import Flag, Group
from multihost.settings.schema import (
    BUCKET,
    CMD,
    COMPILE_CACHE,
    COMPILE_CACHE_MAX,
    CONNECT_LIMIT,
    CONNECT_TIMEOUT,
    CONTROL_PLANE_TIMEOUT,
    COORDINATOR_PORT,
    DETACH,
    DRY_RUN,
    ENV,
    ENV_WAIT,
    EXCLUDE,
    HOST_KEYS,
    IP,
    JSON,
    KEEP,
    LOG_INTERVAL,
    MAX_RESTARTS,
    MEGASCALE_PORT,
    NO_ADD_KEY,
    NO_WAIT,
    POD,
    POLL,
    PROFILE,
    PROJECT,
    REQUEST,
    RESUBMIT,
    SCRIPT_DIR,
    SECRET,
    SSH_CONFIG,
    START_TIMEOUT,
    TUNNEL_THROUGH_IAP,
    USER,
    WATCH,
    ZONE,
    ZONES,
)


def for_workers(*flags: Flag) -> tuple[Flag, ...]:
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


_GCLOUD_PROJECT = PROJECT.but(help="gcloud project (default: gcloud's)")
POD_REACH: Group = (
    *for_workers(IP),
    USER,
    SSH_CONFIG,
    *for_workers(HOST_KEYS),
    CONNECT_TIMEOUT,
    CONNECT_LIMIT,
    *for_workers(TUNNEL_THROUGH_IAP, NO_ADD_KEY),
)
"""How a pod's workers are reached (its first contact, autodown's daemon on worker 0)."""
UP_COMMAND: Group = (
    PROFILE,
    *POD,
    ZONE.but(help="the zone to ask in (default: gcloud's default zone; or --zones)"),
    _GCLOUD_PROJECT,
    *POD_REACH,
)
DOWN_COMMAND: Group = (
    NO_WAIT,
    ZONE.but(
        help="where to look for a pod with no record here, by its label (default: the "
        "record's zone)"
    ),
    _GCLOUD_PROJECT,
)
LABELLED: Group = (
    ZONES.but(
        help="also list the requests labelled by multihost in these zones, made from any "
        "machine (default: only those recorded here)"
    ),
    _GCLOUD_PROJECT,
)
PODS_COMMAND: Group = (
    PROFILE,
    JSON,
    SSH_CONFIG,
    *for_workers(HOST_KEYS, IP, TUNNEL_THROUGH_IAP),
    USER,
    *LABELLED,
)
GC_COMMAND: Group = (DRY_RUN.but(help="say what would be deleted"), *LABELLED)
AUTODOWN_COMMAND: Group = (
    PROFILE,
    SSH_CONFIG,
    *for_workers(HOST_KEYS, NO_ADD_KEY, IP, TUNNEL_THROUGH_IAP),
    USER,
)

JOB_WATCH: Group = (
    KEEP,
    POLL,
    CONTROL_PLANE_TIMEOUT,
    RESUBMIT,
    DETACH.but(
        help="watch in the background, without a terminal (output: the job's watch.log; a "
        "systemd user unit: docs/how-to/jobs.md)",
        group="output",
    ),
)
JOB_SUBMIT: Group = (
    PROFILE,
    *REQUEST,
    BUCKET,
    ZONE.but(help="gcloud zone (default: gcloud's)"),
    _GCLOUD_PROJECT,
    MAX_RESTARTS,
    SCRIPT_DIR.but(help="code to pack and upload (default: the current directory)"),
    EXCLUDE.but(help="leave out of the packed code (glob; repeatable; default: none)"),
    ENV.but(
        help="set K=V in the job's environment (NOT secret: stored in the job record and the "
        "startup script; use --secret) (repeatable; default: none)"
    ),
    SECRET.but(
        help="set KEY to Secret Manager secret NAME's latest version, read by each host at "
        "start; the value is never stored (repeatable; default: none)"
    ),
    LOG_INTERVAL,
    START_TIMEOUT,
    COORDINATOR_PORT.but(help=f"JAX coordinator port (default {D.coordinator_port})"),
    MEGASCALE_PORT.but(help="Megascale port (default %(default)s)"),
    CMD,
    *ENVIRONMENT[:6],  # uv's selection and --requirements: no --setup, no --host-uv
    ENV_WAIT,
    COMPILE_CACHE.but(
        help="keep each worker's compiled JAX programs in a persistent cache, kept in the "
        "bucket across attempts (jobs/NAME/compile-cache/): an attempt after a preemption "
        "compiles nothing an earlier one did; a JAX_COMPILATION_CACHE_DIR of yours wins "
        "(default: yes)"
    ),
    COMPILE_CACHE_MAX,
    WATCH,
    *JOB_WATCH,
)
"""``job submit``'s flags (its keywords: ``multihost.submit_job``)."""
