"""A pod's flags and a job's: what a request asks of the TPU API (``up``, ``run``/``sweep
--prefix NAME --up``, ``job submit``), a pod's life around a run, and a job's course.

Part of the settings schema (``multihost.settings.schema`` re-exports every name here). The
request's settings (``tpu-type``, ``runtime-version``, ``num-slices``, ``capacity``,
``zones``, ``queue-timeout``, ``autodown``) and a job's (``bucket``, ``max-restarts``, ...)
are config-file keys: a profile says what its pods and jobs are made of. What a command does
rather than how (``--up``, ``--down``, ``--watch``, ``--keep``, ``--follow``, ...) is not: a
profile that deleted every pod it ran on, or followed every job, would surprise.
"""

from __future__ import annotations

from multihost.defaults import DEFAULTS as D
from multihost.settings.flag import Flag, Group
from multihost.settings.types import (
    autodown,
    bucket,
    count,
    duration,
    positive,
    slices,
    tpu_type,
    zone,
)

__all__ = [
    "ALL_HOSTS",
    "ATTEMPT",
    "AUTODOWN",
    "BUCKET",
    "CAPACITY",
    "CONTROL_PLANE_TIMEOUT",
    "DOWN",
    "ENV_WAIT",
    "FOLLOW",
    "JOB",
    "JOB_HOST",
    "KEEP",
    "LOG_INTERVAL",
    "MAX_RESTARTS",
    "NO_WAIT",
    "NUM_SLICES",
    "POD",
    "POD_AROUND",
    "POLL",
    "QUEUE_TIMEOUT",
    "REQUEST",
    "RESUBMIT",
    "RUNTIME_VERSION",
    "START_TIMEOUT",
    "TPU_TYPE",
    "UP",
    "WATCH",
    "ZONES",
]

# -- a request: what a pod (or a job) is made of ------------------------------------------------
TPU_TYPE = Flag(
    "tpu-type",
    type=tpu_type,
    metavar="TYPE",
    help="accelerator type, e.g. v4-16, v5litepod-16 (default: none; a pod to make and a job "
    "need one)",
    group="cloud",
)
RUNTIME_VERSION = Flag(
    "runtime-version",
    metavar="VERSION",
    help="TPU VM software version, e.g. tpu-ubuntu2204-base (default: none; a pod to make and "
    "a job need one)",
    group="cloud",
)
NUM_SLICES = Flag(
    "num-slices",
    type=slices,
    default=None,  # not given: an existing pod's count is not checked against it
    metavar="N",
    help=f"slices of --tpu-type in one request (multislice when 2 or more; default {D.num_slices})",
    group="cloud",
)
CAPACITY = Flag(
    "capacity",
    kind="pick",
    choices=("on-demand", "spot", "reserved", "best-effort"),
    default=None,  # not given: an existing pod's capacity is not checked against it
    metavar="KIND",
    help=f"the capacity asked for: on-demand, spot (cheaper, may be preempted), reserved "
    f"(your reservation's), best-effort (gcloud alpha); --spot is --capacity spot "
    f"(default {D.capacity})",
    group="cloud",
)
ZONES = Flag(
    "zones",
    kind="csv",
    type=zone,
    metavar="A,B,C",
    help="zones to ask in, in order, until one has capacity (failover; default: --zone alone, "
    "else gcloud's default zone)",
    group="cloud",
)
QUEUE_TIMEOUT = Flag(
    "queue-timeout",
    type=duration,
    default=None,  # not given: an existing pod is not checked against it
    metavar="DURATION",
    help="how long one zone's request may wait for capacity before the next zone is asked; "
    f"also the request's --valid-until-duration (default {D.queue_timeout:g}s)",
    group="cloud",
)
AUTODOWN = Flag(
    "autodown",
    type=autodown,
    metavar="DURATION|off",
    help="the pod deletes itself once idle this long, e.g. 30m, 3600; off stops it (default: off)",
    group="cloud",
)
REQUEST: Group = (TPU_TYPE, RUNTIME_VERSION, NUM_SLICES, CAPACITY)
"""What a queued resource is made of: a pod's and a job's, the same names."""
POD: Group = (*REQUEST, ZONES, QUEUE_TIMEOUT, AUTODOWN)
"""What a pod to make is (``up``; ``run``/``sweep --prefix NAME --up``)."""

