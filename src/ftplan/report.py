"""Text tables and JSON documents for people and programs.

The ``--json`` documents of every command (and the web app's ``/api/`` answers) are built here,
below the CLI and the web app: :func:`estimate_json`, :func:`plan_dict`, :func:`recommend_doc`,
:func:`compare_doc`, :func:`fit_doc`, :func:`models_doc`, :func:`gpus_doc`, :func:`offers_doc`.
Jobs and layouts are written by :func:`ftplan.options.job_to_dict` / ``layout_to_dict`` (from the
options schema). JSON schemas are versioned (``schema`` field) and documented in
``docs/json-schemas.md``; fields are only ever added within a major version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .job import Job, Layout
from .memory import COMPONENTS, MemoryBreakdown
from .model import ModelSpec
from .options import job_to_dict, layout_to_dict
from .units import GB, GIB

__all__ = ["table", "fmt_bytes", "estimate_json", "estimate_text", "plan_dict", "infeasible_dict",
           "recommend_doc", "compare_plans", "compare_doc", "fit_doc", "models_doc", "gpus_doc", "offers_doc",
           "ESTIMATE_SCHEMA", "RECOMMEND_SCHEMA", "COMPARE_SCHEMA", "FIT_SCHEMA", "MODELS_SCHEMA", "GPUS_SCHEMA",
           "OFFERS_SCHEMA"]

ESTIMATE_SCHEMA = "ftplan.estimate/1"
RECOMMEND_SCHEMA = "ftplan.recommend/1"
COMPARE_SCHEMA = "ftplan.compare/1"
FIT_SCHEMA = "ftplan.fit/1"
MODELS_SCHEMA = "ftplan.models/1"
GPUS_SCHEMA = "ftplan.gpus/1"
OFFERS_SCHEMA = "ftplan.offers/1"


def fmt_bytes(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:,.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n:,.0f} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A plain monospace table. ``align``: one char per column, 'l' or 'r'."""
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def estimate_json(model: ModelSpec, job: Job, layout: Layout, mem: MemoryBreakdown,
                  gpu: Any | None = None) -> dict[str, Any]:
    p = model.params
    doc: dict[str, Any] = {
        "schema": ESTIMATE_SCHEMA,
        "model": {"name": model.name, "hf_id": model.hf_id, "family": model.family},
        "params_total": p.total,
        "params_trainable": mem.params_trainable,
        "params_active": p.active,
        "params_by_category": p.by_category(),
        "job": job_to_dict(job),
        "layout": layout_to_dict(layout),
        "per_gpu": {
            "components": dict(mem.components),
            "model_states_bytes": mem.model_states_bytes,
            "peak_allocated_bytes": mem.peak_allocated_bytes,
            "peak_reserved_bytes": mem.peak_reserved_bytes,
            "device_total_bytes": mem.device_total_bytes,
            "peak_phase": mem.peak_phase,
        },
        "host_bytes": mem.host_bytes,
        "notes": list(mem.notes),
    }
    if gpu is not None:
        doc["gpu"] = {"name": gpu.name, "memory_bytes": gpu.memory_bytes}
        doc["fits"] = mem.fits(gpu.memory_bytes)
        doc["headroom_bytes"] = mem.headroom_bytes(gpu.memory_bytes)
    return doc


def estimate_text(model: ModelSpec, job: Job, layout: Layout, mem: MemoryBreakdown,
                  gpu: Any | None = None) -> str:
    p = model.params
    lines = [
        f"{model.name}  ({model.family}, {p.total:,} parameters"
        + (f", {p.active:,} active" if model.is_moe else "")
        + f"; trainable {mem.params_trainable:,})",
        f"job: {job.method}, {job.precision}, {job.optimizer}, micro-batch {job.micro_batch} x "
        f"{job.seq_len} tokens, checkpointing {'on' if job.gradient_checkpointing else 'off'}, "
        f"attention {job.attn_impl}",
        f"layout: {layout.describe()}",
        "",
    ]
    rows = []
    for name in COMPONENTS:
        v = mem.components[name]
        rows.append((name.replace("_", " "), fmt_bytes(v), f"{v / GB:,.2f}"))
    rows.append(("model states", fmt_bytes(mem.model_states_bytes), f"{mem.model_states_bytes / GB:,.2f}"))
    lines.append(table(("per GPU", "size", "GB"), rows))
    lines += [
        "",
        f"peak allocated  {fmt_bytes(mem.peak_allocated_bytes)}  ({mem.peak_phase.replace('_', '/')})",
        f"peak reserved   {fmt_bytes(mem.peak_reserved_bytes)}",
        f"device total    {fmt_bytes(mem.device_total_bytes)}  (reserved + CUDA context)",
    ]
    if mem.host_bytes:
        lines.append(f"host RAM for offload  {fmt_bytes(mem.host_bytes)}")
    if gpu is not None:
        head = mem.headroom_bytes(gpu.memory_bytes)
        verdict = "FITS" if head >= 0 else "DOES NOT FIT"
        lines.append(
            f"{gpu.name} ({fmt_bytes(gpu.memory_bytes)}): {verdict}, "
            + (f"headroom {fmt_bytes(head)}" if head >= 0 else f"short by {fmt_bytes(-head)}")
        )
    for n in mem.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# planner documents (``recommend`` / ``compare`` / ``fit`` --json, the web app's /api/)
