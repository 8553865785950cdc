"""A job's startup script, rendered: the values one attempt's workers are told, and ``render``.

The script's body is the constant template in multihost.job.startup_template (what each
worker does, the locked environment included); ``render`` puts the values in front of it as one
block of quoted assignments. The exit codes below are the ones that body reports.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from multihost.commands import hook_text
from multihost.defaults import DEFAULTS
from multihost.job.startup_template import TEMPLATE, VALUES_MARK
from multihost.remote.envsync import BUILD, INSTALL, UPLOAD
from multihost.remote.staging import python_source

FETCH_FAILED = 125  # exit code a worker reports when it could not get the code
SECRET_FAILED = 123  # ... when it could not read a --secret from Secret Manager
WORK_DIR_REFUSED = 122  # ... when its work directory is not its own and private
ENV_FAILED = 121  # ... when it could not get (or, process 0, build) the locked environment


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
    log_interval: int = 10
    fetch_tries: int = 5
    coordinator_port: int = 8476
    megascale_port: int = 8081
    environment: EnvValues | None = None


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
    """The script for one attempt: the template with its values block filled in."""
    assigns = {
        "job": values.job,
        "attempt": str(values.attempt),
        "bucket": values.bucket,
        "code_hash": values.code_hash,
        "command": values.command,
        "user_env": user_env_text(values.env),
        "secrets": " ".join(f"{k}={n}" for k, n in values.secrets),
        "project": values.project or "",
        "log_interval": str(values.log_interval),
        "fetch_tries": str(values.fetch_tries),
        "coordinator_port": str(values.coordinator_port),
        "megascale_port": str(values.megascale_port),
    }
    e = values.environment or EnvValues("")
    assigns |= {
        "env_lock": e.lock,
        "env_select": e.select,
        "env_requirements": e.requirements,
        "env_requirements_bytes": str(len(e.requirements.encode())),
        "env_wait": str(int(e.wait)),
        "env_poll": str(e.poll),
        "uv_url": e.uv_url,
        "uv_sha256": e.uv_sha256,
        "uv_version": e.uv_version,
    }
    # a requirements file is text, not code: a '$' in it is meant literally
    block = "".join(
        ("# shellcheck disable=SC2016\n" if k == "env_requirements" else "")
        + f"{k}={shlex.quote(v)}\n"
        for k, v in assigns.items()
    )
    # the hook, the probe and the run path's templates are code, quoted whole: '$' and
    # backquotes in them are meant literally
    code = {"hook": hook_text()}
    if e.lock:
        code |= {
            "env_probe": python_source("env_probe"),
            "env_build": BUILD.text,
            "env_install": INSTALL.text,
            "env_upload": UPLOAD.text,
        }
    else:
        code |= dict.fromkeys(("env_probe", "env_build", "env_install", "env_upload"), "")
    block += "".join(
        f"# shellcheck disable=SC2016\n{k}={shlex.quote(v)}\n" for k, v in code.items()
    )
    return TEMPLATE.replace(VALUES_MARK, block, 1)
