"""CLI commands of the planner: recommend, compare, fit, gpus, offers.

Wired into ``ftplan.cli`` by ``_add_planner_commands(sub)`` calling ``add_planner_commands(sub)``.
Each command is a thin layer over ``ftplan.planner`` / the catalogs; ``--json`` documents carry a
``schema`` field (see ``docs/json-schemas.md``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from typing import Any

from .cli import add_job_options, job_from_args
from .errors import ConfigError

__all__ = ["add_planner_commands", "RECOMMEND_SCHEMA", "COMPARE_SCHEMA", "FIT_SCHEMA", "GPUS_SCHEMA",
           "OFFERS_SCHEMA", "plan_dict", "recommend_doc", "compare_plans", "compare_doc", "fit_doc",
           "gpus_doc", "offers_doc"]

RECOMMEND_SCHEMA = "ftplan.recommend/1"
COMPARE_SCHEMA = "ftplan.compare/1"
FIT_SCHEMA = "ftplan.fit/1"
GPUS_SCHEMA = "ftplan.gpus/1"
OFFERS_SCHEMA = "ftplan.offers/1"


def _csv(text: str | None) -> list[str] | None:
    if not text:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items or None


def _float(text: str) -> float:
    try:
        return float(text.strip().lstrip("$").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _emit(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------
def _add_offer_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("offers")
    g.add_argument("--offers", action="append", default=[], metavar="FILE",
                   help="extra offers CSV (repeatable), same columns as the bundled offers.csv")
    g.add_argument("--skypilot-catalog", action="append", default=[], metavar="FILE",
                   help="a SkyPilot catalog vms.csv to import offers from (repeatable)")
    g.add_argument("--no-bundled-offers", action="store_true", help="use only --offers/--skypilot-catalog")
    g.add_argument("--providers", default=None, help="comma-separated providers, e.g. aws,lambda")
    g.add_argument("--gpus-filter", default=None, help="comma-separated GPU names, e.g. h100-sxm,b200")
    g.add_argument("--pricing", default="on-demand",
                   help="on-demand (default) | spot | reserved | any, or a comma-separated list")


def _add_search_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search")
    g.add_argument("--objective", default="cost", help="cost (default) | time")
    g.add_argument("--deadline", type=_float, default=None, metavar="HOURS")
    g.add_argument("--budget", type=_float, default=None, metavar="USD")
    g.add_argument("--max-gpus", type=_int, default=None, metavar="N")
    g.add_argument("--global-batch", type=_int, default=None, metavar="SEQS",
                   help="sequences per optimizer step to keep (grad-accum is chosen per plan)")
    g.add_argument("--margin", type=_float, default=0.05, help="memory safety margin (default 0.05)")
    g.add_argument("--top", type=_int, default=10, metavar="N", help="plans to print (default 10)")
    g.add_argument("--json", action="store_true")


def add_planner_commands(sub) -> None:
    """Add recommend / compare / fit / gpus / offers to an argparse sub-parser set."""
    for name, helptext, func in (
        ("recommend", "rank plans (offer, layout, batch) by cost or time, with why-not reasons",
         cmd_recommend),
        ("compare", "best plan per accelerator type, ranked by cost of the completed job", cmd_compare),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("model", help="catalog name, hub id, or path to config.json")
        add_job_options(s)
        _add_offer_options(s)
        _add_search_options(s)
        s.add_argument("--plot", default=None, metavar="FILE",
                       help="also draw cost vs time of every plan to FILE.png or FILE.svg (needs ftplan[plot])")
        s.set_defaults(func=func)

    s = sub.add_parser("fit", help="longest sequence, largest micro-batch and fewest GPUs on a GPU type")
    s.add_argument("model", help="catalog name, hub id, or path to config.json")
    add_job_options(s)
    s.add_argument("--gpu", required=True, action="append", help="GPU name (repeatable)")
    s.add_argument("--margin", type=_float, default=0.05)
    s.add_argument("--max-gpus", type=_int, default=1024)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_fit)

    s = sub.add_parser("gpus", help="list the GPU catalog")
    s.add_argument("--gpus-file", default=None, metavar="FILE", help="a GPU CSV instead of the bundled one")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_gpus)

    s = sub.add_parser("offers", help="list and filter offers; flags stale prices")
    _add_offer_options(s)
    s.set_defaults(pricing="any")
    s.add_argument("--max-age-days", type=_int, default=120, help="older prices are flagged stale")
    s.add_argument("--sort", default="price", help="price (per GPU-hour, default) | provider | gpu | age")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_offers)


# ---------------------------------------------------------------------------------------------
# shared plumbing
# ---------------------------------------------------------------------------------------------
def _pricing(a: argparse.Namespace) -> list[str] | None:
    if not a.pricing or a.pricing.strip().lower() in ("any", "all"):
        return None
    return _csv(a.pricing.lower())


def _load_offers(a: argparse.Namespace) -> list:
    from .catalog.offers import filter_offers, import_skypilot_catalog, load_offers

    offers = list(load_offers(a.offers or None, include_bundled=not a.no_bundled_offers))
    for path in a.skypilot_catalog:
        offers.extend(import_skypilot_catalog(path))
    if not offers:
        raise ConfigError("no offers to search", "drop --no-bundled-offers or pass --offers FILE")
    return filter_offers(offers, providers=_csv(a.providers), gpus=_csv(a.gpus_filter), pricing=_pricing(a))


def _progress():
    if not sys.stderr.isatty():
        return None

    def show(i: int, n: int) -> None:
        end = "\n" if i >= n else ""
        sys.stderr.write(f"\rsearching GPU types {i}/{n}" + end)
        sys.stderr.flush()

    return show


def _run_search(a: argparse.Namespace):
    from .catalog.models import resolve_model
    from .planner import recommend

    model = resolve_model(a.model)
    job = job_from_args(a, model)
    if a.objective not in ("cost", "time"):
        raise ConfigError(f"unknown objective {a.objective!r}", "use --objective cost or time")
    if a.top < 0:
        raise ConfigError(f"--top must be >= 0 (got {a.top})", "e.g. --top 10")
    offers = _load_offers(a)
    ps = recommend(model, job, offers, objective=a.objective, deadline_hours=a.deadline,
                   budget_usd=a.budget, max_gpus=a.max_gpus, safety_margin=a.margin,
                   global_batch=a.global_batch, progress=_progress())
    return model, job, ps


def _stale(offer, today=None) -> bool:
    from .catalog.offers import is_stale

    return is_stale(offer, today or _dt.date.today())


def plan_dict(p) -> dict[str, Any]:
    from .report import _job_dict, _layout_dict

    o, r, c, m = p.offer, p.runtime, p.cost, p.memory
    return {
        "offer": {"provider": o.provider, "sku": o.sku, "gpu": o.gpu, "gpus_per_instance": o.gpus_per_instance,
                  "usd_per_gpu_hour": o.usd_per_gpu_hour, "usd_per_instance_hour": o.usd_per_instance_hour,
                  "pricing": o.pricing, "region": o.region, "inter_node_network": o.inter_node_network,
                  "inter_node_gbps": o.inter_node_gbps, "billing_granularity_s": o.billing_granularity_s,
                  "as_of": o.as_of.isoformat(), "stale": _stale(o), "source": o.source},
        "layout": _layout_dict(p.layout),
        "strategy_label": p.strategy_label,
        "job": _job_dict(p.job),
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


def _infeasible_dict(i) -> dict[str, Any]:
    return {"gpu": i.gpu, "reason": i.reason, "hint": i.hint, "needed_bytes": i.needed_bytes,
            "available_bytes": i.available_bytes}


def _header_doc(schema: str, model, job, ps) -> dict[str, Any]:
    from .report import _job_dict

    s = ps.stats
    return {"schema": schema, "model": {"name": model.name, "hf_id": model.hf_id, "params_total": model.params.total},
            "job": {**_job_dict(job), "dataset_tokens": job.dataset_tokens, "epochs": job.epochs},
            "objective": ps.objective,
            "search": {"offers": s.offers, "gpu_types": s.gpu_types, "layouts": s.layouts,
                       "memory_evals": s.memory_evals, "runtime_evals": s.runtime_evals,
                       "candidates": s.candidates, "seconds": s.seconds, "max_gpus": s.max_gpus},
            "notes": list(ps.notes)}


def _flags(p) -> str:
    out = []
    if p.cheapest:
        out.append("cheapest")
    if p.fastest:
        out.append("fastest")
    if p.pareto:
        out.append("pareto")
    return ",".join(out)


def _plan_rows(plans, mark_stale=True):
    rows = []
    for i, p in enumerate(plans, 1):
        lo = p.layout
        gpus = f"{lo.gpus_per_node}x{lo.nodes}" if lo.nodes > 1 else f"{lo.gpus_per_node}"
        kwh = p.cost.energy_kwh
        sku = p.offer.sku + (" (stale)" if mark_stale and _stale(p.offer) else "")
        rows.append((i, p.offer.provider, sku, p.gpu.name, gpus, p.strategy_label, p.job.micro_batch,
                     p.job.grad_accum, "on" if p.job.gradient_checkpointing else "off",
                     f"{p.memory.device_total_bytes / 1e9:,.1f}/{p.gpu.memory_bytes / 1e9:,.0f}",
                     f"{p.runtime.tokens_per_s:,.0f}", f"{p.runtime.mfu:.0%}", f"{p.hours:,.2f}",
                     f"{p.usd:,.2f}", f"{kwh:,.1f}" if kwh is not None else "?", _flags(p)))
    return rows


_PLAN_HEADERS = ("#", "provider", "sku", "gpu", "gpus[xnodes]", "strategy", "mb", "ga", "ckpt",
                 "GB/GPU", "tok/s", "MFU", "hours", "$", "kWh", "flags")


def _summary_lines(model, job, ps) -> list[str]:
    s = ps.stats
    toks = job.dataset_tokens * job.epochs
    return [
        f"{model.summary()}",
        f"job: {job.method}, seq {job.seq_len}, {toks / 1e6:,.1f}M tokens"
        + (f" ({job.epochs:g} epochs)" if job.epochs != 1 else "")
        + f"; objective: {ps.objective}",
        f"searched {s.offers} offers on {s.gpu_types} GPU types, {s.candidates} candidates "
        f"({s.memory_evals} memory evaluations) in {s.seconds:.2f} s",
    ]


def _footer_lines(ps) -> list[str]:
    lines = []
    if ps.infeasible:
        lines += ["", "why not:"]
        for i in ps.infeasible:
            lines.append(f"  {i.gpu}: {i.message()}")
    lines += ["", "hours = training + start-up (provisioning, checkpoint download); $ = instances x price x "
              "hours rounded up to the billing granularity; kWh = GPUs x board power (TDP) x hours, an upper bound."]
    for n in ps.notes:
        lines.append(f"note: {n}")
    return lines


# ---------------------------------------------------------------------------------------------
# --json documents (shared with the web app's /api/)
# ---------------------------------------------------------------------------------------------
def recommend_doc(model, job, ps, top: int = 10) -> dict[str, Any]:
    """The ``ftplan.recommend/1`` document of a PlanSet (``top`` plans, the Pareto frontier, why-not)."""
    doc = _header_doc(RECOMMEND_SCHEMA, model, job, ps)
    doc["plans"] = [plan_dict(p) for p in ps.top(top)]
    doc["pareto"] = [plan_dict(p) for p in ps.pareto()]
    doc["plans_total"] = len(ps.plans)
    doc["infeasible"] = [_infeasible_dict(i) for i in ps.infeasible]
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
    doc["infeasible"] = [_infeasible_dict(i) for i in ps.infeasible]
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


# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
def _check_plot(a: argparse.Namespace) -> None:
    if getattr(a, "plot", None):
        from .plot import check_plot_path

        check_plot_path(a.plot)  # before the search: bad extension / no matplotlib -> one line


def _write_plot(a: argparse.Namespace, model, job, ps) -> None:
    if getattr(a, "plot", None):
        from .plot import plot_search

        plot_search(a.plot, model, job, ps, command=a.command)
        print(f"wrote {a.plot}", file=sys.stderr)


def cmd_recommend(a: argparse.Namespace) -> int:
    from .report import table

    _check_plot(a)
    model, job, ps = _run_search(a)
    _write_plot(a, model, job, ps)
    if a.json:
        _emit(recommend_doc(model, job, ps, a.top))
        return 0
    lines = _summary_lines(model, job, ps) + [""]
    if ps.plans:
        lines.append(table(_PLAN_HEADERS, _plan_rows(ps.top(a.top)), "rllllrrlrrrrrrrl"))
        extra = [p for p in ps.pareto() if p not in ps.top(a.top)]
        if extra:
            lines += ["", "other Pareto plans (cost vs time):",
                      table(_PLAN_HEADERS, _plan_rows(extra), "rllllrrlrrrrrrrl")]
    else:
        lines.append("no plan fits the constraints")
    lines += _footer_lines(ps)
    print("\n".join(lines))
    return 0 if ps.plans else 3


def cmd_compare(a: argparse.Namespace) -> int:
    from .report import table

    a.objective = "cost" if a.objective == "cost" else a.objective
    _check_plot(a)
    model, job, ps = _run_search(a)
    _write_plot(a, model, job, ps)
    best = compare_plans(ps)
    if a.json:
        _emit(compare_doc(model, job, ps))
        return 0
    rows = []
    for i, p in enumerate(best, 1):
        per_m = p.cost.usd_per_million_tokens
        rows.append((i, p.gpu.name, p.offer.provider, p.offer.sku, p.layout.world_size, p.strategy_label,
                     f"{p.offer.usd_per_gpu_hour:,.2f}", f"{p.runtime.tokens_per_s / p.layout.world_size:,.0f}",
                     f"{p.hours:,.2f}", f"{p.usd:,.2f}", f"{per_m:,.3f}" if per_m is not None else "?",
                     f"{p.cost.energy_kwh:,.1f}" if p.cost.energy_kwh is not None else "?"))
    lines = _summary_lines(model, job, ps) + [""]
    if rows:
        lines.append(table(("#", "gpu", "provider", "sku", "gpus", "strategy", "$/GPU-h", "tok/s/GPU",
                            "hours", "job $", "$/Mtok", "kWh"), rows, "rllllrlrrrrr"))
    else:
        lines.append("no plan fits the constraints")
    lines += _footer_lines(ps)
    print("\n".join(lines))
    return 0 if rows else 3


def cmd_fit(a: argparse.Namespace) -> int:
    from .catalog.gpus import get_gpu
    from .catalog.models import resolve_model
    from .planner import fit
    from .report import table

    model = resolve_model(a.model)
    job = job_from_args(a, model)
    results = [fit(model, job, get_gpu(g), safety_margin=a.margin, max_gpus=a.max_gpus) for g in a.gpu]
    if a.json:
        _emit(fit_doc(model, job, results, a.margin))
        return 0
    lines = [model.summary(),
             f"job: {job.method}, micro-batch {job.micro_batch} x {job.seq_len}, checkpointing "
             f"{'on' if job.gradient_checkpointing else 'off'}; margin {a.margin:.0%}", ""]
    for r in results:
        need = f"{r.device_total_bytes / 1e9:,.1f} GB" if r.device_total_bytes is not None else "?"
        lines.append(f"{r.gpu} ({r.memory_bytes / 1e9:,.1f} GB, {r.usable_bytes / 1e9:,.1f} usable): "
                     f"{'FITS' if r.fits else 'does not fit'} on one GPU (needs {need})")
        lines.append(f"  longest sequence on one GPU: {r.max_seq_len if r.max_seq_len else 'none'}")
        lines.append(f"  largest micro-batch on one GPU at seq {job.seq_len}: "
                     f"{r.max_micro_batch if r.max_micro_batch else 'none'}")
        rows = [(k, v if v is not None else f"> {a.max_gpus}") for k, v in r.min_gpus.items()]
        lines.append(table(("strategy", "fewest GPUs"), rows, "lr"))
        lines += [f"  note: {n}" for n in r.notes] + [""]
    print("\n".join(lines).rstrip())
    return 0


def cmd_gpus(a: argparse.Namespace) -> int:
    from .catalog.gpus import load_gpus
    from .report import table

    gpus = load_gpus(a.gpus_file)
    if a.json:
        _emit(gpus_doc(gpus))
        return 0
    rows = []
    for g in gpus.values():
        def f(x):
            return "" if x is None else f"{x:,.0f}"
        rows.append((g.name, g.vendor, g.arch, f"{g.memory_bytes / 1e9:,.1f}", f"{g.mem_bw_tbps:.2f}",
                     f(g.bf16_tflops), f(g.fp8_tflops), f(g.tdp_w), f"{g.intra_node_bw_gbps:,.0f}",
                     "y" if g.supports_bitsandbytes else "n", "y" if g.supports_flash_attention else "n"))
    print(table(("name", "vendor", "arch", "GB", "TB/s", "bf16 TF", "fp8 TF", "TDP W", "link GB/s", "bnb",
                 "flash"), rows, "lllrrrrrrll"))
    print("\nTFLOPS are dense peaks (bf16/fp16: FP32-accumulate rate); link = per-GPU per-direction GB/s inside a node.")
    return 0


def cmd_offers(a: argparse.Namespace) -> int:
    from .report import table

    offers = _load_offers(a)
    today = _dt.date.today()
    keys = {"price": lambda o: (o.usd_per_gpu_hour, o.provider), "provider": lambda o: (o.provider.lower(), o.sku),
            "gpu": lambda o: (o.gpu, o.usd_per_gpu_hour), "age": lambda o: (o.as_of, o.provider)}
    if a.sort not in keys:
        raise ConfigError(f"unknown sort {a.sort!r}", "use price, provider, gpu or age")
    from .catalog.offers import is_stale

    offers = sorted(offers, key=keys[a.sort])
    if a.json:
        _emit(offers_doc(offers, today, a.max_age_days))
        return 0
    rows = []
    n_stale = 0
    for o in offers:
        stale = is_stale(o, today, a.max_age_days)
        n_stale += stale
        rows.append((o.provider, o.sku, o.gpu, o.gpus_per_instance, f"{o.usd_per_gpu_hour:,.3f}",
                     f"{o.usd_per_instance_hour:,.2f}", o.pricing,
                     f"{o.inter_node_gbps:,.0f}" if o.inter_node_gbps else "-",
                     o.as_of.isoformat(), "STALE" if stale else ""))
    print(table(("provider", "sku", "gpu", "gpus", "$/GPU-h", "$/inst-h", "pricing", "net Gb/s", "as of", ""),
                rows, "lllrrrlrll"))
    print(f"\n{len(offers)} offers; {n_stale} with prices older than {a.max_age_days} days (as of {today}).")
    return 0
