"""A job's startup script, rendered: the values one attempt's workers are told, and ``render``.

The script is the file ``multihost/remote/job_startup.sh`` (what each worker does, the locked
environment included; its header says its arguments); ``render`` sends its values as its
arguments, each quoted once, the way every script multihost runs on a host gets its values
(:func:`multihost.remote.script`). The exit codes below are the ones that script reports.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from multihost.defaults import DEFAULTS
from multihost.remote import load, script
from multihost.remote.commands import hook_text
from multihost.remote.envsync import BUILD, INSTALL, UPLOAD
from multihost.remote.staging import python_source

FETCH_FAILED = 125  # exit code a worker reports when it could not get the code
SECRET_FAILED = 123  # ... when it could not read a --secret from Secret Manager
WORK_DIR_REFUSED = 122  # ... when its work directory is not its own and private
ENV_FAILED = 121  # ... when it could not get (or, process 0, build) the locked environment

STARTUP = load("job_startup")
# the first lines of the metadata's script; the values come next, then the body. The values are
# text, not code: a '$' or a backquote in one (a requirements file, the hook, the run path's
# scripts) is meant literally, so shellcheck's warning about single quotes does not apply
HEAD = (
    "#!/bin/sh\n"
    "# multihost job startup script (rendered by multihost; values first, body fixed)\n"
    "# shellcheck disable=SC2016\n"
)


@dataclass(frozen=True)
class StartupValues:
    """Everything one attempt's startup script is told; the same on every worker."""

    job: str
    attempt: int
    bucket: str
    code_hash: str
    command: str
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()  # (KEY, secret NAME): names, never values
    project: str | None = None
    log_interval: int = DEFAULTS.log_interval
    fetch_tries: int = 5
    coordinator_port: int = DEFAULTS.coordinator_port
    megascale_port: int = DEFAULTS.megascale_port
    environment: EnvValues | None = None
    compile_cache_url: str = ""  # the job's compile caches in the bucket ("": none)
    compile_cache_max: int = 0  # each worker's cap, bytes


@dataclass(frozen=True)
class EnvValues:
    """The locked environment a job's workers get (see the module's docstring)."""

    lock: str  # the hash of the lock and the selection (or of the requirements)
    select: str = ""  # uv's selection flags, words
    requirements: str = ""  # a requirements file's content ("": from uv.lock)
    wait: float = DEFAULTS.env_wait
    poll: int = DEFAULTS.env_poll
    uv_url: str = ""
    uv_sha256: str = ""
    uv_version: str = ""


def user_env_text(env: Mapping[str, str] | tuple[tuple[str, str], ...]) -> str:
    """``--env`` as shell text the script evals last (so it wins, as with ``run``)."""
    items = env.items() if isinstance(env, Mapping) else env
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in items)


def render(values: StartupValues) -> str:
    """The script for one attempt: its values as its arguments, then its text."""
    e = values.environment or EnvValues("")
    # the run path's scripts, run by this one as given; none without a locked environment
    run_path = (python_source("env_probe"), BUILD.text, INSTALL.text, UPLOAD.text)
    probe, build, install, upload = run_path if e.lock else ("", "", "", "")
    return HEAD + script(
        STARTUP,
        job=values.job,
        attempt=values.attempt,
        bucket=values.bucket,
        code_hash=values.code_hash,
        command=values.command,
        user_env=user_env_text(values.env),
        secrets=" ".join(f"{k}={n}" for k, n in values.secrets),
        project=values.project or "",
        log_interval=values.log_interval,
        fetch_tries=values.fetch_tries,
        coordinator_port=values.coordinator_port,
        megascale_port=values.megascale_port,
        env_lock=e.lock,
        env_select=e.select,
        env_requirements=e.requirements,
        env_requirements_bytes=len(e.requirements.encode()),
        env_wait=int(e.wait),
        env_poll=e.poll,
        uv_url=e.uv_url,
        uv_sha256=e.uv_sha256,
        uv_version=e.uv_version,
        hook=hook_text(),
        env_probe=probe,
        env_build=build,
        env_install=install,
        env_upload=upload,
        cache_url=values.compile_cache_url,
        cache_max=values.compile_cache_max,
    )
