"""How the code goes (``--stage-via``): the choice, before anything is sent.

:func:`parse` reads ``auto``, ``direct``, ``peer`` or ``gs://BUCKET[/PREFIX]``; :func:`choose`
(the code, per slice) and :func:`choose_environment` (an environment's pack, from the host that
has it) turn ``auto`` into ``direct``, ``peer`` or the ``--stage-bucket``, and say why. The
staging itself is ``multihost.staging.via`` (which re-exports these names).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from multihost.errors import UsageError
from multihost.model import Host

_PREFIX = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
# auto: peer staging once (hosts in multi-host slices) × archive bytes exceeds this. Measured
# (benchmarks/stage_auto.py, RESULTS.md "stage-auto"): peer stops being slower at about 256 MB.
AUTO_THRESHOLD = 256 * 2**20
THRESHOLD_ENV = "MULTIHOST_STAGE_AUTO_THRESHOLD"  # bytes; overrides AUTO_THRESHOLD


@dataclass(frozen=True)
class StageVia:
    """How the code reaches the hosts: ``direct``, ``peer``, or a bucket ``url``."""

    kind: Literal["auto", "direct", "peer", "gs"]
    url: str = ""  # gs://BUCKET[/PREFIX], for "gs"

    def __str__(self) -> str:
        return self.url or self.kind


def parse(text: str) -> StageVia:
    """``auto``, ``direct``, ``peer`` or ``gs://BUCKET[/PREFIX]``; else a usage error."""
    if text in ("auto", "direct", "peer"):
        return StageVia(text)  # type: ignore[arg-type]
    if text.startswith("gs://"):
        bucket, _, prefix = text.removeprefix("gs://").rstrip("/").partition("/")
        if not bucket:
            raise UsageError(f"bad --stage-via {text!r}: expected gs://BUCKET[/PREFIX]")
        from multihost.cloud.bucket import check_bucket  # a bucket named: the cloud modules

        check_bucket(f"gs://{bucket}")
        if prefix and (not _PREFIX.match(prefix) or ".." in prefix.split("/")):
            raise UsageError(f"bad --stage-via {text!r}: the path after the bucket has odd names")
        return StageVia("gs", f"gs://{bucket}" + (f"/{prefix}" if prefix else ""))
    raise UsageError(
        f"bad --stage-via {text!r}: expected auto, direct, peer or gs://BUCKET[/PREFIX]"
    )


def auto_threshold() -> int:
    """The hosts × archive bytes above which ``auto`` stages through peers."""
    text = os.environ.get(THRESHOLD_ENV, "")
    return int(text) if text.isdigit() else AUTO_THRESHOLD


def _mib(n: float) -> str:
    """MiB, one decimal; an amount that would show as 0.0 MiB in KiB or bytes."""
    if n >= 2**20 / 10 or n == 0:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n:.0f} B"


def choose(
    requested: StageVia,
    hosts: Sequence[Host],
    archive_bytes: int,
    *,
    threshold: int,
    seed_addresses: Mapping[int, str] | None = None,
    bucket: str = "",
) -> tuple[StageVia, str]:
    """The way the code goes, and why (``""`` when it was asked for, not chosen).

    ``auto``: ``peer`` when the hosts of multi-host slices × the archive exceed ``threshold``
    (a one-host slice has nothing to gain), else ``direct``. ``seed_addresses`` (each slice's
    seed's process id → the address it would bind; ``None``: not known yet) must all be
    private or loopback IPs, else ``direct``: a seed never serves on a public address.
    """
    if requested.kind != "auto":
        return requested, ""
    slices: dict[int, list[Host]] = {}
    for h in hosts:
        slices.setdefault(h.slice_id, []).append(h)
    n = sum(len(m) for m in slices.values() if len(m) > 1)
    seeds = None
    if seed_addresses is not None:
        seeds = {
            m[0].name: seed_addresses.get(m[0].process_id, "")
            for m in slices.values()
            if len(m) > 1
        }
    if bucket and len(hosts) * archive_bytes > threshold:  # uploaded once, whatever the slices
        return _bucket(bucket, len(hosts), archive_bytes, threshold)
    return _auto(n, archive_bytes, threshold, seeds)


def choose_environment(
    requested: StageVia,
    receivers: int,
    pack_bytes: int,
    *,
    threshold: int,
    source: Host,
    address: str,
    bucket: str = "",
) -> tuple[StageVia, str]:
    """How an environment's pack goes from the host that has it (``source``, which would serve
    on ``address``) to ``receivers`` other hosts: as :func:`choose`, one group of hosts."""
    if requested.kind != "auto":
        return requested, ""
    n = receivers + 1
    if bucket and n * pack_bytes > threshold:
        return _bucket(bucket, n, pack_bytes, threshold)
    return _auto(n, pack_bytes, threshold, {source.name: address})


def _bucket(bucket: str, n: int, size: int, threshold: int) -> tuple[StageVia, str]:
    load = f"{n} hosts × {_mib(size)}"
    return parse(bucket), f"auto: {load} over the {_mib(threshold)} threshold, --stage-bucket"


def _auto(
    n: int, size: int, threshold: int, seeds: Mapping[str, str] | None
) -> tuple[StageVia, str]:
    """``peer`` when ``n`` hosts × ``size`` bytes exceed ``threshold`` and every seed (name →
    the address it would bind; ``None``: not known yet) has a private address; else direct."""
    if n == 0:  # every slice has one host: there is no peer to fetch from
        return StageVia("direct"), "auto: no slice has a second host to share it"
    load = f"{n} hosts × {_mib(size)}"
    if n * size <= threshold:
        return StageVia("direct"), f"auto: {load} under the {_mib(threshold)} threshold"
    for name, addr in (seeds or {}).items():
        if not private_address(addr):
            why = f"seed {name}'s internal address {addr or '?'} is not private"
            return StageVia("direct"), f"auto: {load} over the threshold, but {why}"
    return StageVia("peer"), f"auto: {load} over the {_mib(threshold)} threshold"


def private_address(addr: str) -> bool:
    """Whether a seed may serve on ``addr``: a private or loopback IP. A hostname (not an IP)
    counts as unknown (no), and so does shared address space (100.64.0.0/10: a carrier's,
    not the slice's own network)."""
    try:
        ip = ipaddress.ip_address(addr.strip("[]"))
    except ValueError:
        return False
    return ip.is_private or ip.is_loopback
