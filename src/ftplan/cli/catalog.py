"""Catalog commands: models, gpus, offers."""

from __future__ import annotations

import argparse

from .. import api
from ..options import OFFER_OPTIONS
from ..optionspec import parse_int
from ..report import table
from ..errors import render_refs
from .options import RENDERER, Command, add_options, arg_type, emit_json, values

__all__ = ["COMMANDS"]


def run_models(a: argparse.Namespace) -> int:
    cat = api.models()
    if a.json:
        emit_json(cat.to_dict())
        return 0
    rows = []
    for name, m in cat.models.items():
        spec = m.spec()
        p = spec.params
        rows.append((name, spec.family, f"{p.total / 1e9:,.2f}B",
                     f"{p.active / 1e9:,.2f}B" if spec.is_moe else "", spec.num_layers,
                     spec.hidden_size, spec.vocab_size, m.hf_id))
    print(table(("name", "family", "params", "active", "layers", "hidden", "vocab", "hub id"), rows, "llrrrrrl"))
    return 0


def _models_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--json", action="store_true")


def run_gpus(a: argparse.Namespace) -> int:
    cat = api.gpus(a.gpus_file)
    if a.json:
        emit_json(cat.to_dict())
        return 0

    def f(x):
        return "" if x is None else f"{x:,.0f}"

    rows = [(g.name, g.vendor, g.arch, f"{g.memory_bytes / 1e9:,.1f}", f"{g.mem_bw_tbps:.2f}",
             f(g.bf16_tflops), f(g.fp8_tflops), f(g.tdp_w), f"{g.intra_node_bw_gbps:,.0f}",
             "y" if g.supports_bitsandbytes else "n", "y" if g.supports_flash_attention else "n")
            for g in cat.gpus.values()]
    print(table(("name", "vendor", "arch", "GB", "TB/s", "bf16 TF", "fp8 TF", "TDP W", "link GB/s", "bnb",
                 "flash"), rows, "lllrrrrrrll"))
    print("\nTFLOPS are dense peaks (bf16/fp16: FP32-accumulate rate); link = per-GPU per-direction GB/s inside a node.")
    return 0


def _gpus_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--gpus-file", default=None, metavar="FILE", help="a GPU CSV instead of the bundled one")
    s.add_argument("--json", action="store_true")


def run_offers(a: argparse.Namespace) -> int:
    res = api.offers(sort=a.sort, max_age_days=a.max_age_days, **values(a, OFFER_OPTIONS))
    if a.json:
        emit_json(res.to_dict())
        return 0
    from ..catalog.offers import is_stale

    rows = []
    n_stale = 0
    for o in res.offers:
        stale = is_stale(o, res.today, res.max_age_days)
        n_stale += stale
        rows.append((o.provider, o.sku, o.gpu, o.gpus_per_instance, f"{o.usd_per_gpu_hour:,.3f}",
                     f"{o.usd_per_instance_hour:,.2f}", o.pricing,
                     f"{o.inter_node_gbps:,.0f}" if o.inter_node_gbps else "-",
                     o.as_of.isoformat(), "STALE" if stale else ""))
    print(table(("provider", "sku", "gpu", "gpus", "$/GPU-h", "$/inst-h", "pricing", "net Gb/s", "as of", ""),
                rows, "lllrrrlrll"))
    print(f"\n{len(res.offers)} offers; {n_stale} with prices older than {res.max_age_days} days "
          f"(as of {res.today}).")
    return 0


def _offers_args(s: argparse.ArgumentParser) -> None:
    add_options(s, OFFER_OPTIONS, "offers")
    s.add_argument("--max-age-days", type=arg_type(parse_int), default=120, help="older prices are flagged stale")
    s.add_argument("--sort", default="price", help="price (per GPU-hour, default) | provider | gpu | age")
    s.add_argument("--json", action="store_true")


def run_claims(a: argparse.Namespace) -> int:
    rep = api.claims()
    if a.json:
        emit_json(rep.to_dict())
        return 0
    lines = ["The seed articles' FP8 / FP4 claims, answered with ftplan's numbers (8 GPUs, FSDP, seq 8192, "
             "checkpointing; FP8 = torchao tensorwise, NVFP4 = Transformer Engine / torchao weight-only base):", ""]
    for c in rep.claims:
        lines += [f"[{c.verdict.upper()}] {c.claim}  (seed {c.source})", f"  {render_refs(c.answer, RENDERER)}", ""]
    print("\n".join(lines).rstrip())
    return 0


def _claims_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--json", action="store_true")


COMMANDS = {
    "models": Command("list the bundled model catalog", _models_args, run_models),
    "claims": Command("the seed articles' FP8/FP4 claims answered with ftplan's numbers", _claims_args, run_claims),
    "gpus": Command("list the GPU catalog", _gpus_args, run_gpus),
    "offers": Command("list and filter offers; flags stale prices", _offers_args, run_offers),
}
