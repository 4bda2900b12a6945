"""Published throughput measurements (``data/runtime_reference.json``) and the runtime model held
against them: loading and validation, one prediction per record, error statistics and ratios.

Shared by ``benchmarks/runtime_accuracy.py`` (the report), ``scripts/calibrate.py`` (the fit) and
the tests. Pure standard library; nothing is read at import.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, fields
from importlib import resources
from types import SimpleNamespace
from typing import Any

from ..errors import CatalogError
from .efficiency import (  # re-exported (their home: efficiency.py)
    HOST_KEYS,
    host_variant,
    parse_host,
)

__all__ = ["Reference", "Outcome", "GpuVariant", "load_reference", "predict", "evaluate", "error_stats",
           "ratio_checks", "log_ratio", "quantile", "load_gpu_records", "gpu_ratio_checks", "GPU_SPLIT_FILE",
           "HOST_KEYS", "host_variant", "parse_host"]

#: the split of the GPU measurement records (benchmarks/measurements/, relative to the repository)
GPU_SPLIT_FILE = "h100-sxm-runtime-split.json"

SPLITS = ("calibration", "holdout", "constant")


@dataclass(frozen=True)
class Reference:
    id: str
    source: str
    split: str  # the source's split
    model: dict
    job: dict
    layout: dict
    gpu: str
    gpu_overrides: dict
    inter_node_gbps: float | None
    measured_tps_per_gpu: float
    reported: str
    exclude: str | None
    raw: dict
    #: host constants of the machine the record was measured on (efficiency.json ``host`` field
    #: names), replacing ftplan's default host: per-op dispatch is a property of the CPU, Python
    #: and driver stack, not of the GPU (empty: ftplan's default host)
    host_overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    ref: Reference
    predicted_tps_per_gpu: float
    measured_tps_per_gpu: float
    estimate: Any  # RuntimeEstimate

    @property
    def error(self) -> float:
        """Signed relative error of the predicted throughput: > 0 = predicted faster than measured."""
        return self.predicted_tps_per_gpu / self.measured_tps_per_gpu - 1.0

    @property
    def log_ratio(self) -> float:
        """log(measured step time / predicted step time) = log(predicted tps / measured tps)."""
        return math.log(self.predicted_tps_per_gpu / self.measured_tps_per_gpu)


def log_ratio(o: Outcome) -> float:
    return o.log_ratio


def _path():
    return resources.files("ftplan.catalog") / "data" / "runtime_reference.json"


def load_reference(data: Any | None = None, where: str = "runtime_reference.json") -> list[Reference]:
    """All records (excluded ones included, with their reason), validated."""
    if data is None:
        try:
            data = json.loads(_path().read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CatalogError(f"cannot read bundled {where}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise CatalogError(f"{where}: expected an object with 'sources' and 'records'")
    sources = data.get("sources") or {}
    out: list[Reference] = []
    seen: set[str] = set()
    for i, r in enumerate(data["records"]):
        w = f"{where}: record {i}"
        if not isinstance(r, dict):
            raise CatalogError(f"{w}: must be an object")
        rid = r.get("id")
        if not rid or rid in seen:
            raise CatalogError(f"{w}: missing or duplicate id {rid!r}")
        seen.add(rid)
        src = r.get("source")
        if src not in sources:
            raise CatalogError(f"{w} ({rid}): unknown source {src!r}")
        s = sources[src]
        if s.get("split") not in SPLITS or not s.get("url"):
            raise CatalogError(f"{where}: source {src!r} needs a 'url' and a split in {SPLITS}")
        meas = r.get("measured") or {}
        tps = meas.get("tokens_per_s_per_gpu")
        if isinstance(tps, bool) or not isinstance(tps, (int, float)) or tps <= 0 or not meas.get("reported"):
            raise CatalogError(f"{w} ({rid}): measured needs tokens_per_s_per_gpu > 0 and the 'reported' text")
        for k in ("model", "job", "layout"):
            if not isinstance(r.get(k), dict):
                raise CatalogError(f"{w} ({rid}): missing {k!r}")
        if not isinstance(r.get("gpu"), str):
            raise CatalogError(f"{w} ({rid}): missing 'gpu'")
        out.append(Reference(
            id=rid, source=src, split=s["split"], model=r["model"], job=r["job"], layout=r["layout"],
            gpu=r["gpu"], gpu_overrides=dict(r.get("gpu_overrides") or {}),
            inter_node_gbps=r.get("inter_node_gbps"), measured_tps_per_gpu=float(tps),
            reported=meas["reported"], exclude=r.get("exclude"), raw=r,
        ))
    return out


class GpuVariant:
    """A catalog GPU with some attributes replaced (a measured variant: lower bandwidth, power cap)."""

    def __init__(self, base: Any, overrides: dict):
        self._base = base
        self._over = {k: v for k, v in overrides.items() if k != "note"}

    def __getattr__(self, name: str) -> Any:
        over = self.__dict__.get("_over", {})
        if name in over:
            return over[name]
        return getattr(self.__dict__["_base"], name)


_MODEL_CACHE: dict[str, Any] = {}


def _model(ref: Reference):
    from ..model import model_from_config
    from .models import resolve_model

    key = json.dumps(ref.model, sort_keys=True)
    hit = _MODEL_CACHE.get(key)
    if hit is None:
        if "catalog" in ref.model:
            hit = resolve_model(ref.model["catalog"])
        else:
            hit = model_from_config(ref.model["config"], name=ref.model.get("name"))
        _MODEL_CACHE[key] = hit
    return hit


def _job(d: dict):
    from ..job import Job, LoraSpec, QuantSpec

    d = dict(d)
    lora = dict(d.pop("lora", None) or {})
    quant = dict(d.pop("quant", None) or {})
    if "target_modules" in lora:
        lora["target_modules"] = tuple(lora["target_modules"])
    if "skip_modules" in quant:
        quant["skip_modules"] = tuple(quant["skip_modules"])
    known = {f.name for f in fields(Job)}
    unknown = set(d) - known
    if unknown:
        raise CatalogError(f"runtime_reference.json: unknown job field(s) {sorted(unknown)}")
    return Job(**d, lora=LoraSpec(**lora), quant=QuantSpec(**quant))


def predict(ref: Reference, eff: Any | None = None):
    """The runtime estimate ftplan makes for this record's job, layout and GPU."""
    from ..job import Layout
    from ..runtime import estimate_runtime
    from .gpus import load_gpus

    gpu = load_gpus()[ref.gpu]
    if ref.host_overrides:
        eff = host_variant(eff, ref.host_overrides)
    if ref.gpu_overrides:
        gpu = GpuVariant(gpu, ref.gpu_overrides)
    offer = SimpleNamespace(inter_node_gbps=ref.inter_node_gbps) if ref.inter_node_gbps else None
    return estimate_runtime(_model(ref), _job(ref.job), Layout(**ref.layout), gpu, offer=offer, eff=eff)


