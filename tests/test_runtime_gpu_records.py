"""The runtime model held against the committed GPU step-time measurements (ftplan measure on one
H100 80GB HBM3, benchmarks/measurements/h100-sxm-*.jsonl), split by model in
benchmarks/measurements/h100-sxm-runtime-split.json: the held-out models were not used by
scripts/calibrate.py. A regression guard against measured data (no torch, ~1 s)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ftplan.catalog.runtime_reference import evaluate, load_gpu_records

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def outcomes():
    return evaluate(load_gpu_records(ROOT / "benchmarks" / "measurements"))


def test_split_is_by_model(outcomes):
    cal = {o.ref.model["name"] for o in outcomes if o.ref.split == "calibration"}
    held = {o.ref.model["name"] for o in outcomes if o.ref.split == "holdout"}
    assert cal and held and not cal & held
    assert sum(o.ref.split == "holdout" for o in outcomes) >= 20


def test_held_out_gpu_records_within_tolerance(outcomes):
    """Held-out tokens/s: median |error| <= 17 % and no record predicted more than 30 % too fast
    (after the fit of 2026-11-24 with the measurement VM's own host dispatch cost: median 15.4 %,
    max +27.0 %, all too fast; before the adapter/host terms the median was +36 % and the worst
    +140 %). The GPU-side constants keep the published fit, so these records test it on another
    machine."""
    held = [o.error for o in outcomes if o.ref.split == "holdout"]
    assert statistics.median(abs(e) for e in held) <= 0.17
    assert max(held) <= 0.30


def test_measurement_host_is_the_records_own(outcomes):
    """The measurement VM's per-op dispatch cost (the split file's ``host``) applies to its records
    only: ftplan's default host keeps the published fit."""
    import json

    from ftplan.catalog.efficiency import efficiency

    split = json.loads((ROOT / "benchmarks" / "measurements" / "h100-sxm-runtime-split.json").read_text())
    vm = split["host"]["dispatch_s_per_op"]["value"]
    assert all(o.ref.host_overrides == {"dispatch_s_per_op": vm} for o in outcomes)
    assert vm != efficiency().dispatch_s_per_op


def test_calibration_gpu_records_within_tolerance(outcomes):
    cal = [o.error for o in outcomes if o.ref.split == "calibration"]
    assert statistics.median(abs(e) for e in cal) <= 0.15
    assert max(abs(e) for e in cal) <= 0.30


def test_soft_capped_eager_attention_against_the_gemma2_records():
    """The three Gemma2 rows of h100-sxm-eager1.jsonl (eager attention with soft-capping; not in
    the runtime split, predicted with the VM's host as ftplan validate does): within +25 % / -10 %
    (+23.4 / +13.2 / +23.2 % with the soft-capping passes; +34.9 / +22.3 / +33.5 % without them)."""
    from ftplan.measure import validate as V

    path = ROOT / "benchmarks" / "measurements" / "h100-sxm-eager1.jsonl"
    rep = V.validate_paths([path])
    errs = [r["tokens_per_s_err_pct"] for r in rep["rows"] if r["outcome"] == "ok" and "gemma" in r["model"]]
    assert len(errs) == 3
    assert all(-10.0 <= e <= 25.0 for e in errs), errs
