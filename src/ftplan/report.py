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

from .errors import Renderer, render_refs
from .job import Job, Layout, planned_attention
from .memory import COMPONENTS, PEAK_PHASE_TEXT, MemoryBreakdown
from .model import ModelSpec
from .options import job_to_dict, layout_to_dict
from .units import GB, GIB

__all__ = ["table", "fmt_bytes", "estimate_json", "estimate_text", "plan_dict", "infeasible_dict",
           "runtime_dict", "cost_dict", "offer_dict", "runtime_text", "rendered",
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


def rendered(notes: Sequence[str], renderer: Renderer | None = None) -> list[str]:
    """``notes`` (plan notes, hints: library text with backticked option references) as a front end
    says them: ``renderer`` writes the references (the CLI's writes flags); the default, the
    library's wording (field names), is what the JSON documents hold."""
    return [render_refs(n, renderer) for n in notes]


def estimate_json(model: ModelSpec, job: Job, layout: Layout, mem: MemoryBreakdown,
                  gpu: Any | None = None, assumptions: Sequence[Any] = (), advice: Sequence[Any] = (),
                  runtime: Any | None = None, priced: Any | None = None,
                  runtime_notes: Sequence[str] = ()) -> dict[str, Any]:
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
        "notes": rendered(mem.notes),
        "assumptions": [a.to_dict() for a in assumptions],
    }
    if gpu is not None:
        doc["gpu"] = {"name": gpu.name, "memory_bytes": gpu.memory_bytes}
        doc["fits"] = mem.fits(gpu.memory_bytes)
        doc["headroom_bytes"] = mem.headroom_bytes(gpu.memory_bytes)
        doc["runtime"] = runtime_dict(runtime) if runtime is not None else None
        if priced is not None:
            if hasattr(priced, "cost"):
                doc["priced"] = {"offer": offer_dict(priced.offer), "runtime": runtime_dict(priced.runtime),
                                 "cost": cost_dict(priced.cost)}
            else:
                doc["priced"] = {"infeasible": infeasible_dict(priced)}
        doc["runtime_notes"] = rendered(runtime_notes)
        doc["advice"] = [a.to_dict() for a in advice]
    return doc


def _band(lo: float | None, hi: float | None, fmt) -> str:
    return f" ({fmt(lo)}-{fmt(hi)})" if lo is not None and hi is not None else ""


def runtime_text(r, cost: Any | None = None, offer: Any | None = None) -> list[str]:
    """Lines of a runtime estimate (and its price): value, then the calibrated band in brackets."""
    q = r.band_quantiles
    band = f"{q[0]:.0%}-{q[1]:.0%} band of published measurements" if q else "band"
    hours_f = (lambda h: f"{h:,.2f}" if h < 100 else f"{h:,.0f}")
    lines = [
        f"step time  {r.step_time_s:,.3f} s{_band(r.step_time_s_low, r.step_time_s_high, lambda x: f'{x:,.3f}')}"
        f"  = {r.tokens_per_step:,} tokens",
        f"throughput {r.tokens_per_s:,.0f} tokens/s{_band(r.tokens_per_s_low, r.tokens_per_s_high, lambda x: f'{x:,.0f}')}"
        f", MFU {r.mfu:.0%}" + ("  (host-bound: the CPU launching kernels limits it)" if r.host_bound else ""),
    ]
    if r.hours is not None:
        lines.append(f"time       {r.total_hours:,.2f} h{_band(r.total_hours_low, r.total_hours_high, hours_f)}"
                     f" = {r.steps:,} steps x {r.step_time_s:,.3f} s + {r.startup_hours * 60:,.0f} min start-up")
    if cost is not None and offer is not None:
        lines.append(f"cost       ${cost.usd:,.2f}{_band(cost.usd_low, cost.usd_high, lambda x: f'${x:,.2f}')}"
                     f" on {cost.instances} x {offer.provider} {offer.sku} ({offer.pricing}, "
                     f"${offer.usd_per_instance_hour:,.2f}/instance-hour, as of {offer.as_of.isoformat()})")
    lines.append(f"(brackets: the {band})")
    return lines
