"""``--secret KEY=NAME``: a Secret Manager secret given to the job's environment as KEY.

Only names are ever recorded. ``job submit`` leaves the reading to each host at start;
``run`` reads each value once here (``read_value``) and hands it to the hosts' wrappers on
their stdin with the start word (``remote.WRAPPER``), so no disk holds it on either side.
"""

from __future__ import annotations

import re

from multihost.cloud import gcloud
from multihost.cloud.secretmanager import access_argv
from multihost.errors import CloudTimeout, GcloudMissing, MultihostError, UsageError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def parse_secrets(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``KEY=NAME`` strings → pairs; a bad KEY or NAME, or a KEY twice, is a usage error."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, name = item.partition("=")
        if not sep or not _KEY.match(key) or not _NAME.match(name):
            raise UsageError(
                f"--secret expects KEY=NAME (KEY a shell identifier, NAME a Secret Manager "
                f"secret id: letters, digits, '-', '_'), got {item!r}"
            )
        if key in pairs:
            raise UsageError(f"--secret {key} is given twice")
        pairs[key] = name
    return tuple(pairs.items())


def read_value(name: str, project: str | None = None, timeout: float = 60.0) -> str:
    """The secret's latest version, read once through gcloud into memory (a pipe, no file).
    Trailing newlines are dropped, as the hosts' ``$(...)`` does; a NUL or an inner newline
    cannot travel on the wrapper's line and is refused."""
    binary = gcloud.binary()
    try:
        proc = gcloud.run(access_argv(name, project), gcloud=binary, timeout=timeout)
    except GcloudMissing:
        raise UsageError(f"--secret needs the Google Cloud CLI ({binary!r} not found)") from None
    except CloudTimeout:
        raise MultihostError(f"reading secret {name!r} took over {timeout:g}s") from None
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise MultihostError(
            f"cannot read secret {name!r} from Secret Manager: "
            f"{lines[-1] if lines else 'gcloud exit ' + str(proc.returncode)}"
        )
    value = proc.stdout.decode(errors="replace").rstrip("\n")
    if "\0" in value or "\n" in value or "\r" in value:
        raise UsageError(f"secret {name!r} has a NUL or a newline inside: run --secret refuses it")
    return value
