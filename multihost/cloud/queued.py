"""Command lines of ``gcloud compute tpus queued-resources``: create, delete, describe, list.

Pure builders: each returns gcloud's arguments (no binary), every value one argument.
"""

from __future__ import annotations

from collections.abc import Mapping

from multihost.cloud import checks

QR = ("compute", "tpus", "queued-resources")
# How capacity is asked for: on-demand is the default (no flag); best-effort exists only in the
# alpha release track (GA refuses --best-effort: exit 2, "unrecognized arguments"). The ones a
# user picks are ``checks.CAPACITIES``; ``guaranteed`` is gcloud's too.
CAPACITIES = (*checks.CAPACITIES, "guaranteed")
ALPHA_ONLY = ("best-effort",)
_DELIMS = (":", ";", "|", "#", "~", "@@")


def where(project: str | None, zone: str | None) -> list[str]:
    """``--project P --zone Z``, each only when given (else gcloud's own default)."""
    return [*(["--project", project] if project else []), *(["--zone", zone] if zone else [])]


def dict_flag(items: Mapping[str, str]) -> str:
    """``k=v,k2=v2`` for one of gcloud's dict flags; when a key or value has a comma, the
    ``^DELIM^`` prefix makes another delimiter split the items, so no value is cut."""
    text = ",".join(f"{k}={v}" for k, v in items.items())
    if not any("," in k or "," in v for k, v in items.items()):
        return text
    delim = next(d for d in _DELIMS if not any(d in k or d in v for k, v in items.items()))
    return f"^{delim}^" + delim.join(f"{k}={v}" for k, v in items.items())


def create_argv(
    name: str,
    *,
    accelerator_type: str,
    runtime_version: str,
    project: str | None = None,
    zone: str | None = None,
    node_id: str | None = None,
    node_count: int = 1,
    node_prefix: str | None = None,
    capacity: str = "on-demand",
    labels: Mapping[str, str] | None = None,
    valid_until: str | None = None,
    metadata: Mapping[str, str] | None = None,
    metadata_files: Mapping[str, str] | None = None,
    run_async: bool = True,
) -> list[str]:
    """``queued-resources create NAME``: one slice (``--node-id``, default NAME) or
    ``node_count`` ≥ 2 slices (``--node-count``, ``--node-prefix``, default NAME);
    ``capacity`` one of :data:`CAPACITIES`; ``labels`` and ``metadata`` as dict flags (commas
    kept inside values); ``metadata_files``: key → a local file whose text is the value
    (``startup-script``); ``valid_until``: a gcloud duration (``15m``), after which the
    service gives up waiting for capacity."""
    if capacity not in CAPACITIES:
        raise ValueError(f"capacity must be one of {', '.join(CAPACITIES)}, not {capacity!r}")
    track = ["alpha"] if capacity in ALPHA_ONLY else []
    argv = [
        *track,
        *QR,
        "create",
        name,
        "--accelerator-type",
        accelerator_type,
        "--runtime-version",
        runtime_version,
    ]
    if node_count > 1:
        argv += ["--node-count", str(node_count), "--node-prefix", node_prefix or name]
    else:
        argv += ["--node-id", node_id or name]
    if capacity != "on-demand":
        argv.append(f"--{capacity}")
    if labels:
        argv += ["--labels", dict_flag(labels)]
    if valid_until:
        argv += ["--valid-until-duration", valid_until]
    if metadata:
        argv += ["--metadata", dict_flag(metadata)]
    if metadata_files:
        argv += ["--metadata-from-file", dict_flag(metadata_files)]
    if run_async:
        argv.append("--async")
    return argv + where(project, zone)


def delete_argv(name: str, project: str | None, zone: str | None) -> list[str]:
    """``queued-resources delete NAME --force --async --quiet``: its nodes go first, no
    prompt, no wait for the operation."""
    return [*QR, "delete", name, "--force", "--async", "--quiet", *where(project, zone)]


def describe_argv(name: str, project: str | None, zone: str | None) -> list[str]:
    """``queued-resources describe NAME --format json``."""
    return [*QR, "describe", name, "--format", "json", *where(project, zone)]


def list_argv(project: str | None, zone: str | None, filter: str | None = None) -> list[str]:
    """``queued-resources list --format json`` (``--filter`` in gcloud's filter syntax, e.g.
    ``labels.multihost-pod=NAME``)."""
    return [
        *QR,
        "list",
        "--format",
        "json",
        *(["--filter", filter] if filter else []),
        *where(project, zone),
    ]
