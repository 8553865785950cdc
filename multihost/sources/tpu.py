"""Hosts from gcloud: one `tpu-vm list` call, strict PREFIX / PREFIX-<n> matching, validation."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from multihost.cloud import gcloud as runner
from multihost.cloud import tpus
from multihost.defaults import IP_MODES
from multihost.errors import CloudError, CloudTimeout, DiscoveryError, GcloudMissing
from multihost.model import Fleet, Host

Node = Mapping[str, Any]
INTERNAL_ONLY = (  # what a worker with no external address is told when it cannot be reached
    "the worker has only an internal address: reach it with --tunnel-through-iap, "
    "or run multihost from a machine in its VPC network (--ip internal)"
)


@dataclass(frozen=True)
class Discovery:
    """What discovery found: the fleet, warnings to show, and where it came from."""

    fleet: Fleet
    warnings: tuple[str, ...] = ()
    project: str | None = None
    zone: str | None = None
    slice_names: tuple[str, ...] = ()
    queued_resource: str | None = None
    command: tuple[str, ...] = ()
    nodes: tuple[Node, ...] = ()  # the slices' nodes as listed (their metadata: keys, host keys)


def node_name(node: Node) -> str:
    """The short name of a node: the last segment of `projects/P/locations/Z/nodes/NAME`."""
    return str(node.get("name", "")).rsplit("/", 1)[-1]


def _segment(path: object, key: str) -> str | None:
    """The value after `key/` in a resource path such as `projects/P/locations/Z/...`."""
    parts = str(path or "").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == key:
            return parts[i + 1]
    return None


def gcloud_command(
    *, project: str | None = None, zone: str | None = None, gcloud: str | None = None
) -> list[str]:
    """The one gcloud command discovery runs (the binary first: it is shown as run)."""
    return [gcloud or runner.binary(), *tpus.list_argv(project, zone)]


def stderr_message(stderr: str | bytes) -> str:
    """gcloud's own error, on one line: from its `ERROR:` line on, else its last lines."""
    return runner.one_line(stderr, tail=3, limit=400, empty="(no message on stderr)")


