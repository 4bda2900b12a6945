"""CLI command that turns a plan into files that run it: export.

Wired into ``ftplan.cli`` by ``_add_export_commands(sub)`` calling ``add_export_commands(sub)``.

``ftplan export MODEL [job, offer and search options of recommend] [--plan N] --out DIR`` exports the
N-th plan (default 1: the best) of the same search ``ftplan recommend`` runs;
``ftplan export --from-json FILE [--plan N] --out DIR`` exports a plan of a saved
``ftplan recommend --json`` (or ``compare --json``) document. The files are rendered first and
written all at once (``write_bundle``): on any error nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys

from .cli import add_job_options
from .errors import ConfigError, InfeasibleError

__all__ = ["add_export_commands", "cmd_export", "EXPORT_SCHEMA"]

EXPORT_SCHEMA = "ftplan.export/1"


def _plan_index(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a plan number, got {text!r}") from None


def add_export_commands(sub) -> None:
    """Add ``export`` to an argparse sub-parser set."""
    from .cli_planner import _add_offer_options, _add_search_options

    s = sub.add_parser("export", help="write launch files for a plan: accelerate/DeepSpeed configs, TRL script, "
                                      "SkyPilot task, README")
    s.add_argument("model", nargs="?", default=None,
                   help="catalog name, hub id, or path to config.json (or use --from-json)")
    add_job_options(s)
    _add_offer_options(s)
    _add_search_options(s)
    g = s.add_argument_group("export")
    g.add_argument("--from-json", default=None, metavar="FILE",
                   help="a document saved from 'ftplan recommend --json' instead of searching")
    g.add_argument("--plan", type=_plan_index, default=1, metavar="N",
                   help="export the N-th plan in recommend's order (default 1: the best)")
    g.add_argument("--out", required=True, metavar="DIR", help="directory to create")
    g.add_argument("--force", action="store_true", help="replace DIR if it exists and is not empty")
    g.add_argument("--model-ref", default=None, metavar="REF",
                   help="hub id or local path train.py loads (default: the model's hub id)")
    g.add_argument("--dataset", default=None, metavar="DATA",
                   help="dataset for sky.yaml and the README (hub name or a path on the machine)")
    g.add_argument("--zero3-backend", default="deepspeed", metavar="NAME",
                   help="how a zero3 plan runs: deepspeed (ZeRO-3, default) | fsdp (FSDP FULL_SHARD)")
    s.set_defaults(func=cmd_export)


def _search_plan(a: argparse.Namespace) -> tuple[dict, list[dict]]:
    from .cli_planner import _run_search
    from .export.bundle import exportable, plan_document

    model, _job, ps = _run_search(a)
    if not ps.plans:
        reasons = "; ".join(f"{i.gpu}: {i.reason}" for i in ps.infeasible[:3])
        raise InfeasibleError("no feasible plan to export" + (f" ({reasons})" if reasons else ""),
                              "relax the constraints; 'ftplan recommend' explains every GPU type")
    n = len(ps.plans)
    if not 1 <= a.plan <= n:
        raise ConfigError(f"plan {a.plan} is out of range: the search found {n} plan(s)", f"use --plan 1..{n}")
    docs = [plan_document(model, p, ref=a.model) for p in ps.plans]
    chosen = docs[a.plan - 1]
    why = exportable(chosen)
    if why:
        ok = next((i for i, d in enumerate(docs, 1) if exportable(d) is None), None)
        hint = (f"plan {ok} is the best one that can be exported: add --plan {ok}" if ok
                else "no plan of this search can be exported; try other --gpus-filter / --max-gpus")
        raise ConfigError(f"plan {a.plan} cannot be exported: {why}", hint)
    others = [d for i, d in enumerate(docs, 1) if i != a.plan]
    for d in others:
        d.pop("schema", None)
        d.pop("model", None)
    return chosen, others


def cmd_export(a: argparse.Namespace) -> int:
    from .export.bundle import load_plan_json, render_bundle, write_bundle

    if a.from_json and a.model:
        raise ConfigError("give a MODEL or --from-json FILE, not both", "see 'ftplan export --help'")
    if not a.from_json and not a.model:
        raise ConfigError("nothing to export: give a MODEL or --from-json FILE", "see 'ftplan export --help'")
    if a.zero3_backend not in ("deepspeed", "fsdp"):
        raise ConfigError(f"unknown --zero3-backend {a.zero3_backend!r}", "use deepspeed or fsdp")
    from pathlib import Path

    out = Path(a.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not a.force:
        # fail before a search that may take a while; write_bundle checks again
        raise ConfigError(f"{out} exists and is not empty", "pass a new --out directory, or --force to replace it")
    if a.from_json:
        plan, others = load_plan_json(a.from_json, a.plan)
    else:
        plan, others = _search_plan(a)
    files = render_bundle(plan, alternatives=others, model_ref=a.model_ref, dataset=a.dataset,
                          zero3_backend=a.zero3_backend)
    path = write_bundle(files, out, force=a.force)
    if a.json:
        json.dump({"schema": EXPORT_SCHEMA, "out": str(path), "files": sorted(files),
                   "plan": plan}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    o, lo = plan["offer"], plan["layout"]
    gpus = lo["gpus_per_node"] * lo["nodes"]
    print(f"exported plan {a.plan}: {plan['model'].get('name')} {plan['job']['method']} on {gpus} x {o['gpu']} "
          f"({o['provider']} {o['sku']}, {plan.get('strategy_label', lo['strategy'])}), "
          f"{plan['runtime']['total_hours']:,.2f} h, ${plan['cost']['usd']:,.2f}")
    print(f"wrote {path}/: {', '.join(files)}")
    print(f"next: cd {path} && cat README.md")
    return 0
