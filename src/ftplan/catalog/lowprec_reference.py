"""Published FP8 / FP4 training speedups (``data/lowprec_reference.json``) and ftplan's prediction
for each: loading, validation, one predicted speedup per point.

Shared by ``scripts/calibrate.py lowprec`` (fits ``efficiency_vs_bf16`` of the recipes a point
``calibrates``), ``tests/test_lowprec_runtime.py`` and ``benchmarks/runtime_accuracy.py``. Pure
standard library; nothing is read at import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from types import SimpleNamespace
from typing import Any

from ..errors import CatalogError

__all__ = ["LowPrecisionPoint", "load_points", "predicted_speedup", "published_speedup"]

KINDS = ("speedup", "gpu_ratio", "linear")


@dataclass(frozen=True)
class LowPrecisionPoint:
    id: str
    kind: str
    precision: str
    gpu: str
    tolerance: float
    source: str
    raw: dict

    @property
    def calibrates(self) -> str | None:
        return self.raw.get("calibrates")

    @property
    def bound(self) -> str | None:
        return self.raw.get("bound")


def load_points(data: Any | None = None, where: str = "lowprec_reference.json") -> list[LowPrecisionPoint]:
    if data is None:
        path = resources.files("ftplan.catalog") / "data" / "lowprec_reference.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CatalogError(f"cannot read bundled {where}: {e}") from None
    out = []
    for i, p in enumerate(data.get("points") or []):
        w = f"{where}: point {i} ({p.get('id')!r})"
        if p.get("kind") not in KINDS:
            raise CatalogError(f"{w}: kind must be one of {', '.join(KINDS)}")
        if not p.get("source") or not p.get("precision") or not p.get("gpu"):
            raise CatalogError(f"{w}: needs source, precision and gpu")
        if ("speedup" in p) == ("speedup_range" in p):
            raise CatalogError(f"{w}: give exactly one of speedup / speedup_range")
        tol = p.get("tolerance")
        if not isinstance(tol, (int, float)) or not 0 < tol < 0.5:
            raise CatalogError(f"{w}: tolerance must be in (0, 0.5)")
        if p["kind"] != "linear" and not (isinstance(p.get("job"), dict) and isinstance(p.get("layout"), dict)):
            raise CatalogError(f"{w}: needs job and layout")
        out.append(LowPrecisionPoint(p["id"], p["kind"], p["precision"], p["gpu"], float(tol), p["source"], p))
    return out


def published_speedup(p: LowPrecisionPoint) -> float:
    """The published figure (the middle of a published range)."""
    if "speedup" in p.raw:
        return float(p.raw["speedup"])
    lo, hi = p.raw["speedup_range"]
    return (float(lo) + float(hi)) / 2.0


def _gpu(name: str, overrides: dict | None):
    from .gpus import load_gpus
    from .runtime_reference import GpuVariant

    g = load_gpus()[name]
    return GpuVariant(g, overrides) if overrides else g


def predicted_speedup(p: LowPrecisionPoint, eff: Any | None = None) -> float:
    """ftplan's prediction of the point's published figure (tokens/s ratio, or one linear's time ratio)."""
    from ..job import Job, Layout
    from ..runtime import estimate_runtime
    from .models import resolve_model

    raw = p.raw
    if p.kind == "linear":
        return _linear_speedup(p)
    model = resolve_model(raw["model"])
    base = Job(**raw["job"])
    low = base.with_(precision=p.precision, **(raw.get("low_job") or {}))
    lay = Layout(**raw["layout"])
    offer = SimpleNamespace(inter_node_gbps=raw["inter_node_gbps"]) if raw.get("inter_node_gbps") else None
    gpu = _gpu(p.gpu, raw.get("gpu_overrides"))
    if p.kind == "gpu_ratio":
        other = _gpu(raw["baseline_gpu"], None)
        a = estimate_runtime(model, low, lay, gpu, offer=offer, eff=eff)
        b = estimate_runtime(model, low, lay, other, offer=offer, eff=eff)
        return a.tokens_per_s / b.tokens_per_s
    a = estimate_runtime(model, low, lay, gpu, offer=offer, eff=eff)
    b = estimate_runtime(model, base, lay, gpu, offer=offer, eff=eff)
    return a.tokens_per_s / b.tokens_per_s


def _linear_speedup(p: LowPrecisionPoint) -> float:
    """One converted ``nn.Linear`` (m x k) @ (k x n), forward + backward (3 GEMMs): bf16 time over
    FP8 time with the recipe's quantize passes, the runtime model's GEMM and quantize terms."""
    from ..catalog.efficiency import efficiency
    from ..job import Job
    from ..lowprec import get_recipe
    from ..runtime import linear_time, rates_for

    raw = p.raw
    m, k, n = int(raw["m"]), int(raw["k"]), int(raw["n"])
    gpu = _gpu(p.gpu, raw.get("gpu_overrides"))
    eff = efficiency()
    job = Job(method="full", precision=p.precision)
    r = get_recipe(job.low_precision)
    rates = rates_for(gpu, job, eff)
    t16 = linear_time(m, k, n, rates)
    t8 = linear_time(m, k, n, rates, low_precision=True,
                     low_precision_wgrad=bool(r.low_precision_gemms.get("wgrad", True)))
    rin, win = r.cast_traffic.get("input", (0, 0))
    rgo, wgo = r.cast_traffic.get("grad_output", (0, 0))
    rw, ww = r.cast_traffic.get("weight", (0, 0))
    q = (rin * 2 * m * k + win * r.input.tensor_bytes(m, k) + rgo * 2 * m * n + wgo * r.grad_output.tensor_bytes(m, n)
         + rw * 2 * k * n + ww * r.weight.tensor_bytes(n, k))
    return t16 / (t8 + float(q) / rates.hbm_bytes_per_s)
