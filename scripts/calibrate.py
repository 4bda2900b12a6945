"""Fit memory-model constants from GPU measurement records, with a held-out check.

    python scripts/calibrate.py [RECORDS.jsonl ...] [--holdout-every K] [--out FILE]

Fits, from the ``ok`` GPU records (CPU and tiny records are ignored):

* ``allocator_reserve_fraction``: the caching allocator's reserve over the predicted peak,
  ``measured max_memory_reserved / predicted peak_allocated - 1`` (the median: accuracy; p90 is
  reported too, as the choice that avoids false fits);
* ``cuda_context_bytes``: device memory outside the allocator,
  ``nvml_used - nvml_used_before - memory_reserved`` read at the same moment (median).

Every K-th record (default 5) is held out: the constants are fitted on the rest, and the held-out
records' peak-reserved error is reported with the current constants and with the fitted ones.
Writes ``benchmarks/calibration.json`` (proposed values + evidence); copying them into
``src/ftplan/catalog/data/memory_constants.json`` (status "calibrated") is a reviewed change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.catalog.constants import memory_constants  # noqa: E402
from ftplan.measure.records import job_from_dict, layout_from_dict, load_records  # noqa: E402
from ftplan.measure.validate import stats  # noqa: E402
from ftplan.memory import estimate_memory  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402


def _usable(r: dict) -> bool:
    run = r.get("run") or {}
    m = r.get("measured") or {}
    return (r["outcome"] == "ok" and run.get("device") == "cuda" and not run.get("tiny")
            and bool(m.get("peak_allocated_bytes")) and bool(m.get("peak_reserved_bytes")))


def _predict(r: dict, consts=None):
    spec = model_from_config(r["model"]["config"], name=r["model"].get("name"))
    return estimate_memory(spec, job_from_dict(r["job"]), layout_from_dict(r.get("layout")), consts=consts)


def fit(records: list[dict]) -> dict:
    fracs, ctxs = [], []
    for r in records:
        m = r["measured"]
        pred = _predict(r)
        fracs.append(m["peak_reserved_bytes"] / pred.peak_allocated_bytes - 1.0)
        if m.get("nvml_used_bytes") and m.get("nvml_used_before_bytes") is not None and m.get("reserved_at_nvml_bytes"):
            ctxs.append(m["nvml_used_bytes"] - m["nvml_used_before_bytes"] - m["reserved_at_nvml_bytes"])
    out = {"n": len(records)}
    if fracs:
        s = sorted(fracs)
        out["allocator_reserve_fraction"] = max(0.0, statistics.median(fracs))
        out["allocator_reserve_fraction_p90"] = max(0.0, s[max(0, -(-9 * len(s) // 10) - 1)])
    if ctxs:
        out["cuda_context_bytes"] = int(statistics.median(ctxs))
        out["cuda_context_n"] = len(ctxs)
    return out


def _errors(records: list[dict], consts) -> list[float]:
    errs = []
    for r in records:
        pred = _predict(r, consts)
        meas = r["measured"]["peak_reserved_bytes"]
        errs.append((pred.peak_reserved_bytes - meas) / meas * 100)
    return errs


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*")
    ap.add_argument("--holdout-every", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "calibration.json"))
    a = ap.parse_args(argv)
    paths = [Path(p) for p in a.records] or sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl"))
    records, problems = load_records(paths, strict_files=False)
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    usable = [r for r in records if _usable(r)]
    print(f"{len(records)} record(s); {len(usable)} usable GPU record(s) (ok, cuda, full-size)")
    if not usable:
        print("nothing to calibrate yet: run benchmarks/run_campaign.sh on a GPU machine first")
        return 0
    k = max(2, a.holdout_every)
    held = [r for i, r in enumerate(usable) if i % k == k - 1]
    train = [r for i, r in enumerate(usable) if i % k != k - 1] or usable
    fitted = fit(train)
    base = memory_constants()
    changes = {}
    if "allocator_reserve_fraction" in fitted:
        changes["allocator_reserve_fraction"] = fitted["allocator_reserve_fraction"]
    if "cuda_context_bytes" in fitted:
        changes["cuda_context_bytes"] = fitted["cuda_context_bytes"]
    new = dataclasses.replace(base, **changes)
    report = {"fitted_on": len(train), "held_out": len(held), "fit": fitted}
    if held:
        report["held_out_current"] = stats(_errors(held, base))
        report["held_out_fitted"] = stats(_errors(held, new))
    print(json.dumps(report, indent=2))
    doc = {
        "schema": "ftplan.calibration/1",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "records": [str(p) for p in paths],
        "holdout_every": k,
        "proposed": changes,
        "report": report,
    }
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