def _precision_text(job: Job) -> str:
    """``bf16-mixed``, or ``fp8-tensorwise (torchao, on bf16-mixed)`` for an FP8/NVFP4 recipe."""
    if not job.low_precision:
        return job.precision
    from .lowprec import get_recipe

    r = get_recipe(job.low_precision)
    lib = f"{r.library}{', prototype' if r.status == 'prototype' else ''}, " if r is not None else ""
    return f"{job.low_precision} ({lib}on {job.precision})"


_CKPT_WORDS = {"none": "off", "full": "on", "full-reentrant": "on (reentrant)", "selective": "selective (op SAC)",
               "selective-attention": "selective (attention)"}


def _job_line(job: Job) -> str:
    ckpt = _CKPT_WORDS.get(job.ac_mode, f"every {job.checkpoint_every} layers")
    extra = [f"loss {job.loss}"]
    if job.base_dtype != "compute":
        extra.append(f"base loaded in {job.base_dtype}")
    if job.keep_output:
        extra.append("model output kept through backward")
    if job.activation_offloading:
        extra.append("activation offloading")
    if job.is_padding_free:
        extra.append("packed" if job.packing else "padding-free")
    elif job.padded_batches:
        extra.append("padded batches")
    return (f"job: {job.method}, {_precision_text(job)}, {job.optimizer}, micro-batch {job.micro_batch} x "
            f"{job.seq_len} tokens, checkpointing {ckpt}, attention {job.attn_impl}, " + ", ".join(extra))


