"""Every setting once: its flag, type, default and help, in the groups the commands share.

A command's parser is built from these groups (``multihost.cli.parser``; the commands on a
pod and a job from ``multihost.settings.cloudcommands``); the config files' keys are the
settings of ``run``, of a pod to make and of a job (:data:`SETTINGS`, checked with each one's
own type by ``multihost.settings.layers``); the API's keywords are their names with
underscores.

A new flag: declare a :class:`Flag` here (a fleet flag in ``multihost.settings.fleetflags``, a
pod's or a job's in ``multihost.settings.cloudflags``)
with its default (or, when other code needs that value too, a field of
``multihost.defaults.DEFAULTS`` under its ``dest``, which the flag reads by that name), and put
it in the group of the commands that take it (or a new group). Then one more place, where it
is read, by its ``dest``: a field of ``RunOptions`` (filled by name), of ``FleetSpec`` or
``ReachSettings`` (the fleet), or of ``planner.Settings`` (the planner works something out of
it). A setting only the API takes is a line of :data:`KEYWORDS`. A flag that a config file may
not set says ``setting=False``. Shown help differs per command? Use ``FLAG.but(help=...)``,
never a second declaration.
"""

from __future__ import annotations

from pathlib import Path

from multihost.defaults import DEFAULTS as D

# a pod's and a job's flags, declared in cloudflags, the fleet's, declared in fleetflags, and
# the flags that are no settings (actionflags), re-exported: the schema stays the one place to
# look
from multihost.settings.actionflags import *  # noqa: F403
from multihost.settings.actionflags import CMD, DETACH, DRY_RUN, PULL, PULL_TO, RUN_NAME
from multihost.settings.cloudflags import *  # noqa: F403
from multihost.settings.cloudflags import (
    CONTROL_PLANE_TIMEOUT,
    JOB,
    POD,
)
from multihost.settings.environment import ENVIRONMENT
from multihost.settings.flag import Flag, Group, OneOf
from multihost.settings.fleetflags import *  # noqa: F403
from multihost.settings.fleetflags import (
    SUBSET,
    fleet,
)
from multihost.settings.types import (
    port,
    positive,
    remote_dir,
    seconds,
    size,
    stage_bucket,
    stage_via,
)

