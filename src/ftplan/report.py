"""Text tables and JSON documents for people and programs.

JSON schemas are versioned (``schema`` field) and documented in ``docs/json-schemas.md``; fields
are only ever added within a major version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .job import Job, Layout
from .memory import COMPONENTS, MemoryBreakdown
from .model import ModelSpec
from .units import GB, GIB

__all__ = ["table", "fmt_bytes", "estimate_json", "estimate_text", "ESTIMATE_SCHEMA"]

ESTIMATE_SCHEMA = "ftplan.estimate/1"


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


def _job_dict(job: Job) -> dict[str, Any]:
    d = {
        "method": job.method,
        "precision": job.precision,
        "optimizer": job.optimizer,
        "micro_batch": job.micro_batch,
        "seq_len": job.seq_len,
        "grad_accum": job.grad_accum,
        "gradient_checkpointing": job.gradient_checkpointing,
        "attn_impl": job.attn_impl,
    }
    if job.low_precision:  # FP8 / NVFP4 recipe (catalog/data/precisions.json)
        d["low_precision"] = job.low_precision
    if job.uses_lora:
        d["lora"] = {"r": job.lora.r, "alpha": job.lora.alpha, "dropout": job.lora.dropout,
                     "target_modules": list(job.lora.target_modules)}
    if job.method == "qlora":
        q = job.quant
        d["quant"] = {"quant_type": q.quant_type, "double_quant": q.double_quant,
                      "compute_dtype": q.compute_dtype, "skip_modules": list(q.skip_modules)}
    return d


def _layout_dict(layout: Layout) -> dict[str, Any]:
    return {
        "gpus_per_node": layout.gpus_per_node,
        "nodes": layout.nodes,
        "strategy": layout.strategy,
        "offload_optimizer": layout.offload_optimizer,
        "offload_params": layout.offload_params,
        "tp": layout.tp,
        "pp": layout.pp,
    }


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
        "job": _job_dict(job),
        "layout": _layout_dict(layout),
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
