"""The ``ftplan`` command line: thin layers over the library functions.

Every expected failure (bad option, unknown name, malformed file) is printed as one line,
``ftplan: error: <what> (<how to fix>)``, with exit code 2. Set ``FTPLAN_DEBUG=1`` for tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from .errors import ConfigError, FtplanError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(message, f"see '{self.prog} --help'")


# ---------------------------------------------------------------------------------------------
# shared options
# ---------------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return v


def _tokens(text: str) -> int:
    """'50M', '1.5B', '200k', '123456' -> tokens."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count like 50M or 2B, got {text!r}") from None


def add_job_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    g.add_argument("--method", default="full", help="full | lora | qlora (default: full)")
    g.add_argument("--precision", default="bf16-mixed",
                   help="bf16-mixed (fp32 master weights) | fp16-mixed | bf16 | fp16 | fp32")
    g.add_argument("--optimizer", default="adamw",
                   help="adamw | adamw_8bit | paged_adamw_8bit | adafactor | sgd")
    g.add_argument("--micro-batch", "--batch-size", dest="micro_batch", type=_positive_int, default=1)
    g.add_argument("--seq-len", type=_positive_int, default=2048)
    g.add_argument("--grad-accum", type=_positive_int, default=1)
    g.add_argument("--gradient-checkpointing", "--gc", dest="gc", action="store_true")
    g.add_argument("--attn", dest="attn_impl", default="sdpa", help="sdpa | flash | eager")
    g.add_argument("--lora-r", type=_positive_int, default=16)
    g.add_argument("--lora-alpha", type=int, default=32)
    g.add_argument("--lora-dropout", type=float, default=None,
                   help="LoRA dropout (default 0.05; 0 where PEFT requires it: all-linear on MoE models)")
    g.add_argument("--lora-targets", default="all-linear",
                   help="comma-separated PEFT target_modules, or all-linear (default)")
    g.add_argument("--quant-type", default="nf4", help="QLoRA 4-bit type: nf4 | fp4")
    g.add_argument("--no-double-quant", action="store_true")
    g.add_argument("--compute-dtype", default="bf16", help="QLoRA compute dtype")
    g.add_argument("--tokens", type=_tokens, default=None, help="dataset tokens per epoch, e.g. 50M")
    g.add_argument("--epochs", type=float, default=1.0)


def add_layout_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout")
    g.add_argument("--gpus", dest="gpus_per_node", type=_positive_int, default=1, help="GPUs per node")
    g.add_argument("--nodes", type=_positive_int, default=1)
    g.add_argument("--strategy", default=None,
                   help="single | ddp | zero1 | zero2 | zero3 | fsdp (default: single, or ddp with >1 GPU)")
    g.add_argument("--offload-optimizer", action="store_true")
    g.add_argument("--offload-params", action="store_true")
    g.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree")
    g.add_argument("--pp", type=_positive_int, default=1, help="pipeline-parallel degree")


def job_from_args(a: argparse.Namespace, model=None):
    """The Job of the parsed options. With ``model``, an unset ``--lora-dropout`` becomes 0 where
    PEFT refuses dropout (all-linear on a transformers-5 MoE model), else 0.05."""
    from .job import Job, LoraSpec, QuantSpec, lora_wraps_experts

    targets = tuple(t.strip() for t in a.lora_targets.split(",") if t.strip()) or ("all-linear",)
    dropout = getattr(a, "lora_dropout", None)
    if dropout is None:
        dropout = 0.0 if model is not None and lora_wraps_experts(model, LoraSpec(target_modules=targets)) else 0.05
    return Job(
        method=a.method.lower(),
        precision=a.precision.lower(),
        optimizer=a.optimizer.lower().replace("-", "_"),
        micro_batch=a.micro_batch,
        seq_len=a.seq_len,
        grad_accum=a.grad_accum,
        gradient_checkpointing=a.gc,
        attn_impl=a.attn_impl.lower(),
        lora=LoraSpec(r=a.lora_r, alpha=a.lora_alpha, dropout=dropout, target_modules=targets),
        quant=QuantSpec(quant_type=a.quant_type.lower(), double_quant=not a.no_double_quant,
                        compute_dtype=a.compute_dtype.lower()),
        dataset_tokens=a.tokens,
        epochs=a.epochs,
    )


def layout_from_args(a: argparse.Namespace):
    from .job import Layout

    world = a.gpus_per_node * a.nodes
    strategy = (a.strategy or ("single" if world == 1 else "ddp")).lower()
    return Layout(gpus_per_node=a.gpus_per_node, nodes=a.nodes, strategy=strategy,
                  offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
                  tp=a.tp, pp=a.pp)