# ---------------------------------------------------------------------------------------------
def _stale(offer, today=None) -> bool:
    import datetime as _dt

    from .catalog.offers import is_stale

    return is_stale(offer, today or _dt.date.today())


def plan_dict(p) -> dict[str, Any]:
    """One plan of a search (``plans[i]`` of ``ftplan.recommend/1``)."""
    o, r, c, m = p.offer, p.runtime, p.cost, p.memory
    return {
        "offer": {"provider": o.provider, "sku": o.sku, "gpu": o.gpu, "gpus_per_instance": o.gpus_per_instance,
                  "usd_per_gpu_hour": o.usd_per_gpu_hour, "usd_per_instance_hour": o.usd_per_instance_hour,
                  "pricing": o.pricing, "region": o.region, "inter_node_network": o.inter_node_network,
                  "inter_node_gbps": o.inter_node_gbps, "billing_granularity_s": o.billing_granularity_s,
                  "as_of": o.as_of.isoformat(), "stale": _stale(o), "source": o.source},
        "layout": layout_to_dict(p.layout),
        "strategy_label": p.strategy_label,
        "job": job_to_dict(p.job),
        "memory": {"device_total_bytes": m.device_total_bytes, "peak_allocated_bytes": m.peak_allocated_bytes,
                   "host_bytes": m.host_bytes, "gpu_memory_bytes": p.gpu.memory_bytes,
                   "components": dict(m.components)},
        "runtime": {"step_time_s": r.step_time_s, "compute_time_s": r.compute_time_s,
                    "comm_time_s": r.comm_time_s, "exposed_comm_s": r.exposed_comm_s,
                    "optimizer_time_s": r.optimizer_time_s, "dequant_time_s": r.dequant_time_s,
                    "tokens_per_s": r.tokens_per_s, "mfu": r.mfu, "flops_per_token": r.flops_per_token,
                    "tokens_per_step": r.tokens_per_step, "total_tokens": r.total_tokens, "steps": r.steps,
                    "training_hours": r.hours, "startup_hours": r.startup_hours, "total_hours": r.total_hours,
                    "breakdown": dict(r.breakdown)},
        "cost": {"instances": c.instances, "gpus_billed": c.gpus_billed, "billed_hours": c.billed_hours,
                 "usd": c.usd, "usd_per_million_tokens": c.usd_per_million_tokens,
                 "energy_kwh_upper_bound": c.energy_kwh},
        "cheapest": p.cheapest, "fastest": p.fastest, "pareto": p.pareto,
        "notes": list(p.notes),
    }


def infeasible_dict(i) -> dict[str, Any]:
    """One why-not entry (``infeasible[i]``)."""
    return {"gpu": i.gpu, "reason": i.reason, "hint": i.hint, "needed_bytes": i.needed_bytes,
            "available_bytes": i.available_bytes}


def _header_doc(schema: str, model, job, ps) -> dict[str, Any]:
    s = ps.stats
    return {"schema": schema, "model": {"name": model.name, "hf_id": model.hf_id, "params_total": model.params.total},
            "job": job_to_dict(job, data=True),
            "objective": ps.objective,
            "search": {"offers": s.offers, "gpu_types": s.gpu_types, "layouts": s.layouts,
                       "memory_evals": s.memory_evals, "runtime_evals": s.runtime_evals,
                       "candidates": s.candidates, "seconds": s.seconds, "max_gpus": s.max_gpus},
            "notes": list(ps.notes)}


