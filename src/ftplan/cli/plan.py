"""Planning commands: estimate, recommend, compare, fit.

Each is a thin layer over :mod:`ftplan.api`: flags -> ``api.<command>(model, **options)`` ->
the result's text table or its ``--json`` document (``docs/json-schemas.md``).
"""

from __future__ import annotations

import argparse
import sys

from .. import api
from ..errors import render_refs
from ..options import DATA_OPTIONS, FIT_OPTIONS, JOB_OPTIONS, LAYOUT_OPTIONS, OFFER_OPTIONS, SEARCH_OPTIONS
from ..report import precision_speedups, rendered, same_layout_speedup, search_assumptions, table
from .options import RENDERER, Command, add_options, emit_json, values

__all__ = ["COMMANDS", "add_job_options", "add_layout_options", "add_search_options", "progress"]

MODEL_HELP = "catalog name, hub id, or path to config.json"


def add_job_options(p: argparse.ArgumentParser) -> None:
    add_options(p, JOB_OPTIONS, "job")


def add_layout_options(p: argparse.ArgumentParser) -> None:
    add_options(p, LAYOUT_OPTIONS, "layout")


def add_search_options(p: argparse.ArgumentParser) -> None:
    """Offer and search options of recommend / compare / export, and --json."""
    add_options(p, OFFER_OPTIONS, "offers")
    add_options(p, SEARCH_OPTIONS, "search")
    p.add_argument("--json", action="store_true")


def progress():
    """A progress line on a terminal (the search over GPU types), else None."""
    if not sys.stderr.isatty():
        return None

    def show(i: int, n: int) -> None:
        end = "\n" if i >= n else ""
        sys.stderr.write(f"\rsearching GPU types {i}/{n}" + end)
        sys.stderr.flush()

    return show


def _check_plot(a: argparse.Namespace) -> None:
    if getattr(a, "plot", None):
        from ..plot import check_plot_path

        check_plot_path(a.plot)  # before any work: bad extension / no matplotlib -> one line


