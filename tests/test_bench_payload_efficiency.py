"""benchmarks/payload_efficiency.py's arithmetic: verdicts from the spread, columns as shown."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "payload_efficiency", ROOT / "benchmarks" / "payload_efficiency.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


eff = _load()


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ([0.95, 0.97, 1.0, 1.02, 1.05], "met"),
        ([0.5, 0.8, 0.85, 0.88, 0.95], "missed"),
        ([0.85, 0.88, 0.95, 1.0, 1.1], "inconclusive"),  # median above, Q1 below
        ([0.7, 0.89, 0.99, 1.1, 1.2], "inconclusive"),
    ],
)
def test_verdict_needs_the_spread_to_clear_the_threshold(ratios: list[float], verdict: str) -> None:
    assert eff.verdict(ratios) == verdict


def test_quartiles() -> None:
    assert eff.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)


def test_render_ratio_column_is_payload_over_bare_as_shown() -> None:
    args = argparse.Namespace(
        devices="1", d=512, batch=1024, layers=2, impl="jit", pairs=4, steps=4
    )
    row = {
        "devices": 1,
        "device_kind": "cpu",
        "payload_s": 0.25,
        "bare_s": 0.2,
        "payload_tflops": 0.1,
        "bare_tflops": 0.125,
        "ratios": [0.7, 0.8, 0.9, 1.3],
        "load_before": 1.0,
        "load_after": 2.0,
    }
    run = eff.summary(args, [row], 10.0)
    assert run["verdict"] == "inconclusive"
    assert run["load"] == [1.0, 2.0]
    text = eff.render(args, [row], 10.0, [run])
    table_row = next(ln for ln in text.splitlines() if ln.startswith("| 1 | cpu |"))
    cells = [c.strip() for c in table_row.strip("|").split("|")]
    assert cells[5] == f"{float(cells[3]) / float(cells[4]):.3f}" == "0.800"
    assert cells[6] == "0.850 [0.775, 1.000]"
    stored = next(ln for ln in text.splitlines() if ln.startswith(eff.RUNS_TAG))
    assert json.loads(stored[len(eff.RUNS_TAG) : -len(" -->")]) == [run]