def recommend_doc(model, job, ps, top: int = 10) -> dict[str, Any]:
    """The ``ftplan.recommend/1`` document of a PlanSet (``top`` plans, the Pareto frontier, why-not)."""
    doc = _header_doc(RECOMMEND_SCHEMA, model, job, ps)
    doc["plans"] = [plan_dict(p) for p in ps.top(top)]
    doc["pareto"] = [plan_dict(p) for p in ps.pareto()]
    doc["plans_total"] = len(ps.plans)
    doc["infeasible"] = [infeasible_dict(i) for i in ps.infeasible]
    return doc


def compare_plans(ps) -> tuple:
    """The best plan per GPU type, by cost of the completed job (or by time with objective time)."""
    best = ps.best_per_gpu()
    if ps.objective != "cost":
        best = tuple(sorted(best, key=lambda p: (p.hours, p.usd)))
    return best


def compare_doc(model, job, ps) -> dict[str, Any]:
    """The ``ftplan.compare/1`` document of a PlanSet."""
    doc = _header_doc(COMPARE_SCHEMA, model, job, ps)
    doc["per_gpu"] = [plan_dict(p) for p in compare_plans(ps)]
    doc["infeasible"] = [infeasible_dict(i) for i in ps.infeasible]
    return doc


def fit_doc(model, job, results, margin: float) -> dict[str, Any]:
    """The ``ftplan.fit/1`` document of a list of FitResults."""
    return {"schema": FIT_SCHEMA, "model": {"name": model.name, "hf_id": model.hf_id},
            "job": {"method": job.method, "seq_len": job.seq_len, "micro_batch": job.micro_batch,
                    "gradient_checkpointing": job.gradient_checkpointing},
            "margin": margin,
            "results": [{"gpu": r.gpu, "memory_bytes": r.memory_bytes, "usable_bytes": r.usable_bytes,
                         "fits": r.fits, "device_total_bytes": r.device_total_bytes,
                         "max_seq_len": r.max_seq_len, "max_micro_batch": r.max_micro_batch,
                         "min_gpus": r.min_gpus, "notes": list(r.notes)} for r in results]}


# ---------------------------------------------------------------------------------------------
# catalog documents (``models`` / ``gpus`` / ``offers`` --json)
# ---------------------------------------------------------------------------------------------
def models_doc(catalog) -> dict[str, Any]:
    """The ``ftplan.models/1`` document of a model catalog (name -> CatalogModel)."""
    docs = []
    for name, m in catalog.items():
        spec = m.spec()
        p = spec.params
        docs.append({"name": name, "hf_id": m.hf_id, "family": spec.family, "params_total": p.total,
                     "params_active": p.active, "layers": spec.num_layers, "hidden_size": spec.hidden_size,
                     "vocab_size": spec.vocab_size, "source": m.source})
    return {"schema": MODELS_SCHEMA, "models": docs}


def gpus_doc(gpus) -> dict[str, Any]:
    """The ``ftplan.gpus/1`` document of a GPU catalog (name -> GpuSpec)."""
    docs = []
    for g in gpus.values():
        docs.append({k: getattr(g, k) for k in (
            "name", "display_name", "vendor", "arch", "memory_bytes", "mem_bw_tbps", "bf16_tflops",
            "fp16_tflops", "tf32_tflops", "fp32_tflops", "fp8_tflops", "fp4_tflops", "tdp_w",
            "intra_node_link", "intra_node_bw_gbps", "max_gpus_per_node", "supports_bitsandbytes",
            "supports_flash_attention", "supports_fp8_training", "supports_fp4_training", "source")}
            | {"aliases": list(g.aliases)})
    return {"schema": GPUS_SCHEMA, "gpus": docs}


def offers_doc(offers, today, max_age_days: int) -> dict[str, Any]:
    """The ``ftplan.offers/1`` document of offers (in the order given)."""
    from .catalog.offers import is_stale

    return {"schema": OFFERS_SCHEMA, "today": today.isoformat(), "max_age_days": max_age_days,
            "offers": [{"provider": o.provider, "sku": o.sku, "gpu": o.gpu,
                        "gpus_per_instance": o.gpus_per_instance, "usd_per_gpu_hour": o.usd_per_gpu_hour,
                        "usd_per_instance_hour": o.usd_per_instance_hour, "pricing": o.pricing,
                        "region": o.region, "inter_node_network": o.inter_node_network,
                        "inter_node_gbps": o.inter_node_gbps, "billing_granularity_s": o.billing_granularity_s,
                        "as_of": o.as_of.isoformat(), "age_days": o.age_days(today),
                        "stale": is_stale(o, today, max_age_days), "source": o.source, "notes": o.notes}
                       for o in offers]}