# ---------------------------------------------------------------------------------------------
# estimate
# ---------------------------------------------------------------------------------------------
def run_estimate(a: argparse.Namespace) -> int:
    _check_plot(a)
    est = api.estimate(a.model, gpu=a.gpu, **values(a, JOB_OPTIONS, LAYOUT_OPTIONS, DATA_OPTIONS))
    if a.json:
        emit_json(est.to_dict())
    else:
        print(est.text(RENDERER))
    if a.plot:
        from ..plot import plot_breakdown

        plot_breakdown(est.to_dict(), a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    return 0


def _estimate_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", help=MODEL_HELP)
    add_job_options(s)
    add_layout_options(s)
    add_options(s, DATA_OPTIONS, "data")
    s.add_argument("--gpu", default=None,
                   help="GPU name (e.g. h100-sxm): say whether it fits, and this layout's step time, tokens/s and "
                        "MFU (with --tokens: hours and cost on the cheapest matching on-demand offer)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--plot", default=None, metavar="FILE",
                   help="also draw the breakdown to FILE.png or FILE.svg (needs ftplan[plot])")


# ---------------------------------------------------------------------------------------------
# recommend / compare
# ---------------------------------------------------------------------------------------------
def _stale(offer) -> bool:
    import datetime as _dt

    from ..catalog.offers import is_stale

    return is_stale(offer, _dt.date.today())


def _flags(p) -> str:
    return ",".join(f for f, on in (("cheapest", p.cheapest), ("fastest", p.fastest), ("pareto", p.pareto)) if on)


def _plan_rows(plans, mark_stale=True):
    rows = []
    for i, p in enumerate(plans, 1):
        lo = p.layout
        gpus = f"{lo.gpus_per_node}x{lo.nodes}" if lo.nodes > 1 else f"{lo.gpus_per_node}"
        kwh = p.cost.energy_kwh
        sku = p.offer.sku + (" (stale)" if mark_stale and _stale(p.offer) else "")
        host = f"{p.host.ram_bytes / 2**30:,.0f}/{p.host.disk_bytes / 1e9:,.0f}" if p.host is not None else "?"
        spot = (f"{p.expected_usd:,.2f} ({p.risk.expected_preemptions:.2f})" if p.risk is not None else "")
        rows.append((i, p.offer.provider, sku, p.gpu.name, gpus, p.strategy_label, p.job.micro_batch,
                     p.job.grad_accum, "on" if p.job.gradient_checkpointing else "off",
                     f"{p.memory.device_total_bytes / 1e9:,.1f}/{p.gpu.memory_bytes / 1e9:,.0f}", host,
                     f"{p.runtime.tokens_per_s:,.0f}", f"{p.runtime.mfu:.0%}", f"{p.hours:,.2f}",
                     f"{p.usd:,.2f}", spot, f"{kwh:,.1f}" if kwh is not None else "?", _flags(p)))
    return rows


_PLAN_HEADERS = ("#", "provider", "sku", "gpu", "gpus[xnodes]", "strategy", "mb", "ga", "ckpt",
                 "GB/GPU", "host GiB/disk GB", "tok/s", "MFU", "hours", "$", "spot E[$]", "kWh", "flags")
_PLAN_ALIGN = "rllllrrlrrrrrrrrrl"


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


def _footer_lines(ps, job, model=None) -> list[str]:
    lines = []
    if ps.infeasible:
        lines += ["", "why not:"]
        for i in ps.infeasible:
            lines.append(f"  {i.gpu}: {render_refs(i.message(), RENDERER)}")
    lines += ["", "hours = training + start-up (provisioning, checkpoint download); $ = instances x price x "
              "hours rounded up to the billing granularity; kWh = GPUs x board power (TDP) x hours, an upper bound.",
              "host = host RAM (GiB) / local disk (GB) per node; spot E[$] = expected cost of the completed job with "
              "preemptions (checkpoint/restart at the optimum interval; the expected number of preemptions in "
              "brackets); spot plans are ranked on it."]
    best = ps.best
    if best is not None and best.runtime.step_time_s_high is not None:
        r, c = best.runtime, best.cost
        q = r.band_quantiles or (0.1, 0.9)
        lines.append(f"uncertainty: step times x{r.step_time_s_low / r.step_time_s:.2f} to "
                     f"x{r.step_time_s_high / r.step_time_s:.2f} ({q[0]:.0%}-{q[1]:.0%} of published measurements "
                     f"against the model, held out from its fit); plan 1: {r.total_hours_low:,.2f}-"
                     f"{r.total_hours_high:,.2f} h, ${c.usd_low:,.2f}-${c.usd_high:,.2f}.")
    lines += [f"note: {n}" for n in rendered(ps.notes, RENDERER)]
    assumed = search_assumptions(job, model)
    if assumed:
        lines.append("assumed: " + "; ".join(render_refs(a.text, RENDERER) for a in assumed) + " (change with: "
                     + ", ".join(render_refs(a.change, RENDERER) for a in assumed) + ")")
    return lines


def _write_plot(a: argparse.Namespace, res) -> None:
    if getattr(a, "plot", None):
        from ..plot import plot_search

        plot_search(a.plot, res.model, res.job, res.plans, command=a.command)
        print(f"wrote {a.plot}", file=sys.stderr)


def run_recommend(a: argparse.Namespace) -> int:
    _check_plot(a)
    rec = api.recommend(a.model, progress=progress(),
                        **values(a, JOB_OPTIONS, SEARCH_OPTIONS, OFFER_OPTIONS, DATA_OPTIONS))
    _write_plot(a, rec)
    if a.json:
        emit_json(rec.to_dict())
        return 0
    ps = rec.plans
    lines = _summary_lines(rec.model, rec.job, ps) + [""]
    if ps.plans:
        top = ps.top(rec.top)
        lines.append(table(_PLAN_HEADERS, _plan_rows(top), _PLAN_ALIGN))
        extra = [p for p in ps.pareto() if p not in top]
        if extra:
            lines += ["", "other Pareto plans (cost vs time):",
                      table(_PLAN_HEADERS, _plan_rows(extra), _PLAN_ALIGN)]
    else:
        lines.append("no plan fits the constraints")
    lines += _footer_lines(ps, rec.job, rec.model)
    print("\n".join(lines))
    return 0 if ps.plans else 3


def run_compare(a: argparse.Namespace) -> int:
    _check_plot(a)
    cmp = api.compare(a.model, progress=progress(),
                      **values(a, JOB_OPTIONS, SEARCH_OPTIONS, OFFER_OPTIONS, DATA_OPTIONS))
    _write_plot(a, cmp)
    if a.json:
        emit_json(cmp.to_dict())
        return 0
    rows = []
    for i, p in enumerate(cmp.per_gpu, 1):
        per_m = p.cost.usd_per_million_tokens
        rows.append((i, p.gpu.name, p.offer.provider, p.offer.sku, p.layout.world_size, p.strategy_label,
                     f"{p.offer.usd_per_gpu_hour:,.2f}", f"{p.runtime.tokens_per_s / p.layout.world_size:,.0f}",
                     f"{p.hours:,.2f}", f"{p.usd:,.2f}", f"{per_m:,.3f}" if per_m is not None else "?",
                     f"{p.cost.energy_kwh:,.1f}" if p.cost.energy_kwh is not None else "?"))
    lines = _summary_lines(cmp.model, cmp.job, cmp.plans) + [""]
    lowp = any(p.job.low_precision for p in cmp.plans.plans)
    if rows and lowp:  # a precision search: name each plan's precision
        rows = [r[:2] + (p.job.precision_label,) + r[2:] for r, p in zip(rows, cmp.per_gpu)]
        lines.append(table(("#", "gpu", "precision", "provider", "sku", "gpus", "strategy", "$/GPU-h",
                            "tok/s/GPU", "hours", "job $", "$/Mtok", "kWh"), rows, "lllllrlrrrrrr"))
    elif rows:
        lines.append(table(("#", "gpu", "provider", "sku", "gpus", "strategy", "$/GPU-h", "tok/s/GPU",
                            "hours", "job $", "$/Mtok", "kWh"), rows, "rllllrlrrrrr"))
    else:
        lines.append("no plan fits the constraints")
    if lowp:
        prows = [(p.gpu.name, p.job.precision_label, p.layout.world_size, p.strategy_label,
                  f"{p.runtime.tokens_per_s / p.layout.world_size:,.0f}",
                  f"{sp:.2f}x" if sp is not None else "-",
                  f"{sl:.2f}x" if (sl := same_layout_speedup(cmp.model, p)) is not None else "-",
                  f"{p.hours:,.2f}", f"{p.usd:,.2f}")
                 for p, _, sp in precision_speedups(cmp.plans)]
        prows.sort(key=lambda r: (r[0], r[1] != cmp.job.precision, r[1]))
        lines += ["", f"what each precision contributes (best plan per GPU and precision; speedup = tok/s per GPU "
                      f"over the same GPU's best {cmp.job.precision} plan; same layout = over {cmp.job.precision} "
                      f"on this plan's layout and micro-batch):",
                  table(("gpu", "precision", "gpus", "strategy", "tok/s/GPU", "speedup", "same layout", "hours",
                         "job $"), prows, "llrlrrrrr")]
    lines += _footer_lines(cmp.plans, cmp.job, cmp.model)
    print("\n".join(lines))
    return 0 if rows else 3


def _search_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", help=MODEL_HELP)
    add_job_options(s)
    add_search_options(s)
    add_options(s, DATA_OPTIONS, "data")
    s.add_argument("--plot", default=None, metavar="FILE",
                   help="also draw cost vs time of every plan to FILE.png or FILE.svg (needs ftplan[plot])")


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------
def run_fit(a: argparse.Namespace) -> int:
    rep = api.fit(a.model, **values(a, FIT_OPTIONS, JOB_OPTIONS, DATA_OPTIONS))
    if a.json:
        emit_json(rep.to_dict())
        return 0
    job = rep.job
    lines = [rep.model.summary(),
             f"job: {job.method}, micro-batch {job.micro_batch} x {job.seq_len}, checkpointing "
             f"{'on' if job.gradient_checkpointing else 'off'}; margin {rep.margin:.0%}", ""]
    for r in rep.results:
        need = f"{r.device_total_bytes / 1e9:,.1f} GB" if r.device_total_bytes is not None else "?"
        lines.append(f"{r.gpu} ({r.memory_bytes / 1e9:,.1f} GB, {r.usable_bytes / 1e9:,.1f} usable): "
                     f"{'FITS' if r.fits else 'does not fit'} on one GPU (needs {need})")
        lines.append(f"  longest sequence on one GPU: {r.max_seq_len if r.max_seq_len else 'none'}")
        lines.append(f"  largest micro-batch on one GPU at seq {job.seq_len}: "
                     f"{r.max_micro_batch if r.max_micro_batch else 'none'}")
        rows = [(k, v if v is not None else f"> {rep.max_gpus}") for k, v in r.min_gpus.items()]
        lines.append(table(("strategy", "fewest GPUs"), rows, "lr"))
        lines += [f"  note: {n}" for n in rendered(r.notes, RENDERER)]
        if r.advice:
            lines.append("  single changes that make it fit on one GPU:")
            lines += [f"    - {render_refs(x.text, RENDERER)}" for x in r.advice]
        lines.append("")
    print("\n".join(lines).rstrip())
    return 0


def _fit_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", help=MODEL_HELP)
    add_job_options(s)
    add_options(s, FIT_OPTIONS, "fit", required=("gpu",))
    add_options(s, DATA_OPTIONS, "data")
    s.add_argument("--json", action="store_true")


COMMANDS = {
    "estimate": Command("per-GPU memory breakdown of a job; with --gpu its runtime and price on that layout",
                        _estimate_args, run_estimate),
    "recommend": Command("rank plans (offer, layout, batch) by cost or time, with why-not reasons",
                         _search_args, run_recommend),
    "compare": Command("best plan per accelerator type, ranked by cost of the completed job",
                       _search_args, run_compare),
    "fit": Command("longest sequence, largest micro-batch and fewest GPUs on a GPU type", _fit_args, run_fit),
}
