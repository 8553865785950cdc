"""Rebuild multihost/pods/prices.csv from SkyPilot's GCP catalog (``vms.csv``).

Usage: python scripts/tpu_prices.py PATH/TO/vms.csv [--commit SHA] > multihost/pods/prices.csv

The catalog (github.com/skypilot-org/skypilot-catalog, ``catalogs/v9/gcp/vms.csv``; columns
``InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,
AvailabilityZone,Price,SpotPrice``) lists each TPU slice as ``AcceleratorName`` ``tpu-<type>``
with $/h for the whole slice, once per zone; this keeps one row per type and region. An empty
price, or the catalog's ``700.0`` placeholder for a SKU it could not price, is written
``unknown``. Prices that differ between zones of one region are refused (not guessed).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import sys

PLACEHOLDER = 700.0


def price(text: str) -> str:
    text = text.strip()
    if not text or float(text) == PLACEHOLDER:
        return "unknown"
    return repr(float(text))


def rows(path: str) -> dict[tuple[str, str], tuple[str, str]]:
    found: dict[tuple[str, str], tuple[str, str]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = row["AcceleratorName"] or ""
            if not name.startswith("tpu-"):
                continue
            key = (name[len("tpu-") :], row["Region"])
            value = (price(row["Price"]), price(row["SpotPrice"]))
            if found.setdefault(key, value) != value:
                sys.exit(f"{key}: zones of one region disagree ({found[key]} vs {value})")
    return found


def order(key: tuple[str, str]) -> tuple[str, int, str]:
    family, _, size = key[0].rpartition("-")
    return family, int(size) if size.isdigit() else 0, key[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("vms_csv")
    ap.add_argument("--commit", default="(commit not given)")
    args = ap.parse_args()
    table = rows(args.vms_csv)
    today = datetime.date.today().isoformat()
    out = sys.stdout
    out.write(
        "# Cloud TPU prices: US dollars per hour for ONE WHOLE SLICE (a multislice pod costs "
        "num_slices times this).\n"
        "# source: SkyPilot's catalog, github.com/skypilot-org/skypilot-catalog "
        f"catalogs/v9/gcp/vms.csv at commit\n#   {args.commit} (its tpu-* rows: Region, Price, "
        "SpotPrice), which SkyPilot builds\n#   from the Cloud Billing SKUs of the Cloud TPU "
        "service (sky/catalog/data_fetchers/fetch_gcp.py).\n"
        f'# date: read {today}. Rows: every TPU type and region of the catalog; "unknown" '
        "where the\n#   catalog has no price (an empty field or its 700.0 placeholder). Reserved "
        "and best-effort capacity: no prices.\n"
        "# rebuild (every TPU row): python scripts/tpu_prices.py PATH/TO/vms.csv > "
        "multihost/pods/prices.csv\n"
        "accelerator_type,region,on_demand,spot\n"
    )
    for key in sorted(table, key=order):
        out.write(",".join((*key, *table[key])) + "\n")


if __name__ == "__main__":
    main()