# -- a pod around a run or a sweep ---------------------------------------------------------------
UP = Flag(
    "up",
    kind="switch",
    setting=False,
    help="with --prefix NAME: make the pod first when it does not exist (up's flags: "
    "--tpu-type, --runtime-version, --zones...); an existing pod is used, its flags checked "
    "against it",
    group="cloud",
)
DOWN = Flag(
    "down",
    kind="switch",
    setting=False,
    help="with --prefix NAME: delete the pod when the run ends (success, failure, Ctrl-C or "
    "SIGTERM)",
    group="cloud",
)
POD_AROUND: Group = (UP, DOWN, *POD)
"""A run's or a sweep's pod flags: any of them given puts the pod's life around it."""
NO_WAIT = Flag(
    "no-wait",
    kind="switch",
    setting=False,
    aliases=("--async",),
    help="send the delete and return (default: wait until it is gone)",
    group="cloud",
)

# -- a job: its bucket and its course ------------------------------------------------------------
BUCKET = Flag(
    "bucket",
    type=bucket,
    metavar="GS_URL",
    help="gs://BUCKET for the job's code, logs and record (default: none; a job needs one)",
    group="cloud",
)
MAX_RESTARTS = Flag(
    "max-restarts",
    type=count,
    metavar="K",
    help="re-create the job after up to K preemptions (default %(default)s)",
    group="launch",
)
START_TIMEOUT = Flag(
    "start-timeout",
    type=positive(float),
    metavar="S",
    help="fail (and delete the queued resource) when a worker has not started S seconds after "
    "it is ACTIVE (default %(default)g)",
    group="launch",
)
LOG_INTERVAL = Flag(
    "log-interval",
    type=positive(int),
    metavar="S",
    help="seconds between each worker's log uploads to the bucket (default %(default)s)",
    group="output",
)
ENV_WAIT = Flag(
    "env-wait",
    type=positive(float),
    metavar="S",
    help="how long a worker waits for process 0 to put the locked environment in the bucket "
    f"(default {D.env_wait:g})",
    group="environment",
)
JOB: Group = (BUCKET, MAX_RESTARTS, START_TIMEOUT, LOG_INTERVAL, ENV_WAIT)
"""A job's own settings beyond its request (config keys: a profile's jobs go this way)."""
WATCH = Flag("watch", kind="switch", setting=False, help="follow the job at once", group="output")
KEEP = Flag(
    "keep",
    kind="switch",
    setting=False,
    help="keep the queued resource when the job succeeds",
    group="cloud",
)
POLL = Flag(
    "poll",
    type=positive(float),
    metavar="S",
    setting=False,  # "poll" alone would not say whose
    help="seconds between looks at the job (default %(default)g)",
    group="cloud",
)
CONTROL_PLANE_TIMEOUT = Flag(
    "control-plane-timeout",
    type=positive(float),
    metavar="S",
    help="retry failing gcloud calls (5xx, resets, timeouts) for up to S seconds before "
    "giving up (default %(default)g)",
    group="cloud",
)
RESUBMIT = Flag(
    "resubmit",
    kind="switch",
    setting=False,
    help="once, when the queued resource is deleted or vanishes before it is ever ACTIVE (not "
    "a preemption), create a new attempt (default: fail)",
    group="cloud",
)
JOB_HOST = Flag(
    "host",
    metavar="SLICE/WORKER",
    default="0/0",
    setting=False,
    help="this worker's log (default %(default)s)",
    group="hosts",
)
ALL_HOSTS = Flag(
    "all", kind="switch", setting=False, help="every worker's log, prefixed", group="hosts"
)
ATTEMPT = Flag(
    "attempt",
    type=count,
    setting=False,
    help="this attempt's logs (default: the current attempt)",
    group="output",
)
FOLLOW = Flag(
    "follow", kind="switch", setting=False, help="print lines as they arrive", group="output"
)