def _emit_json(doc) -> None:
    json.dump(doc, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
def cmd_models(a: argparse.Namespace) -> int:
    from .catalog.models import load_model_catalog
    from .report import table

    rows = []
    docs = []
    for name, m in load_model_catalog().items():
        spec = m.spec()
        p = spec.params
        if a.json:
            docs.append({"name": name, "hf_id": m.hf_id, "family": spec.family, "params_total": p.total,
                         "params_active": p.active, "layers": spec.num_layers,
                         "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size,
                         "source": m.source})
            continue
        rows.append((name, spec.family, f"{p.total / 1e9:,.2f}B",
                     f"{p.active / 1e9:,.2f}B" if spec.is_moe else "", spec.num_layers,
                     spec.hidden_size, spec.vocab_size, m.hf_id))
    if a.json:
        _emit_json({"schema": "ftplan.models/1", "models": docs})
    else:
        print(table(("name", "family", "params", "active", "layers", "hidden", "vocab", "hub id"),
                    rows, "llrrrrrl"))
    return 0


def cmd_estimate(a: argparse.Namespace) -> int:
    from .catalog.models import resolve_model
    from .memory import estimate_memory
    from .report import estimate_json, estimate_text

    if a.plot:
        from .plot import check_plot_path

        check_plot_path(a.plot)  # before any work: bad extension / no matplotlib -> one line
    model = resolve_model(a.model)
    job = job_from_args(a, model)
    layout = layout_from_args(a)
    gpu = None
    vendor = "nvidia"
    if a.gpu:
        from .catalog.gpus import get_gpu

        gpu = get_gpu(a.gpu)
        vendor = gpu.vendor
    mem = estimate_memory(model, job, layout, gpu_vendor=vendor)
    if a.json:
        _emit_json(estimate_json(model, job, layout, mem, gpu))
    else:
        print(estimate_text(model, job, layout, mem, gpu))
    if a.plot:
        from .plot import plot_breakdown

        plot_breakdown(estimate_json(model, job, layout, mem, gpu), a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    return 0


def _lazy(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    def run(a: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(module, __package__), func)(a)

    return run


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ftplan", description="Plan LLM fine-tuning jobs: memory, time, cost.")
    p.add_argument("--version", action="version", version=f"ftplan {__import__('ftplan').__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("models", help="list the bundled model catalog")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_models)

    s = sub.add_parser("estimate", help="per-GPU memory breakdown of a job")
    s.add_argument("model", help="catalog name, hub id, or path to config.json")
    add_job_options(s)
    add_layout_options(s)
    s.add_argument("--gpu", default=None, help="GPU name (e.g. h100-sxm): say whether it fits")
    s.add_argument("--json", action="store_true")
    s.add_argument("--plot", default=None, metavar="FILE",
                   help="also draw the breakdown to FILE.png or FILE.svg (needs ftplan[plot])")
    s.set_defaults(func=cmd_estimate)

    _add_planner_commands(sub)
    _add_measure_commands(sub)
    _add_export_commands(sub)
    _add_train_commands(sub)
    _add_web_commands(sub)
    return p


def _add_planner_commands(sub) -> None:
    """recommend / compare / fit / gpus / offers."""
    from .cli_planner import add_planner_commands

    add_planner_commands(sub)


def _add_measure_commands(sub) -> None:
    """measure / validate (torch is imported only when they run)."""
    from .cli_measure import add_measure_commands

    add_measure_commands(sub)


def _add_export_commands(sub) -> None:
    """export (launch files for a plan: accelerate, DeepSpeed, SkyPilot, TRL script)."""
    from .cli_export import add_export_commands

    add_export_commands(sub)


def _add_train_commands(sub) -> None:
    """train (runs a plan on this machine; torch is imported only when it runs)."""
    from .cli_train import add_train_commands

    add_train_commands(sub)


def _add_web_commands(sub) -> None:
    """serve (the local web app; fastapi is imported only when it runs)."""
    from .cli_web import add_web_commands

    add_web_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except FtplanError as e:
        print(f"ftplan: error: {e.one_line()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ftplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: still one line, unless debugging
        if os.environ.get("FTPLAN_DEBUG"):
            raise
        print(f"ftplan: internal error: {type(e).__name__}: {e} (set FTPLAN_DEBUG=1 for a traceback "
              "and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