def evaluate(refs: list[Reference], eff: Any | None = None) -> list[Outcome]:
    out = []
    for r in refs:
        if r.exclude:
            continue
        est = predict(r, eff)
        world = r.layout.get("gpus_per_node", 1) * r.layout.get("nodes", 1)
        out.append(Outcome(r, est.tokens_per_s / world, r.measured_tps_per_gpu, est))
    return out


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default 'linear' method)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def error_stats(outcomes: list[Outcome]) -> dict[str, float]:
    """Median / max |error| and signed errors (relative error of the predicted throughput)."""
    if not outcomes:
        return {"n": 0}
    e = [o.error for o in outcomes]
    a = [abs(x) for x in e]
    return {
        "n": len(e),
        "median_abs": statistics.median(a),
        "max_abs": max(a),
        "median_signed": statistics.median(e),
        "max_over": max(e),  # most optimistic (predicted faster than measured)
        "max_under": min(e),
        "within_15": sum(1 for x in a if x <= 0.15) / len(a),
    }


def ratio_checks(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Predicted vs measured ratios between records that differ in one thing: the GPU (same job and
    layout), the method (LoRA vs full, QLoRA vs LoRA on the same GPU and source), or the GPU count
    (same model, job and GPU)."""
    by_id = {o.ref.id: o for o in outcomes}
    out = []

    def add(kind: str, a: str, b: str, note: str | None = None) -> None:
        if a in by_id and b in by_id:
            oa, ob = by_id[a], by_id[b]
            meas = oa.measured_tps_per_gpu / ob.measured_tps_per_gpu
            pred = oa.predicted_tps_per_gpu / ob.predicted_tps_per_gpu
            out.append({"kind": kind, "a": a, "b": b, "measured": meas, "predicted": pred,
                        "error": pred / meas - 1.0, "note": note})

    for o in outcomes:
        rel = o.ref.raw.get("ratios") or []
        for r in rel:
            add(r["kind"], o.ref.id, r["vs"], r.get("note"))
    return out


# ---------------------------------------------------------------------------------------------
# ftplan measure GPU records (benchmarks/measurements/*.jsonl) as references
# ---------------------------------------------------------------------------------------------
def load_gpu_records(measurements_dir: Any, split_file: str = GPU_SPLIT_FILE) -> list[Reference]:
    """The ``ok`` CUDA records named by ``split_file`` (in ``measurements_dir``) as references, with
    the split the file states per model (``calibration`` / ``holdout``); the latest record of each
    configuration counts (``ftplan validate``'s rule). A record of a model the file does not name is
    an error (a new model must be put on one side of the split explicitly)."""
    from pathlib import Path

    from ..measure.records import load_records
    from ..measure.validate import latest_per_configuration
    from .gpus import load_gpus, resolve_gpu_name

    d = Path(measurements_dir)
    try:
        split = json.loads((d / split_file).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read {d / split_file}: {e}") from None
    cal, held = set(split.get("calibration_models") or ()), set(split.get("holdout_models") or ())
    if not split.get("source") or not split.get("files") or not cal or not held or cal & held:
        raise CatalogError(f"{split_file}: needs 'files', a 'source' and disjoint calibration_models / holdout_models")
    host = parse_host(split.get("host"), split_file)
    records, problems = load_records([d / f for f in split["files"]], strict_files=True)
    if problems:
        raise CatalogError(f"{split_file}: {problems[0]}")
    records, _ = latest_per_configuration(records)
    gpus = load_gpus()
    out: list[Reference] = []
    for r in records:
        run, m = r.get("run") or {}, r.get("measured") or {}
        if r.get("outcome") != "ok" or run.get("device") != "cuda" or run.get("tiny") or not m.get("tokens_per_s"):
            continue
        name = r["model"].get("name")
        if name not in cal and name not in held:
            raise CatalogError(f"{split_file}: model {name!r} of {r.get('_source')} is on neither side of the split")
        lay = r.get("layout") or {}
        world = lay.get("gpus_per_node", 1) * lay.get("nodes", 1)
        job = r["job"]
        rid = (f"measure-{name}-{job['method']}-{job['precision']}{'-fp32base' if job.get('base_dtype') == 'fp32' else ''}"
               f"-b{job['micro_batch']}-s{job['seq_len']}{'-ga' + str(job['grad_accum']) if job.get('grad_accum', 1) > 1 else ''}"
               f"{'-gc' if job.get('gradient_checkpointing') else ''}-{job.get('optimizer')}-{job.get('attn_impl')}"
               f"{'-' + '+'.join(job['lora']['target_modules']) if job['method'] != 'full' else ''}"
               f"{'-no-double-quant' if job['method'] == 'qlora' and not job['quant'].get('double_quant') else ''}")
        out.append(Reference(
            id=rid, source="ftplan-measure", split="calibration" if name in cal else "holdout",
            model={"name": name, "config": r["model"]["config"]}, job=dict(job), layout=dict(lay),
            gpu=resolve_gpu_name((r.get("env") or {}).get("gpu_name") or "", gpus), gpu_overrides={},
            inter_node_gbps=None, measured_tps_per_gpu=float(m["tokens_per_s"]) / world,
            reported=f"ftplan measure {r.get('_source')}: median step {m.get('median_step_s'):.4f} s",
            exclude=None, raw=r, host_overrides=dict(host)))
    seen: set[str] = set()
    for o in out:
        if o.id in seen:
            raise CatalogError(f"{split_file}: two records share the id {o.id}")
        seen.add(o.id)
    return out


def gpu_ratio_checks(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Predicted vs measured ratios between GPU records that differ in one thing: LoRA vs full,
    QLoRA vs LoRA, checkpointing on vs off, micro-batch 1 vs 8 (same model, sequence, the rest
    equal)."""
    def key(o: Outcome, drop: tuple[str, ...]) -> str:
        j = {k: v for k, v in o.ref.job.items() if k not in drop}
        return json.dumps([o.ref.model.get("name"), j], sort_keys=True)

    out: list[dict[str, Any]] = []

    def pairs(kind: str, drop: tuple[str, ...], a_pred, b_pred) -> None:
        groups: dict[str, list[Outcome]] = {}
        for o in outcomes:
            groups.setdefault(key(o, drop), []).append(o)
        for g in groups.values():
            for a in g:
                if not a_pred(a.ref.job):
                    continue
                for b in g:
                    if b is a or not b_pred(b.ref.job):
                        continue
                    meas = a.measured_tps_per_gpu / b.measured_tps_per_gpu
                    pred = a.predicted_tps_per_gpu / b.predicted_tps_per_gpu
                    out.append({"kind": kind, "a": a.ref.id, "b": b.ref.id, "measured": meas, "predicted": pred,
                                "error": pred / meas - 1.0, "split": a.ref.split})

    method_drop = ("method", "precision", "lora", "quant", "base_dtype")
    pairs("lora-vs-full", method_drop, lambda j: j["method"] == "lora", lambda j: j["method"] == "full")
    pairs("qlora-vs-lora", ("method", "quant"), lambda j: j["method"] == "qlora", lambda j: j["method"] == "lora")
    pairs("gc-vs-no-gc", ("gradient_checkpointing",), lambda j: j["gradient_checkpointing"],
          lambda j: not j["gradient_checkpointing"])
    pairs("b1-vs-b8", ("micro_batch",), lambda j: j["micro_batch"] == 1, lambda j: j["micro_batch"] == 8)
    return out