def estimate_text(model: ModelSpec, job: Job, layout: Layout, mem: MemoryBreakdown,
                  gpu: Any | None = None, assumptions: Sequence[Any] = (), advice: Sequence[Any] = (),
                  renderer: Renderer | None = None, runtime: Any | None = None, priced: Any | None = None,
                  runtime_notes: Sequence[str] = ()) -> str:
    p = model.params
    lines = [
        f"{model.name}  ({model.family}, {p.total:,} parameters"
        + (f", {p.active:,} active" if model.is_moe else "")
        + f"; trainable {mem.params_trainable:,})",
        _job_line(planned_attention(model, job)[0]),  # the attention transformers will run
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
        f"peak allocated  {fmt_bytes(mem.peak_allocated_bytes)}  ({PEAK_PHASE_TEXT.get(mem.peak_phase, mem.peak_phase)})",
        f"peak reserved   {fmt_bytes(mem.peak_reserved_bytes)}",
        f"device total    {fmt_bytes(mem.device_total_bytes)}  (reserved + CUDA context + NCCL buffers)",
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
    if runtime is not None:
        lines.append("")
        if priced is not None and hasattr(priced, "cost"):
            lines += runtime_text(priced.runtime, priced.cost, priced.offer)
        else:
            lines += runtime_text(runtime)
            if priced is not None:
                lines.append(f"not priced: {render_refs(priced.message(), renderer)}")
    lines += [f"note: {n}" for n in rendered(runtime_notes, renderer)]
    lines += [f"note: {n}" for n in rendered(mem.notes, renderer)]
    if gpu is not None and advice:
        lines.append("single changes that make it fit:")
        lines += [f"  - {render_refs(a.text, renderer)}" for a in advice]
    if assumptions:
        lines.append("assumed (defaults of the reference stack; change them with the options named):")
        lines += [f"  - {render_refs(a.text, renderer)} [{render_refs(a.source, renderer)}; "
                  f"{render_refs(a.change, renderer)}]" for a in assumptions]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# planner documents (``recommend`` / ``compare`` / ``fit`` --json, the web app's /api/)
# ---------------------------------------------------------------------------------------------
def _stale(offer, today=None) -> bool:
    import datetime as _dt

    from .catalog.offers import is_stale

    return is_stale(offer, today or _dt.date.today())


def runtime_dict(r) -> dict[str, Any]:
    """A :class:`~ftplan.runtime.RuntimeEstimate` as JSON (``runtime`` of plans and estimates)."""
    return {"step_time_s": r.step_time_s, "compute_time_s": r.compute_time_s,
            "comm_time_s": r.comm_time_s, "exposed_comm_s": r.exposed_comm_s,
            "optimizer_time_s": r.optimizer_time_s, "dequant_time_s": r.dequant_time_s,
            "tokens_per_s": r.tokens_per_s, "mfu": r.mfu, "flops_per_token": r.flops_per_token,
            "tokens_per_step": r.tokens_per_step, "total_tokens": r.total_tokens, "steps": r.steps,
            "training_hours": r.hours, "startup_hours": r.startup_hours, "total_hours": r.total_hours,
            "band": {"quantiles": list(r.band_quantiles) if r.band_quantiles else None,
                     "step_time_s": [r.step_time_s_low, r.step_time_s_high],
                     "tokens_per_s": [r.tokens_per_s_low, r.tokens_per_s_high],
                     "training_hours": [r.hours_low, r.hours_high],
                     "total_hours": [r.total_hours_low, r.total_hours_high]},
            "host_bound": r.host_bound,
            "breakdown": dict(r.breakdown)}


def cost_dict(c) -> dict[str, Any]:
    """A :class:`~ftplan.cost.Cost` as JSON (``cost`` of plans and estimates)."""
    return {"instances": c.instances, "gpus_billed": c.gpus_billed, "billed_hours": c.billed_hours,
            "usd": c.usd, "usd_per_million_tokens": c.usd_per_million_tokens,
            "energy_kwh_upper_bound": c.energy_kwh, "usd_band": [c.usd_low, c.usd_high]}


def offer_dict(o) -> dict[str, Any]:
    return {"provider": o.provider, "sku": o.sku, "gpu": o.gpu, "gpus_per_instance": o.gpus_per_instance,
            "usd_per_gpu_hour": o.usd_per_gpu_hour, "usd_per_instance_hour": o.usd_per_instance_hour,
            "pricing": o.pricing, "region": o.region, "inter_node_network": o.inter_node_network,
            "inter_node_gbps": o.inter_node_gbps, "billing_granularity_s": o.billing_granularity_s,
            "as_of": o.as_of.isoformat(), "stale": _stale(o), "source": o.source}


def plan_dict(p) -> dict[str, Any]:
    """One plan of a search (``plans[i]`` of ``ftplan.recommend/1``)."""
    o, r, c, m = p.offer, p.runtime, p.cost, p.memory
    return {
        "offer": offer_dict(o),
        "layout": layout_to_dict(p.layout),
        "strategy_label": p.strategy_label,
        "job": job_to_dict(p.job),
        "memory": {"device_total_bytes": m.device_total_bytes, "peak_allocated_bytes": m.peak_allocated_bytes,
                   "host_bytes": m.host_bytes, "gpu_memory_bytes": p.gpu.memory_bytes,
                   "components": dict(m.components)},
        "runtime": runtime_dict(r),
        "cost": cost_dict(c),
        "host": host_dict(p.host) if p.host is not None else None,
        "spot": spot_dict(p.risk) if p.risk is not None else None,
        "expected_usd": p.expected_usd,
        "expected_hours": p.expected_hours,
        "cheapest": p.cheapest, "fastest": p.fastest, "pareto": p.pareto,
        "notes": rendered(p.notes),
    }


def host_dict(h) -> dict[str, Any]:
    """Host RAM / disk per node of a plan (``plans[i].host``, see ftplan.host)."""
    ck = h.checkpoint
    return {"ram_bytes": h.ram_bytes, "ram_phase": h.ram_phase, "ram_breakdown": dict(h.ram_breakdown),
            "disk_bytes": h.disk_bytes, "disk_breakdown": dict(h.disk_breakdown),
            "efficient_loading": h.efficient_loading,
            "checkpoint": {"kind": ck.kind, "weights_bytes": ck.weights_bytes, "optimizer_bytes": ck.optimizer_bytes,
                           "total_bytes": ck.total_bytes, "sharded": ck.sharded, "writers": ck.writers},
            "notes": rendered(h.notes)}


def spot_dict(r) -> dict[str, Any]:
    """Expected time and cost with preemptions on a spot offer (``plans[i].spot``, see ftplan.risk)."""
    return {"rate_per_instance_hour": r.rate_per_hour, "job_rate_per_hour": r.job_rate_per_hour,
            "rate_source": r.rate_source, "rate_basis": r.rate_basis, "rate_assumed": r.rate_assumed,
            "checkpoint_bytes": r.checkpoint_bytes, "checkpoint_write_s": r.checkpoint_write_s,
            "checkpoint_interval_hours": r.interval_hours, "checkpoint_interval_optimal": r.interval_optimal,
            "restart_s": r.restart_s, "capacity_wait_s": r.capacity_wait_s,
            "expected_preemptions": r.expected_preemptions, "p_no_preemption": r.p_no_preemption,
            "expected_hours": r.expected_hours, "expected_billed_hours": r.expected_billed_hours,
            "expected_usd": r.expected_usd, "uninterrupted_usd": r.uninterrupted_usd,
            "overhead_fraction": r.overhead_fraction}


def dataset_text(profile, batches=None, renderer: Renderer | None = None) -> str:
    """The dataset summary and length histogram under a text table (``renderer``: see
    :func:`rendered`)."""
    s = profile.summary()
    lines = [f"dataset: {s['path']} ({s['format']}, {s['kind']}), {s['samples']:,} samples, "
             f"{s['total_tokens']:,} tokens ({s['counter']})"
             + (f"; sampled: {s['sampling']}" if s["sampled"] else ""),
             f"  lengths: p50 {s['p50']:,}, p90 {s['p90']:,}, p95 {s['p95']:,}, p99 {s['p99']:,}, max {s['max']:,}"]
    total = max(1, profile.measured)
    for lo, hi, n in profile.histogram():
        lines.append(f"  {lo:>8,} - {hi:<8,} {n:>9,} {'#' * max(0, round(40 * n / total))}")
    if batches is not None:
        b = batches
        lines.append(f"batches ({b.batching}, max length {b.max_length}, micro-batch {b.micro_batch}): largest "
                     f"{b.peak_rows} x {b.peak_seq_len} tokens; {b.real_tokens:,} real / {b.computed_tokens:,} "
                     f"computed tokens per epoch ({b.padding_fraction:.0%} padding), {b.truncated_samples:,} samples "
                     f"truncated")
    lines += [f"  note: {n}" for n in rendered(profile.notes + (batches.notes if batches is not None else ()), renderer)]
    return "\n".join(lines)


def dataset_dict(profile, batches=None) -> dict[str, Any]:
    """The data a plan was made from (``dataset`` of the search / estimate documents)."""
    doc: dict[str, Any] = dict(profile.summary())
    doc["histogram"] = [{"low": lo, "high": hi, "count": n} for lo, hi, n in profile.histogram()]
    doc["notes"] = rendered(profile.notes)
    if batches is not None:
        doc["batches"] = batches.summary()
        doc["batches"]["notes"] = rendered(batches.notes)
    return doc


def infeasible_dict(i) -> dict[str, Any]:
    """One why-not entry (``infeasible[i]``)."""
    return {"gpu": i.gpu, "reason": render_refs(i.reason), "hint": render_refs(i.hint) if i.hint else i.hint,
            "needed_bytes": i.needed_bytes,
            "available_bytes": i.available_bytes}


def search_assumptions(job: Job, model: ModelSpec | None = None) -> tuple:
    """The defaults a search rests on (the search itself picks checkpointing on/off and the
    micro-batch per plan, so those are not assumptions). ``model``: where a default depends on the
    architecture (attention without an sdpa path)."""
    from .advice import job_assumptions

    return tuple(a for a in job_assumptions(job, model=model)
                 if a.field not in ("gradient_checkpointing", "micro_batch"))


def _header_doc(schema: str, model, job, ps) -> dict[str, Any]:
    s = ps.stats
    return {"schema": schema, "model": {"name": model.name, "hf_id": model.hf_id, "params_total": model.params.total},
            "job": job_to_dict(job, data=True),
            "objective": ps.objective,
            "search": {"offers": s.offers, "gpu_types": s.gpu_types, "layouts": s.layouts,
                       "memory_evals": s.memory_evals, "runtime_evals": s.runtime_evals,
                       "candidates": s.candidates, "seconds": s.seconds, "max_gpus": s.max_gpus},
            "notes": rendered(ps.notes),
            "assumptions": [a.to_dict() for a in search_assumptions(job, model)]}


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


def precision_speedups(ps) -> list[tuple[Any, Any, float | None]]:
    """(plan, the same GPU's best base-precision plan or None, tokens/s-per-GPU speedup over it)
    for the best plan of each (GPU type, precision): what each precision contributes."""
    best = ps.best_per_gpu_precision()
    base = {p.gpu.name: p for p in best if not p.job.low_precision}
    out = []
    for p in best:
        b = base.get(p.gpu.name)
        speed = None
        if b is not None and b.runtime.tokens_per_s > 0:
            speed = (p.runtime.tokens_per_s / p.layout.world_size) / (b.runtime.tokens_per_s / b.layout.world_size)
        out.append((p, b, speed))
    return out


def same_layout_speedup(model, plan) -> float | None:
    """What the plan's low-precision recipe alone contributes: its tokens/s over the same job in the
    base precision on the same GPU, layout and micro-batch (step time only: the base-precision job
    need not fit there). None for a base-precision plan."""
    if not plan.job.low_precision:
        return None
    from .runtime import estimate_runtime

    base = plan.job.with_(precision=plan.job.precision, low_precision=None)
    offer = plan.offer if plan.layout.nodes > 1 else None
    rt = estimate_runtime(model, base, plan.layout, plan.gpu, offer=offer)
    return plan.runtime.tokens_per_s / rt.tokens_per_s if rt.tokens_per_s > 0 else None


def compare_doc(model, job, ps) -> dict[str, Any]:
    """The ``ftplan.compare/1`` document of a PlanSet."""
    doc = _header_doc(COMPARE_SCHEMA, model, job, ps)
    doc["per_gpu"] = [plan_dict(p) for p in compare_plans(ps)]
    if any(p.job.low_precision for p in ps.plans):
        # best plan per (GPU, precision) and its tokens/s-per-GPU speedup over the GPU's base plan
        doc["per_gpu_precision"] = [{"gpu": p.gpu.name, "precision": p.job.precision_label,
                                     "plan": plan_dict(p), "speedup_vs_base": sp,
                                     "speedup_same_layout": same_layout_speedup(model, p),
                                     "base_precision": b.job.precision if b is not None else None}
                                    for p, b, sp in precision_speedups(ps)]
    doc["infeasible"] = [infeasible_dict(i) for i in ps.infeasible]
    return doc


def fit_doc(model, job, results, margin: float) -> dict[str, Any]:
    """The ``ftplan.fit/1`` document of a list of FitResults."""
    return {"schema": FIT_SCHEMA, "model": {"name": model.name, "hf_id": model.hf_id},
            "job": {"method": job.method, "seq_len": job.seq_len, "micro_batch": job.micro_batch,
                    "gradient_checkpointing": job.gradient_checkpointing, "checkpointing": job.checkpointing,
                    "activation_offloading": job.activation_offloading, "loss": job.loss},
            "margin": margin,
            "results": [{"gpu": r.gpu, "memory_bytes": r.memory_bytes, "usable_bytes": r.usable_bytes,
                         "fits": r.fits, "device_total_bytes": r.device_total_bytes,
                         "max_seq_len": r.max_seq_len, "max_micro_batch": r.max_micro_batch,
                         "min_gpus": r.min_gpus, "notes": rendered(r.notes),
                         "advice": [a.to_dict() for a in r.advice],
                         "seq_len_cutoffs": [{"keep_pct": k, "seq_len": v} for k, v in r.seq_len_cutoffs.items()]}
                        for r in results]}


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
