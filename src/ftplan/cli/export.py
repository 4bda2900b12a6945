"""CLI command that turns a plan into files that run it: export.

``ftplan export MODEL [job, offer and search options of recommend] [--plan N] --out DIR`` exports the
N-th plan (default 1: the best) of the same search ``ftplan recommend`` runs;
``ftplan export --from-json FILE [--plan N] --out DIR`` exports a plan of a saved
``ftplan recommend --json`` (or ``compare --json``) document. The files are rendered first and
written all at once (:meth:`ftplan.api.Bundle.write`): on any error nothing is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import api
from ..errors import ConfigError
from ..export import ZERO3_BACKENDS
from ..options import JOB_OPTIONS, OFFER_OPTIONS, SEARCH_OPTIONS
from ..optionspec import parse_int
from .options import Command, arg_type, emit_json, values
from .plan import add_job_options, add_search_options, progress

__all__ = ["COMMANDS", "run_export"]


def _plan_index(text: str) -> int:
    try:
        return parse_int(text)
    except ValueError:
        raise ValueError(f"expected a plan number, got {text!r}") from None


def _export_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", nargs="?", default=None,
                   help="catalog name, hub id, or path to config.json (or use --from-json)")
    add_job_options(s)
    add_search_options(s)
    g = s.add_argument_group("export")
    g.add_argument("--from-json", default=None, metavar="FILE",
                   help="a document saved from 'ftplan recommend --json' instead of searching")
    g.add_argument("--plan", type=arg_type(_plan_index), default=1, metavar="N",
                   help="export the N-th plan in recommend's order (default 1: the best)")
    g.add_argument("--out", required=True, metavar="DIR", help="directory to create")
    g.add_argument("--force", action="store_true", help="replace DIR if it exists and is not empty")
    g.add_argument("--model-ref", default=None, metavar="REF",
                   help="hub id or local path train.py loads (default: the model's hub id)")
    g.add_argument("--dataset", default=None, metavar="DATA",
                   help="dataset for sky.yaml and the README (hub name or a path on the machine)")
    g.add_argument("--zero3-backend", default=None, metavar="NAME",
                   help="how a zero3 plan runs with --target accelerate/deepspeed: deepspeed (ZeRO-3) | fsdp (FSDP2); "
                        "default: the target's rule (accelerate: FSDP2, DeepSpeed ZeRO-3 with CPU offload)")


def run_export(a: argparse.Namespace) -> int:
    if a.from_json and a.model:
        raise ConfigError("give a MODEL or `from_json=FILE`, not both", "see `ftplan export --help`")
    if not a.from_json and not a.model:
        raise ConfigError("nothing to export: give a MODEL or `from_json=FILE`", "see `ftplan export --help`")
    if a.zero3_backend is not None and a.zero3_backend not in ZERO3_BACKENDS:  # before a search
        raise ConfigError(f"unknown `zero3_backend` {a.zero3_backend!r}", "use deepspeed or fsdp")
    out = Path(a.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not a.force:
        # fail before a search that may take a while; Bundle.write checks again
        raise ConfigError(f"{out} exists and is not empty", "pass a new `out` directory, or `force` to replace it")
    if a.from_json:
        source = a.from_json
    else:
        source = api.recommend(a.model, progress=progress(),
                               **values(a, JOB_OPTIONS, SEARCH_OPTIONS, OFFER_OPTIONS))
    target = None if getattr(a, "target", None) in (None, "any") else a.target
    bundle = api.export_bundle(source, a.plan, ref=a.model, model_ref=a.model_ref, dataset=a.dataset,
                               zero3_backend=a.zero3_backend, target=target)
    path = bundle.write(out, force=a.force)
    if a.json:
        emit_json(bundle.to_dict(path))
        return 0
    plan = bundle.plan
    o, lo = plan["offer"], plan["layout"]
    gpus = lo["gpus_per_node"] * lo["nodes"]
    print(f"exported plan {a.plan}: {plan['model'].get('name')} {plan['job']['method']} on {gpus} x {o['gpu']} "
          f"({o['provider']} {o['sku']}, {plan.get('strategy_label', lo['strategy'])}), "
          f"{plan['runtime']['total_hours']:,.2f} h, ${plan['cost']['usd']:,.2f}")
    print(f"wrote {path}/ for {bundle.target}: {', '.join(bundle.files)}")
    launch = bundle.launch or {}
    print(f"run it on the machine with the GPUs ({launch.get('engine')}), from {path}:")
    if launch.get("setup"):
        print(f"  {launch['setup']}")
    if plan["layout"]["nodes"] > 1:
        print(f"  # on every node: export NODE_RANK=<0..{plan['layout']['nodes'] - 1}> HEAD_IP=<node 0's address> "
              f"NNODES={plan['layout']['nodes']} MASTER_ADDR=$HEAD_IP MASTER_PORT=29500 "
              f"NPROC_PER_NODE={plan['layout']['gpus_per_node']}")
    print(f"  {launch.get('command')}")
    if launch.get("sky"):
        print(f"or on the cloud with SkyPilot, from {path}: {launch['sky']}")
    print(f"details: {path}/README.md")
    return 0


COMMANDS = {
    "export": Command("write launch files for a plan: accelerate/DeepSpeed configs, TRL script, SkyPilot task, "
                      "README", _export_args, run_export),
}
