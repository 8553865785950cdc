"""Every default and timeout, once: the CLI, the Python API and run.json all read them here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Defaults:
    """Defaults of the knobs a user can set (each has a flag), and the pipeline's own bounds."""

    # Where and how a job runs.
    remote_dir: str = "~/.multihost"
    coordinator_port: int = 8476  # jax's own default (jax/_src/clusters/cloud_tpu_cluster.py)
    megascale_port: int = 8081  # Ray and Levanter use 8081
    # Connecting.
    connect_timeout: float = 20.0  # one SSH handshake, s
    connect_limit: int = 64  # handshakes in flight at once
    keepalive_interval: float = 5.0  # s between SSH keepalives
    keepalive_count_max: int = 2  # asyncssh drops the connection at the (max+1)th silent tick: 15 s
    quick_auth: bool = True  # public-key auth in one round trip (--no-quick-auth: asyncssh's 4)
    # Running.
    grace: float = 10.0  # s between TERM and KILL when stopping a job
    control_plane_timeout: float = 300.0  # s a job watch retries a failing control plane
    reconnect_timeout: float = 300.0  # s a lost host is retried before it is "lost"
    max_stage_bytes: int = 1 << 30  # the code dir's size limit (--max-stage-bytes)
    compile_cache_max: int = 4 << 30  # bytes of each host's compile cache (oldest out)
    stage_timeout: float = 600.0  # s to stage code on one host
    host_uv: str = "auto"  # a builder without uv: auto (the runner's when it fits), fetch
    uv_version: str = "0.13.9"  # the uv a builder fetches when the runner has none
    stage_via: str = "auto"  # auto, direct, peer (a seed per slice), gs://BUCKET (--stage-via)
    stage_bucket: str = ""  # gs://BUCKET[/PREFIX] auto may use for a big archive (none: never)
    launch_timeout: float = 60.0  # s to start the job on one host
    stale_timeout: float = 60.0  # s to check one host for stale accelerator holders
    stale_grace: float = 5.0  # s between TERM and KILL for a stale accelerator holder
    gather_lines: int = 2000  # last lines of each host's log that logs --gather compares
    gather_window: float = 2.0  # run --gather: s a line waits for the other hosts' same line
    top_interval: float = 2.0  # s between multihost top's looks at every host
    trace_seconds: float = 5.0  # how long `multihost trace` and `run --trace` trace by default
    trace_after: float | None = None  # run --trace: None, once every JAX process completed its
    # first step; S: S s after each began its first (or, annotating none, its first computation)
    trace_max: float = 3600.0  # the longest capture (trace --seconds, run --trace)
    pull_limit: int = 16  # hosts copying files back at once (multihost pull --limit)
    pull_files: int = 8  # files in flight at once on one host's connection
    # A pod's or a job's request (up, run --up, job submit) and a job's course.
    num_slices: int = 1  # slices of --tpu-type in one request
    capacity: str = "on-demand"  # on-demand, spot, reserved, best-effort
    queue_timeout: float = 900.0  # s a pod's request waits for capacity in one zone (up)
    max_restarts: int = 0  # new attempts a job makes after preemptions
    log_interval: int = 10  # s between a job worker's log uploads to the bucket
    notice_wait: float = 35.0  # s a watch leaves a SUSPENDING (preempted) resource its notice
    start_timeout: float = 600.0  # s a job's workers have to report once it is ACTIVE
    poll: float = 5.0  # s between a job watch's (or logs --follow's) looks
    gcloud_timeout: float = 120.0  # s one gcloud call may take ($MULTIHOST_GCLOUD_TIMEOUT)
    wait_poll: float = 5.0  # s between gcloud polls while --wait waits ($MULTIHOST_WAIT_POLL)
    env_wait: float = 1800.0  # s a job's host waits for process 0's environment (--env-wait)
    env_poll: int = 5  # s between its looks in the bucket (one gcloud call each)
    key_wait: float = 50.0  # s a key just added may take to be accepted ($MULTIHOST_KEY_WAIT)
    sandbox_hosts: int = 8  # loopback hosts of `multihost sandbox up` (--hosts)
    # The supervisor's own bounds (not flags).
    connect_slack: float = 10.0  # beyond connect_timeout, for a whole connect step
    command_timeout: float = 120.0  # one command on every host (status, check, kill-stale)
    status_slack: float = 30.0  # beyond connect_timeout, to read every host's state files
    stop_slack: float = 20.0  # beyond grace, for a stop to be confirmed
    last_report: float = 10.0  # after stopping, s hosts get to report their exit
    reconnect_first_delay: float = 0.5  # s, doubling up to reconnect_max_delay
    reconnect_max_delay: float = 10.0
    run_name_max: int = 100  # characters in a run name
    local_max: int = 1024  # --local workers, each a process on this machine (more: refused)
    manifest_interval: float = 0.5  # s between run.json rewrites (final states always write)
    # multihost top's verdicts (not flags): a host is stuck after no step for top_stuck_steps
    # of its median step times (and at least top_stuck_min s: the hook writes once a second);
    # slow when its own time per step is over the others' by top_slow_share of the fleet's
    # median step time (and at least top_slow_min s)
    top_stuck_steps: float = 5.0
    top_stuck_min: float = 5.0
    top_slow_share: float = 0.2
    top_slow_min: float = 0.005
    top_rows: int = 64  # beyond this many hosts, top shows slices and outliers, not every row
    gather_pending: int = 10_000  # run --gather: lines held back at most (then the oldest go)
    plot_bins: int = 500  # multihost plot: columns of steps at most (each a bin of steps)
    warm_start_timeout: float = 600.0  # s for warm processes to start and join their JAX job


DEFAULTS = Defaults()
IP_MODES: tuple[str, ...] = ("internal", "external", "auto")  # what --prefix connects to
GOOGLE_KEY = "~/.ssh/google_compute_engine"  # gcloud's key: what a --prefix fleet's VMs take


def given_fields(record: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``values`` named as fields of the dataclass ``record``: what a settings record is
    made from by name. None is "not given": the field keeps the record's own default."""
    names = {f.name for f in fields(record)}
    return {k: v for k, v in values.items() if k in names and v is not None}
