"""Fit model constants: memory constants from GPU measurement records, or the runtime model's
free constants from published throughput measurements.

    python scripts/calibrate.py [RECORDS.jsonl ...] [--holdout-every K] [--out FILE]
    python scripts/calibrate.py runtime [--write] [RECORDS.jsonl ...]
    python scripts/calibrate.py lowprec [--write]

``lowprec``: fits ``efficiency_vs_bf16`` of each FP8 / FP4 recipe that a point of
``catalog/data/lowprec_reference.json`` ``calibrates`` (the achieved fraction of the FP8/FP4 peak
relative to what bf16 GEMMs achieve of theirs), by bisection so that the whole runtime model
(``estimate_runtime``: FP8 GEMMs, quantize traffic, float8 all-gather) reproduces the published
end-to-end speedup; bounded to (0.3, 1.0]: an FP8 GEMM does not reach a larger fraction of its
peak than a bf16 GEMM of its own (cuBLAS microbenchmarks), so a point the bound stops short of is
reported with its residual. Recipes marked ``same_as`` follow. Run it after ``runtime`` (the bf16
terms come first). With ``--write`` the values go into ``precisions.json``.

``runtime``: fits the few free constants of the step-time model (``FITTED_KEYS`` in
``ftplan/catalog/efficiency.py``: per-family GEMM fraction for hopper/ampere/ada, the flash-attention
and elementwise multipliers, per-op dispatch time, per-step overhead, overlap efficiency) on the
calibration records of ``catalog/data/runtime_reference.json`` (plus ``ok`` CUDA ``ftplan measure``
records with a measured tokens/s, when there are any), by coordinate descent on the mean squared
log error with over-prediction (predicted faster than measured) weighted twice. The hold-out
records are never used by the fit: their residuals give the uncertainty band (10th/90th
percentile of log(measured / predicted step time)). With ``--write`` the fitted values (with their
prior and the records used), the band and the fit summary are written into ``efficiency.json``.

Memory mode (default):

Fits, from the ``ok`` GPU records (CPU and tiny records are ignored):

* ``allocator_reserve_fraction``: the caching allocator's own reserve,
  ``measured max_memory_reserved / measured max_memory_allocated - 1`` (a property of the
  allocator, kept apart from the error of the allocated prediction; the median: accuracy; p90 is
  reported too, as the choice that avoids false fits);
* ``cuda_context_bytes``: device memory outside the allocator, this process's NVML usage minus
  ``memory_reserved`` read at the same moment (median). The device-wide
  ``nvml_used - nvml_used_before`` is not used: in a campaign the previous run's process may still
  hold memory when ``nvml_used_before`` is read (it gave negative contexts).

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
        fracs.append(m["peak_reserved_bytes"] / m["peak_allocated_bytes"] - 1.0)
        if m.get("nvml_process_bytes") and m.get("reserved_at_nvml_bytes"):
            ctxs.append(m["nvml_process_bytes"] - m["reserved_at_nvml_bytes"])
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
    if argv and argv[0] == "runtime":
        return runtime_main(argv[1:])
    if argv and argv[0] == "lowprec":
        return lowprec_main(argv[1:])
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



# ---------------------------------------------------------------------------------------------
# runtime calibration
# ---------------------------------------------------------------------------------------------
#: bounds of each fitted constant (the search stays inside them)
RUNTIME_BOUNDS = {
    "gemm.training_scale": (0.4, 1.3),
    "attention.flash_scale": (0.3, 2.0),
    "elementwise.scale": (0.2, 3.0),
    "host.dispatch_s_per_op": (1e-6, 5e-5),
    "host.step_fixed_s": (0.0, 0.2),
    "comm.overlap_efficiency": (0.5, 1.0),
    "host.checkpoint_ops_per_layer": (0.0, 400.0),
    # the GPU measurement machine's own host (h100-sxm-runtime-split.json "host"), fitted on its
    # calibration models only and applied to all of its records
    "measure_host.dispatch_s_per_op": (1e-6, 5e-5),
    "measure_host.step_fixed_s": (0.0, 0.2),
}
#: constants of the GPU side fitted on the published records only: the ftplan measure records are one
#: GPU model and one software stack, and would pull the GPU-wide rates towards it; they enter the
#: host constants (ftplan's default and their own machine's, "measure_host.")
PUBLISHED_ONLY = ("gemm.", "attention.", "elementwise.", "comm.")
OVER_WEIGHT = 2.0  # over-prediction (the direction in which a user under-budgets) costs double


def _get(data: dict, key: str) -> float:
    cur = data
    for part in key.split("."):
        cur = cur[part]
    return cur["value"] if isinstance(cur, dict) else cur


def _set(data: dict, key: str, value: float) -> None:
    cur = data
    parts = key.split(".")
    for part in parts[:-1]:
        cur = cur[part]
    if isinstance(cur[parts[-1]], dict):
        cur[parts[-1]]["value"] = value
    else:
        cur[parts[-1]] = value


def _measurement_refs(paths: list[Path]):
    """``ok`` CUDA ``ftplan measure`` records with a measured tokens/s, as calibration references."""
    from ftplan.catalog.gpus import load_gpus, resolve_gpu_name
    from ftplan.catalog.runtime_reference import Reference

    if not paths:
        return []
    records, problems = load_records(paths, strict_files=False)
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    gpus = load_gpus()
    out = []
    for i, r in enumerate(records):
        run = r.get("run") or {}
        m = r.get("measured") or {}
        if r.get("outcome") != "ok" or run.get("device") != "cuda" or run.get("tiny") or not m.get("tokens_per_s"):
            continue
        try:
            gpu = resolve_gpu_name((r.get("env") or {}).get("gpu_name") or "", gpus)
        except Exception:  # noqa: BLE001 - an unknown GPU name: the record cannot be predicted
            print(f"warning: record {i}: GPU {(r.get('env') or {}).get('gpu_name')!r} not in the catalog", file=sys.stderr)
            continue
        lay = r.get("layout") or {}
        world = lay.get("gpus_per_node", 1) * lay.get("nodes", 1)
        job = {k: v for k, v in r["job"].items()}
        out.append(Reference(
            id=f"measure-{i}-{r.get('key', '')}", source="ftplan-measure", split="calibration",
            model={"name": r["model"].get("name"), "config": r["model"]["config"]}, job=job, layout=lay,
            gpu=gpu, gpu_overrides={}, inter_node_gbps=None, measured_tps_per_gpu=m["tokens_per_s"] / world,
            reported=f"ftplan measure: median step {m.get('median_step_s')} s", exclude=None, raw=r))
    return out


def _loss(outcomes) -> float:
    tot = 0.0
    for o in outcomes:
        lr = o.log_ratio
        tot += lr * lr * (OVER_WEIGHT if lr > 0 else 1.0)
    return tot / max(1, len(outcomes))


def runtime_main(argv: list[str]) -> int:
    import math

    from ftplan.catalog.efficiency import FITTED_KEYS, load_efficiency_data, parse_efficiency
    from ftplan.catalog.runtime_reference import quantile, error_stats, evaluate, load_reference

    ap = argparse.ArgumentParser(prog="calibrate.py runtime", description="fit the runtime model's free constants")
    ap.add_argument("records", nargs="*", help="ftplan measure JSONL files (default: benchmarks/measurements/*.jsonl)")
    ap.add_argument("--write", action="store_true", help="write the fit into src/ftplan/catalog/data/efficiency.json")
    ap.add_argument("--sweeps", type=int, default=12, help="coordinate-descent sweeps (12: what efficiency.json holds)")
    ap.add_argument("--only", default="", help="comma-separated keys to fit; the others keep their current values "
                    "(what the data holds: host.dispatch_s_per_op,host.checkpoint_ops_per_layer,host.step_fixed_s,"
                    "measure_host.dispatch_s_per_op)")
    a = ap.parse_args(argv)

    from dataclasses import replace

    from ftplan.catalog.runtime_reference import GPU_SPLIT_FILE, parse_host

    data = load_efficiency_data()
    refs = load_reference()
    split_path = ROOT / "benchmarks" / "measurements" / GPU_SPLIT_FILE
    split_data: dict = {}
    if a.records:  # explicit files: every ok CUDA record calibrates, on ftplan's default host
        gpu_cal, gpu_held = _measurement_refs([Path(p) for p in a.records]), []
    else:  # the committed GPU records, split by model (benchmarks/measurements/h100-sxm-runtime-split.json)
        from ftplan.catalog.runtime_reference import load_gpu_records

        gpu = load_gpu_records(ROOT / "benchmarks" / "measurements")
        gpu_cal = [r for r in gpu if r.split == "calibration"]
        gpu_held = [r for r in gpu if r.split == "holdout"]
        split_data = json.loads(split_path.read_text())
    # the measurement machine's host constants (fitted on gpu_cal only: the published records keep
    # ftplan's default host)
    host_work = json.loads(json.dumps(split_data.get("host") or {}))
    pub_cal = [r for r in refs if r.split == "calibration" and not r.exclude]
    calib = pub_cal + gpu_cal
    held = [r for r in refs if r.split == "holdout" and not r.exclude]
    print(f"{len(calib)} calibration records ({len(gpu_cal)} from ftplan measure), {len(held)} published "
          f"and {len(gpu_held)} GPU records held out")

    host_keys = tuple(f"measure_host.{k}" for k in host_work if not k.startswith("_"))
    all_keys = FITTED_KEYS + host_keys
    keys = tuple(k for k in a.only.split(",") if k) or all_keys
    unknown = set(keys) - set(all_keys)
    if unknown:
        ap.error(f"unknown key(s) {sorted(unknown)}; fitted keys: {', '.join(all_keys)}")
    work = json.loads(json.dumps(data))
    work["measure_host"] = host_work  # read by _get/_set only; parse_efficiency ignores it

    def gpu_refs(rs):
        ov = parse_host(host_work, GPU_SPLIT_FILE)
        return [replace(r, host_overrides=ov) for r in rs]

    def eff_of():
        return parse_efficiency({k: v for k, v in work.items() if k != "measure_host"})

    for k in keys:  # start from the priors, not from a previous fit
        cur = work
        for part in k.split("."):
            cur = cur[part]
        if "prior" in cur:
            cur["value"] = cur["prior"]

    def loss_at(key: str, value: float) -> float:
        _set(work, key, value)
        if key.startswith(PUBLISHED_ONLY):
            return _loss(evaluate(pub_cal, eff_of()))
        return _loss(evaluate(pub_cal + gpu_refs(gpu_cal), eff_of()))

    best = _loss(evaluate(pub_cal + gpu_refs(gpu_cal), eff_of()))
    print(f"loss at priors {best:.5f}")
    for sweep in range(a.sweeps):
        for key in keys:
            lo, hi = RUNTIME_BOUNDS[key]
            x0 = _get(work, key)
            # golden-section search on log(value) (linear for ranges that include 0)
            logscale = lo > 0
            f = (math.log if logscale else (lambda v: v))
            finv = (math.exp if logscale else (lambda v: v))
            a_, b_ = f(lo), f(hi)
            g = (math.sqrt(5) - 1) / 2
            c, d = b_ - g * (b_ - a_), a_ + g * (b_ - a_)
            fc, fd = loss_at(key, finv(c)), loss_at(key, finv(d))
            for _ in range(28):
                if fc < fd:
                    b_, d, fd = d, c, fc
                    c = b_ - g * (b_ - a_)
                    fc = loss_at(key, finv(c))
                else:
                    a_, c, fc = c, d, fd
                    d = a_ + g * (b_ - a_)
                    fd = loss_at(key, finv(d))
            x = finv((a_ + b_) / 2)
            lx = loss_at(key, x)
            if lx <= loss_at(key, x0):  # never worse than where the sweep started (on the key's records)
                _set(work, key, x)
            best = _loss(evaluate(pub_cal + gpu_refs(gpu_cal), eff_of()))
        print(f"sweep {sweep + 1}: loss {best:.5f}  " + ", ".join(f"{k.split('.')[-1]}={_get(work, k):.4g}" for k in keys))

    eff = eff_of()
    gpu_cal, gpu_held = gpu_refs(gpu_cal), gpu_refs(gpu_held)
    calib = pub_cal + gpu_cal
    oc, oh = evaluate(calib, eff), evaluate(held, eff)
    lrs = [o.log_ratio for o in oh]
    q = (0.1, 0.9)
    band = (quantile(lrs, q[0]), quantile(lrs, q[1])) if lrs else (-0.25, 0.35)
    summary = {"calibration": error_stats([o for o in oc if o.ref.source != "ftplan-measure"]),
               "holdout": error_stats(oh)}
    if gpu_cal or gpu_held:
        summary["gpu_calibration"] = error_stats(evaluate(gpu_cal, eff))
        summary["gpu_holdout"] = error_stats(evaluate(gpu_held, eff)) if gpu_held else {"n": 0}
    print(json.dumps({k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in summary.items()}, indent=1))
    print(f"band (held-out log(measured/predicted step) q10/q90): {band[0]:+.3f} / {band[1]:+.3f}")
    if not a.write:
        print("dry run: pass --write to store the fit in efficiency.json")
        return 0
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    used = [r.id for r in calib]
    for k in keys:
        if k.startswith("measure_host."):  # the measurement machine's host: its calibration models only
            cur = split_data["host"][k.split(".", 1)[1]]
            cur["value"] = round(_get(work, k), 7 if "dispatch" in k else 4)
            cur["status"] = "calibrated"
            cur["fitted"] = {"by": "scripts/calibrate.py runtime", "at": stamp, "records": len(gpu_cal),
                             "reference": f"{GPU_SPLIT_FILE}: calibration_models"}
            continue
        cur = data
        for part in k.split("."):
            cur = cur[part]
        cur["value"] = round(_get(work, k), 6 if "dispatch" in k else 4)
        cur["status"] = "calibrated"
        pub_only = k.startswith(PUBLISHED_ONLY)
        cur["fitted"] = {"by": "scripts/calibrate.py runtime", "at": stamp,
                         "records": len(pub_cal) if pub_only else len(used),
                         "reference": "catalog/data/runtime_reference.json (split: calibration)"
                         + (f" and {len(gpu_cal)} ftplan measure GPU records (benchmarks/measurements/"
                            f"{GPU_SPLIT_FILE}: calibration_models, on their own host constants)"
                            if gpu_cal and not pub_only else "")}
    data["uncertainty"] = {
        "log_low": round(band[0], 4), "log_high": round(band[1], 4), "quantiles": list(q), "n": len(lrs),
        "source": "10th/90th percentile of log(measured / predicted step time) over the held-out records of runtime_reference.json after the fit (scripts/calibrate.py runtime)",
        "status": "calibrated",
    }
    data["calibration"] = {
        "by": "scripts/calibrate.py runtime", "at": stamp, "objective": f"mean squared log error, over-prediction x{OVER_WEIGHT}",
        "calibration_records": used, "holdout_records": [r.id for r in held],
        "gpu_holdout_records": [r.id for r in gpu_held],
        "summary": {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in summary.items()},
    }
    path = ROOT / "src" / "ftplan" / "catalog" / "data" / "efficiency.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
    if any(k.startswith("measure_host.") for k in keys):
        split_path.write_text(json.dumps(split_data, indent=2) + "\n")
        print(f"wrote {split_path}")
    return 0


# ---------------------------------------------------------------------------------------------
# low-precision (FP8 / FP4) calibration
# ---------------------------------------------------------------------------------------------
LOWPREC_BOUNDS = (0.3, 1.0)


def lowprec_main(argv: list[str]) -> int:
    import ftplan.lowprec as lowprec
    import ftplan.runtime as runtime
    from ftplan.catalog.lowprec_reference import load_points, predicted_speedup, published_speedup

    ap = argparse.ArgumentParser(prog="calibrate.py lowprec", description="fit efficiency_vs_bf16 of the FP8/FP4 recipes")
    ap.add_argument("--write", action="store_true", help="write the fit into src/ftplan/catalog/data/precisions.json")
    a = ap.parse_args(argv)
    path = ROOT / "src" / "ftplan" / "catalog" / "data" / "precisions.json"
    data = json.loads(path.read_text())
    by_name = {r["name"]: r for r in data["recipes"]}
    points = load_points()

    def use(doc: dict) -> None:  # the runtime reads recipes through lowprec's cached catalog
        cat = lowprec.parse_precisions(doc)
        lowprec._catalog = lambda: cat  # noqa: SLF001 - script-only swap of the cached catalog
        runtime.clear_caches()

    fitted: dict[str, float] = {}
    for p in points:
        if not p.calibrates:
            continue
        target = published_speedup(p)
        entry = by_name[p.calibrates]["efficiency_vs_bf16"]

        def at(v: float) -> float:
            entry["value"] = v
            use(data)
            return predicted_speedup(p)

        lo, hi = LOWPREC_BOUNDS
        if at(hi) <= target:
            v = hi
        elif at(lo) >= target:
            v = lo
        else:
            for _ in range(40):
                mid = (lo + hi) / 2
                if at(mid) < target:
                    lo = mid
                else:
                    hi = mid
            v = (lo + hi) / 2
        v = round(v, 3)
        s = at(v)
        fitted[p.calibrates] = v
        print(f"{p.calibrates:16s} efficiency_vs_bf16 = {v:.3f}: {p.id} predicted {s:.3f}x, published "
              f"{target:.3f}x ({s / target - 1:+.1%}){'  (at the bound)' if v in LOWPREC_BOUNDS else ''}")
    use(data)
    for p in points:
        if not p.calibrates:
            s, t = predicted_speedup(p), published_speedup(p)
            print(f"  check {p.id:44s} predicted {s:.3f}x, published {t:.3f}x ({s / t - 1:+.1%}, tolerance {p.tolerance:.0%})")
    if not a.write:
        print("dry run: pass --write to store the fit in precisions.json")
        return 0
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = path.read_text()
    for name, v in fitted.items():  # keep the file's layout: replace the value in place
        import re

        pat = re.compile(r'("name": "' + re.escape(name) + r'".*?"efficiency_vs_bf16": \{"value": )([0-9.]+)', re.S)
        text, n = pat.subn(lambda m: m.group(1) + f"{v}", text, count=1)
        assert n == 1, name
    text = re.sub(r'"as_of": "[^"]*"', f'"as_of": "{stamp[:10]}"', text, count=1)
    json.loads(text)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