# -- a run: code, env, logs, ports (run and sweep) ---------------------------------------------
SCRIPT_DIR = Flag(
    "script-dir",
    type=Path,
    default=Path("."),
    metavar="DIR",
    help="code to stage on every host (default: the current directory)",
    group="staging",
)
EXCLUDE = Flag(
    "exclude",
    kind="append",
    metavar="PATTERN",
    help="leave out of the staged code (glob; 'dir/' for a directory; repeatable; "
    "default: none beyond .git, __pycache__, *.pyc)",
    group="staging",
)
MAX_STAGE_BYTES = Flag(
    "max-stage-bytes",
    type=size,
    metavar="BYTES",
    help=f"refuse a code dir bigger than this (K/M/G suffixes; default {D.max_stage_bytes >> 30}G)",
    group="staging",
)
ENV = Flag(
    "env",
    kind="append",
    metavar="K=V",
    help="set in every host's environment (repeatable; default: none)",
    group="environment",
)
LOG_DIR = Flag(
    "log-dir",
    type=Path,
    metavar="DIR",
    help="local logs (default $MULTIHOST_LOG_DIR or ~/multihost-logs)",
    group="output",
)
REMOTE_DIR = Flag(
    "remote-dir",
    type=remote_dir,
    metavar="DIR",
    help="staging base on each host; a relative DIR is under the remote home (default %(default)s)",
    group="staging",
)
GRACE = Flag(
    "grace",
    type=positive(float),
    metavar="S",
    help="seconds between TERM and KILL when stopping (default %(default)g s)",
    group="launch",
)
COORDINATOR_PORT = Flag(
    "coordinator-port",
    type=port,
    default=None,  # the planner's: with --local a free port, else DEFAULTS.coordinator_port
    metavar="PORT",
    help=f"JAX coordinator port on host 0 (default {D.coordinator_port}; with --local a free port)",
    group="launch",
)
MEGASCALE_PORT = Flag(
    "megascale-port",
    type=port,
    metavar="PORT",
    help="Megascale port with several slices (default %(default)s)",
    group="launch",
)
KILL_STALE = Flag(
    "kill-stale",
    kind="bool",
    help="stop accelerator device holders before launching (default: warn with --prefix)",
    group="launch",
)
RECORD_ENV = Flag(
    "record-env",
    kind="bool",
    help="keep --env values in run.json (default: their names only; they may be secrets)",
    group="output",
)
HANG_TIMEOUT = Flag(
    "hang-timeout",
    type=positive(float),
    metavar="S",
    help="when no host prints for S seconds: take every host's stacks, name the "
    "stragglers, then stop the run (exit 1) (default: never)",
    group="launch",
)
ON_HANG = Flag(
    "on-hang",
    choices=("stop", "report"),
    default="stop",
    help="after a hang: stop, or only report (default %(default)s)",
    group="launch",
)
TRACE = Flag(
    "trace",
    type=positive(float),
    metavar="N",
    help="once every JAX process has completed its first step: a jax.profiler trace of N "
    "seconds from each, a per-host table after the run (default: none)",
    group="output",
)
TRACE_AFTER = Flag(
    "trace-after",
    type=seconds,
    metavar="S",
    help="with --trace: start S seconds after the last JAX process began its first step (its "
    "first StepTraceAnnotation; a process that annotates none: S s after its first JAX "
    "computation) (default: once every JAX process has completed its first step, "
    "compilation included)",
    group="output",
)
JAX_INIT = Flag(
    "jax-init",
    kind="bool",
    default=True,
    help="join every process's JAX to one job before its first JAX call "
    "(jax.distributed.initialize from the run's coordinator, id and count), as a TPU pod's "
    "runtime does, so a script written for a pod runs unchanged; never on TPU, and a "
    "program's own initialize() still works (default: yes; --no-jax-init leaves it to the "
    "program)",
    group="launch",
)
COMPILE_CACHE = Flag(
    "compile-cache",
    kind="bool",
    default=True,
    help="keep each host's compiled JAX programs in a persistent cache, REMOTE_DIR/compile-cache "
    "(per user, across runs, one folder per jax/jaxlib/libtpu version and platform), so a "
    "run compiles only what an earlier one did not; a JAX_COMPILATION_CACHE_DIR of yours wins "
    "(default: yes; --no-compile-cache: jax's own default, no cache)",
    group="launch",
)
COMPILE_CACHE_MAX = Flag(
    "compile-cache-max",
    type=size,
    metavar="BYTES",
    help="each host's compile cache at most this big: the least recently used entries go as "
    f"a JAX process starts (K/M/G suffixes; default {D.compile_cache_max >> 30}G)",
    group="launch",
)
RUN: Group = (
    SCRIPT_DIR,
    EXCLUDE,
    MAX_STAGE_BYTES,
    ENV,
    LOG_DIR,
    REMOTE_DIR,
    GRACE,
    COORDINATOR_PORT,
    MEGASCALE_PORT,
    KILL_STALE,
    RECORD_ENV,
    HANG_TIMEOUT,
    ON_HANG,
    TRACE,
    TRACE_AFTER,
    JAX_INIT,
    COMPILE_CACHE,
    COMPILE_CACHE_MAX,
    *ENVIRONMENT,
)

