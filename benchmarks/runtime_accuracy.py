"""Runtime accuracy: ftplan's predicted tokens/s against published fine-tuning throughput.

    python benchmarks/runtime_accuracy.py [--json] [--records]

Reads ``src/ftplan/catalog/data/runtime_reference.json`` (the published measurements, each with
its source, the exact reported text and the assumptions made to express it) and prints, for the
calibration records (the few free constants of ``efficiency.json`` were fitted on them by
``scripts/calibrate.py runtime``) and for the held-out records (never used by the fit; their
publications are disjoint from the calibration ones):

* median and max |error| and the signed errors of the predicted throughput (error > 0: predicted
  faster than measured, the direction in which a user under-budgets);
* the ratios between records that differ in one thing (GPU vs GPU for the same job, LoRA vs
  full, QLoRA vs LoRA, 8 vs 64/128 GPUs, torch.compile, FSDP vs ZeRO-3): predicted vs measured;
* the issue's targets: held-out median |error| <= 15 %, no case over-predicted by more than
  25 %, ratios within 15 % -- and exactly which records / ratios miss, with the record's notes;
* the FP8 / FP4 subset: the low-precision records' errors, and every published speedup of
  ``catalog/data/lowprec_reference.json`` predicted vs published;
* the uncertainty band the estimates carry (efficiency.json ``uncertainty``) and how many
  held-out measurements fall inside it.

* the GPU section: ``ftplan measure`` step times on one H100 80GB HBM3 (benchmarks/measurements/
  h100-sxm-*.jsonl), split by model into calibration and held-out records
  (h100-sxm-runtime-split.json), in-sample and held-out signed errors, and the measured vs
  predicted LoRA-vs-full, QLoRA-vs-LoRA, gc-vs-no-gc and b1-vs-b8 ratios.

``--records`` lists every record. Pure standard library; runs in ~1 s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.catalog.efficiency import efficiency  # noqa: E402
from ftplan.catalog.runtime_reference import (  # noqa: E402
    error_stats,
    evaluate,
    gpu_ratio_checks,
    load_gpu_records,
    load_reference,
    ratio_checks,
)

TARGET_MEDIAN = 0.15
TARGET_OVER = 0.25
TARGET_RATIO = 0.15


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _low_precision(job: dict) -> bool:
    from ftplan.lowprec import resolve_precision

    return resolve_precision(str(job.get("precision", "bf16-mixed")), job.get("method", "full")) is not None


def _lowprec_points() -> list[dict]:
    """catalog/data/lowprec_reference.json: published FP8/FP4 speedups, predicted vs published."""
    from ftplan.catalog.lowprec_reference import load_points, predicted_speedup, published_speedup

    out = []
    for p in load_points():
        pred, pub = predicted_speedup(p), published_speedup(p)
        out.append({"id": p.id, "kind": p.kind, "precision": p.precision, "calibrates": p.calibrates,
                    "bound": p.bound, "published": pub, "predicted": pred, "error": pred / pub - 1.0,
                    "tolerance": p.tolerance})
    return out


def report() -> dict:
    refs = load_reference()
    eff = efficiency()
    outs = evaluate(refs, eff)
    calib = [o for o in outs if o.ref.split == "calibration"]
    held = [o for o in outs if o.ref.split == "holdout"]
    ratios = ratio_checks(outs)
    lo, hi = eff.band_log_low, eff.band_log_high
    inside = [o for o in held if lo <= o.log_ratio <= hi]
    over = [o for o in held + calib if o.error > TARGET_OVER]
    bad_ratios = [r for r in ratios if abs(r["error"]) > TARGET_RATIO]
    hs = error_stats(held)
    low = [o for o in outs if _low_precision(o.ref.job)]
    gpu = evaluate(load_gpu_records(ROOT / "benchmarks" / "measurements"), eff)
    gpu_section = {
        "calibration": error_stats([o for o in gpu if o.ref.split == "calibration"]),
        "holdout": error_stats([o for o in gpu if o.ref.split == "holdout"]),
        "ratios": gpu_ratio_checks(gpu),
        "outcomes": [{"id": o.ref.id, "split": o.ref.split, "measured": o.measured_tps_per_gpu,
                      "predicted": o.predicted_tps_per_gpu, "error": o.error} for o in gpu],
    }
    return {
        "gpu_records": gpu_section,
        "records": len(refs),
        "scored": len(outs),
        "excluded": [{"id": r.id, "why": r.exclude} for r in refs if r.exclude],
        "sources": sorted({(r.source, r.split) for r in refs}),
        "calibration": error_stats(calib),
        "holdout": hs,
        # FP8 / FP4 records (job.precision names a low-precision recipe): all held out
        "low_precision": error_stats(low),
        "low_precision_points": _lowprec_points(),
        "band": {"log_low": lo, "log_high": hi, "quantiles": list(eff.band_quantiles),
                 "step_time_factor_low": math.exp(lo), "step_time_factor_high": math.exp(hi),
                 "holdout_inside": len(inside), "holdout_n": len(held)},
        "targets": {
            "holdout_median_abs_le_15pct": hs.get("median_abs", 1.0) <= TARGET_MEDIAN,
            "no_overprediction_gt_25pct": not over,
            "ratios_within_15pct": not bad_ratios,
        },
        "overpredicted_gt_25pct": [{"id": o.ref.id, "split": o.ref.split, "error": o.error,
                                    "notes": o.ref.raw.get("miss_note") or o.ref.raw.get("assumptions")} for o in over],
        "ratios": ratios,
        "ratios_missing_15pct": bad_ratios,
        "outcomes": [{"id": o.ref.id, "split": o.ref.split, "source": o.ref.source, "gpu": o.ref.gpu,
                      "gpus": o.ref.layout.get("gpus_per_node", 1) * o.ref.layout.get("nodes", 1),
                      "method": o.ref.job.get("method", "full"), "measured": o.measured_tps_per_gpu,
                      "predicted": o.predicted_tps_per_gpu, "error": o.error} for o in outs],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--records", action="store_true", help="list every scored record")
    a = ap.parse_args(argv)
    r = report()
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"runtime accuracy: {r['scored']} scored records ({r['records']} in the file, {len(r['excluded'])} excluded)")
    print("sources: " + ", ".join(f"{s} ({sp})" for s, sp in r["sources"]))
    print()
    print(f"{'set':12s} {'n':>3s} {'median|err|':>12s} {'max|err|':>9s} {'median':>8s} {'max over':>9s} {'max under':>10s} {'<=15%':>6s}")
    for name in ("calibration", "holdout", "low_precision"):
        s = r[name]
        print(f"{name:12s} {s['n']:3d} {s['median_abs'] * 100:11.1f}% {s['max_abs'] * 100:8.1f}% "
              f"{_pct(s['median_signed']):>8s} {_pct(s['max_over']):>9s} {_pct(s['max_under']):>10s} {s['within_15'] * 100:5.0f}%")
    print("(low_precision: the FP8 / FP4 records, all held out)")
    print("\nFP8 / FP4 speedups (catalog/data/lowprec_reference.json; 'fit' = the point a recipe's efficiency_vs_bf16 was fitted on):")
    for x in r["low_precision_points"]:
        tag = "fit " if x["calibrates"] else ("<=  " if x["bound"] == "upper" else "    ")
        print(f"  {tag}{x['id'][:46]:46s} {x['precision']:15s} published {x['published']:.3f} predicted {x['predicted']:.3f} "
              f"({_pct(x['error'])}, tolerance {x['tolerance']:.0%})")
    b = r["band"]
    print(f"\nuncertainty band (held-out quantiles {b['quantiles'][0]:.0%}/{b['quantiles'][1]:.0%} of measured/predicted step time): "
          f"x{b['step_time_factor_low']:.2f} .. x{b['step_time_factor_high']:.2f}; "
          f"{b['holdout_inside']}/{b['holdout_n']} held-out measurements inside")
    if a.records:
        print(f"\n{'split':11s} {'record':56s} {'gpu':14s} {'n':>4s} {'method':6s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
        for o in r["outcomes"]:
            print(f"{o['split']:11s} {o['id'][:56]:56s} {o['gpu']:14s} {o['gpus']:4d} {o['method']:6s} "
                  f"{o['measured']:9.0f} {o['predicted']:9.0f} {_pct(o['error']):>7s}")
    print(f"\nratios (predicted vs measured, {len(r['ratios'])}):")
    for x in r["ratios"]:
        flag = "MISS" if abs(x["error"]) > TARGET_RATIO else "ok  "
        print(f"  {flag} {x['kind']:13s} {x['a'][:44]:44s} / {x['b'][:44]:44s} measured {x['measured']:.2f} predicted {x['predicted']:.2f} ({_pct(x['error'])})")
    g = r["gpu_records"]
    print("\nGPU records (ftplan measure, one H100 80GB HBM3; split by model: benchmarks/measurements/h100-sxm-runtime-split.json):")
    for name in ("calibration", "holdout"):
        s = g[name]
        print(f"  {name:12s} n={s['n']:3d} median|err| {s['median_abs'] * 100:5.1f}%  median {_pct(s['median_signed'])}  "
              f"max over {_pct(s['max_over'])}  max under {_pct(s['max_under'])}  <=15% {s['within_15'] * 100:.0f}%")
    if a.records:
        for o in g["outcomes"]:
            print(f"  {o['split']:11s} {o['id'][:80]:80s} {o['measured']:9.0f} {o['predicted']:9.0f} {_pct(o['error']):>7s}")
    for x in g["ratios"]:
        flag = "MISS" if abs(x["error"]) > TARGET_RATIO else "ok  "
        print(f"  {flag} {x['kind']:13s} {x['a'][:60]:60s} / {x['b'][:60]:60s} measured {x['measured']:.2f} "
              f"predicted {x['predicted']:.2f} ({_pct(x['error'])})")
    t = r["targets"]
    print("\ntargets (issue 15):")
    print(f"  held-out median |error| <= 15%: {'PASS' if t['holdout_median_abs_le_15pct'] else 'FAIL'} ({r['holdout']['median_abs'] * 100:.1f}%)")
    print(f"  no case over-predicted by > 25%: {'PASS' if t['no_overprediction_gt_25pct'] else 'FAIL'}")
    for o in r["overpredicted_gt_25pct"]:
        print(f"    {o['split']:11s} {o['id']}: {_pct(o['error'])}")
        notes = o["notes"]
        for n in ([notes] if isinstance(notes, str) else notes or []):
            print(f"      - {n}")
    ok = sum(1 for x in r["ratios"] if abs(x["error"]) <= TARGET_RATIO)
    print(f"  ratios within 15%: {'PASS' if t['ratios_within_15pct'] else 'FAIL'} ({ok}/{len(r['ratios'])})")
    for x in r["ratios_missing_15pct"]:
        print(f"    {x['kind']}: {x['a']} / {x['b']}: {_pct(x['error'])}")
        if x.get("note"):
            print(f"      - {x['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
