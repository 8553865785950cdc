"""The price table shipped with the package (``prices.csv``: its source and date are written at
its top) and what a pod costs: per hour, and so far. An unknown price is None, never 0."""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Price:
    """US dollars per hour for one whole slice; None where the table has no price."""

    on_demand: float | None
    spot: float | None


def _value(text: str) -> float | None:
    text = text.strip()
    return None if text in ("", UNKNOWN) else float(text)


def parse(text: str) -> dict[tuple[str, str], Price]:
    """``prices.csv``: comment lines (``#``), a header, then ``type,region,on_demand,spot``."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    table: dict[tuple[str, str], Price] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        key = (row["accelerator_type"], row["region"])
        table[key] = Price(_value(row["on_demand"]), _value(row["spot"]))
    return table


@functools.cache
def table() -> dict[tuple[str, str], Price]:
    return parse(resources.files("multihost.pods").joinpath("prices.csv").read_text())


def source() -> str:
    """The table's own account of where its numbers come from (its comment lines)."""
    text = resources.files("multihost.pods").joinpath("prices.csv").read_text()
    return "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))


def region_of(zone: str) -> str:
    """``us-central2-b`` -> ``us-central2``."""
    return zone.rsplit("-", 1)[0]


def hourly(tpu_type: str, zone: str, capacity: str, num_slices: int = 1) -> float | None:
    """$/h for the whole pod (every slice); None when unknown: a type or region not in the
    table, or reserved / best-effort capacity (billed by their own terms)."""
    price = table().get((tpu_type, region_of(zone)))
    if price is None:
        return None
    each = {"on-demand": price.on_demand, "spot": price.spot}.get(capacity)
    return None if each is None else each * num_slices


def why_unknown(tpu_type: str, zone: str, capacity: str) -> str:
    """Why :func:`hourly` has no price for this pod, in words."""
    if capacity not in ("on-demand", "spot"):
        return f"{capacity} capacity is billed by its own terms"
    if (tpu_type, region_of(zone)) not in table():
        return f"the price table has no {tpu_type} in {region_of(zone)}"
    return f"the price table has no {capacity} price for {tpu_type} in {region_of(zone)}"


def cost(per_hour: float | None, seconds: float) -> float | None:
    return None if per_hour is None else per_hour * max(0.0, seconds) / 3600


def money(value: float | None, suffix: str = "") -> str:
    """``$25.76/h``, ``$0.43``; ``unknown`` for None."""
    return UNKNOWN if value is None else f"${value:,.2f}{suffix}"