# -- what `run` has beyond `sweep` -----------------------------------------------------------
STREAM = Flag(
    "stream",
    choices=("host0", "all", "none"),
    default="host0",
    help="host output on the terminal (default %(default)s)",
    group="output",
)
FAIL_FAST = Flag(
    "fail-fast",
    kind="bool",
    default=True,
    help="stop the other hosts when one fails (default: yes; --no-fail-fast keeps them running)",
    group="launch",
)
TIMEOUT = Flag(
    "timeout",
    type=positive(float),
    metavar="S",
    help="bound the whole run, in seconds (default: none)",
    group="launch",
)
RECONNECT_TIMEOUT = Flag(
    "reconnect-timeout",
    type=positive(float),
    metavar="S",
    help="seconds to retry a lost host (default %(default)g s)",
    group="connection",
)
STAGE_VIA = Flag(
    "stage-via",
    type=stage_via,
    metavar="HOW",
    help="how the code reaches the hosts: auto (direct or peer, by hosts × archive "
    "size), direct (from here to each), peer (once per slice to a seed host, the others "
    "fetch it from there) or gs://BUCKET[/PREFIX] (uploaded once, the hosts pull it); "
    "default %(default)s",
    group="staging",
)
STAGE_BUCKET = Flag(
    "stage-bucket",
    type=stage_bucket,
    metavar="GS_URL",
    help="a bucket (gs://BUCKET[/PREFIX]) that --stage-via auto uses for an archive over "
    "its threshold, instead of peer staging (default: none)",
    group="staging",
)
PYTHON = Flag(
    "python",
    metavar="EXE",
    help="interpreter for --payload (default: python3; with --local this Python)",
    group="launch",
)
SECRET = Flag(
    "secret",
    kind="append",
    metavar="KEY=NAME",
    setting=False,
    help="set KEY in every host's job to Secret Manager secret NAME's latest version, read "
    "once here and handed to the hosts on the launch channel: never on a disk, never in run.json "
    "(repeatable; default: none; --env values are not secret)",
    group="environment",
)
RUN_ONLY: Group = (
    STREAM,
    FAIL_FAST,
    TIMEOUT,
    RECONNECT_TIMEOUT,
    STAGE_VIA,
    STAGE_BUCKET,
    PYTHON,
    SECRET,
)


def flags_of(group: Group) -> tuple[Flag, ...]:
    return tuple(f for item in group for f in (item.flags if isinstance(item, OneOf) else (item,)))


CONFIGURABLE: Group = (  # `multihost config`'s flags
    *fleet(required=False),
    *RUN,
    *RUN_ONLY,
    *POD,
    *JOB,
    CONTROL_PLANE_TIMEOUT,
)
SETTINGS: dict[str, Flag] = {f.name: f for f in flags_of(CONFIGURABLE) if f.setting}
"""The config files' keys, in the order `multihost config` shows them: a run's, a pod's (what
``up`` and ``run --up`` make), a job's (what ``job submit`` makes)."""

RUN_COMMAND: Group = (
    *fleet(),
    *SUBSET,
    CMD,
    *RUN,
    RUN_NAME,
    *RUN_ONLY,
    DRY_RUN,
    DETACH,
    PULL,
    PULL_TO,
)
"""Every flag of ``run`` declared here (its parser adds ``--payload`` and a pod's): what a run
is planned from (``multihost.planner``); their dests are the API's keywords too."""

KEYWORDS: dict[str, str] = {
    "jax_job": "the command is a JAX job that needs every process: what it is (no --workers)",
    "ssh": "an SSHOptions to start from (default: by the fleet)",
    "progress": "a function told how a --wait goes, in words",
    "stage_timeout": f"seconds to stage code on one host (default {D.stage_timeout:g})",
    "launch_timeout": f"seconds to start the job on one host (default {D.launch_timeout:g})",
    "lock_dir": "the project the staged uv.lock was copied from (call)",
    "stale": "off, warn or kill: accelerator holders (default: by kill_stale and the fleet)",
    "device_glob": "which device files count as held accelerators (default: by the host)",
}
"""The settings only the API takes (no flag: the CLI has no use for them), and what each is."""