def list_nodes(
    *,
    project: str | None = None,
    zone: str | None = None,
    gcloud: str | None = None,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """Run `gcloud compute tpus tpu-vm list --format=json` once and return its Node objects."""
    binary = gcloud or runner.binary()
    shown = shlex.join(gcloud_command(project=project, zone=zone, gcloud=binary))
    try:
        proc = runner.run(tpus.list_argv(project, zone), gcloud=binary, timeout=timeout)
    except GcloudMissing:
        raise DiscoveryError(f"{binary!r} not found: install the Google Cloud CLI") from None
    except CloudTimeout:
        raise DiscoveryError(f"gcloud took more than {timeout:g}s: {shown}") from None
    except CloudError as exc:
        raise DiscoveryError(str(exc)) from None
    if proc.returncode != 0:
        message = stderr_message(proc.stderr)
        raise DiscoveryError(f"gcloud failed (exit {proc.returncode}): {message} [ran: {shown}]")
    try:
        nodes = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise DiscoveryError(
            f"cannot parse the JSON gcloud printed ({exc}) [ran: {shown}]"
        ) from None
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise DiscoveryError(f"gcloud printed JSON that is not a list of TPU nodes [ran: {shown}]")
    return nodes


def select_slices(nodes: Sequence[Node], prefix: str, *, where: str = "") -> list[Node]:
    """The nodes that form PREFIX's slices, in slice order; raise when none or numbering is off."""
    names = [node_name(n) for n in nodes]
    exact = [n for n in nodes if node_name(n) == prefix]
    if len(exact) > 1:
        raise DiscoveryError(f"{len(exact)} TPU nodes are named {prefix!r}: {_paths(exact)}")
    if exact:
        return exact
    pattern = re.compile(re.escape(prefix) + r"-([0-9]+)")
    numbered: dict[int, list[Node]] = {}
    for node in nodes:
        match = pattern.fullmatch(node_name(node))
        if match:
            numbered.setdefault(int(match[1]), []).append(node)
    if not numbered:
        seen = ", ".join(sorted(names)[:30]) if names else "none"
        seen += f" and {len(names) - 30} more" if len(names) > 30 else ""
        raise DiscoveryError(
            f"no TPU node is named {prefix!r} or {prefix + '-<n>'!r}{where} (nodes seen: {seen})"
        )
    found = ", ".join(node_name(n) for k in sorted(numbered) for n in numbered[k])
    dupes = [k for k, group in numbered.items() if len(group) > 1]
    if dupes:
        raise DiscoveryError(f"slice numbers of {prefix!r} repeat {dupes} (found: {found})")
    missing = [f"{prefix}-{k}" for k in range(max(numbered) + 1) if k not in numbered]
    if missing:
        raise DiscoveryError(
            f"slices of {prefix!r} must be numbered 0..S-1: found {found}; "
            f"missing {', '.join(missing)}"
        )
    return [numbered[k][0] for k in range(len(numbered))]


def _paths(nodes: Sequence[Node]) -> str:
    return ", ".join(str(n.get("name", "?")) for n in nodes)


def _endpoints(node: Node) -> list[Mapping[str, Any]]:
    return [e for e in node.get("networkEndpoints") or [] if isinstance(e, Mapping)]


def check_slices(slices: Sequence[Node]) -> tuple[str, ...]:
    """Raise unless every slice is READY, alike in type and worker count; warn on bad health."""
    states = [(node_name(n), str(n.get("state", "STATE_UNSPECIFIED"))) for n in slices]
    if any(state != "READY" for _, state in states):
        shown = ", ".join(f"{name} {state}" for name, state in states)
        raise DiscoveryError(f"every slice must be READY: {shown}")
    types = [(node_name(n), str(n.get("acceleratorType", "?"))) for n in slices]
    if len({t for _, t in types}) > 1:
        shown = ", ".join(f"{name} {t}" for name, t in types)
        raise DiscoveryError(f"slices differ in accelerator type: {shown}")
    counts = [(node_name(n), len(_endpoints(n))) for n in slices]
    if len({c for _, c in counts}) > 1:
        shown = ", ".join(f"{name} {c}" for name, c in counts)
        raise DiscoveryError(f"slices differ in worker count: {shown}")
    empty = [name for name, c in counts if c == 0]
    if empty:
        raise DiscoveryError(f"no network endpoints (workers) listed for {', '.join(empty)}")
    warnings = []
    for node in slices:
        health = node.get("health")
        if health is not None and health != "HEALTHY":
            detail = node.get("healthDescription")
            warnings.append(
                f"{node_name(node)} health is {health}" + (f": {detail}" if detail else "")
            )
    return tuple(warnings)


def build_fleet(slices: Sequence[Node], ip: str = "auto") -> Fleet:
    """One Host per network endpoint, slice-major; `address` per ip mode, internal kept."""
    if ip not in IP_MODES:
        raise DiscoveryError(f"ip mode must be one of {', '.join(IP_MODES)}, not {ip!r}")
    hosts: list[list[Host]] = []
    for node in slices:
        workers = []
        for worker, endpoint in enumerate(_endpoints(node)):
            internal = endpoint.get("ipAddress")
            if not internal:
                raise DiscoveryError(f"{node_name(node)} worker {worker} has no ipAddress")
            access = endpoint.get("accessConfig") or {}
            external = access.get("externalIp") if isinstance(access, Mapping) else None
            if ip == "external" and not external:
                raise DiscoveryError(
                    f"{node_name(node)} worker {worker} has no external IP "
                    f"(ip mode 'external'; use 'internal' or 'auto')"
                )
            address = str(external) if external and ip != "internal" else str(internal)
            workers.append(
                Host(
                    address=address,
                    internal_address=str(internal),
                    accelerator_type=node.get("acceleratorType"),
                    cloud_state=node.get("state"),
                    reach_hint=None if external else INTERNAL_ONLY,
                )
            )
        hosts.append(workers)
    return Fleet.from_slices(hosts)


def discover_from_nodes(
    nodes: Sequence[Node],
    prefix: str,
    *,
    ip: str = "auto",
    project: str | None = None,
    zone: str | None = None,
) -> Discovery:
    """Select, validate and number PREFIX's slices out of already-listed nodes."""
    if not prefix:
        raise DiscoveryError("the TPU name prefix is empty")
    where = f" in project {project or '(gcloud default)'}, zone {zone or '(gcloud default)'}"
    slices = select_slices(nodes, prefix, where=where)
    warnings = check_slices(slices)
    if len(slices) == 1 and node_name(slices[0]) == prefix:
        extra = [
            node_name(n)
            for n in nodes
            if re.fullmatch(re.escape(prefix) + r"-[0-9]+", node_name(n))
        ]
        if extra:
            warnings += (f"using the node named {prefix!r}; ignoring {', '.join(sorted(extra))}",)
    first = slices[0].get("name")
    return Discovery(
        fleet=build_fleet(slices, ip),
        warnings=warnings,
        project=project or _segment(first, "projects"),
        zone=zone or _segment(first, "locations"),
        slice_names=tuple(node_name(n) for n in slices),
        queued_resource=_segment(slices[0].get("queuedResource"), "queuedResources"),
        nodes=tuple(slices),
    )


def discover(
    prefix: str,
    *,
    project: str | None = None,
    zone: str | None = None,
    ip: str = "auto",
    gcloud: str | None = None,
    timeout: float = 60,
) -> Discovery:
    """Hosts of the TPU slices named PREFIX or PREFIX-0..S-1, from one gcloud call."""
    if ip not in IP_MODES:
        raise DiscoveryError(f"ip mode must be one of {', '.join(IP_MODES)}, not {ip!r}")
    nodes = list_nodes(project=project, zone=zone, gcloud=gcloud, timeout=timeout)
    try:
        found = discover_from_nodes(nodes, prefix, ip=ip, project=project, zone=zone)
    except DiscoveryError:  # a queued resource still on its way says so itself
        from multihost.sources.queued import not_ready

        if (why := not_ready(nodes, prefix, project, zone, gcloud, timeout)) is not None:
            raise why from None
        raise
    return replace(found, command=tuple(gcloud_command(project=project, zone=zone, gcloud=gcloud)))


def fleet_rows(fleet: Fleet) -> list[dict[str, str | int | None]]:
    """Plain rows for `multihost hosts`: one per host, slice-major."""
    return [
        {
            "slice": h.slice_id,
            "worker": h.worker_id,
            "process": h.process_id,
            "address": h.address,
            "internal_address": h.internal_address,
            "accelerator_type": h.accelerator_type,
            "state": h.cloud_state,
        }
        for h in fleet
    ]
