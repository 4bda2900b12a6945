"""CLI command that runs a plan on this machine: train.

Wired into ``ftplan.cli`` by ``_add_train_commands(sub)`` calling ``add_train_commands(sub)``.
Nothing heavy is imported here: torch only when ``train`` runs (in :mod:`ftplan.train`).
"""

from __future__ import annotations

import argparse

__all__ = ["add_train_commands", "cmd_train"]

#: job option dest -> how it changes a Job (for --from-json: explicit options override the plan)
_JOB_DESTS = ("method", "precision", "optimizer", "micro_batch", "seq_len", "grad_accum", "gc", "attn_impl",
              "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "quant_type", "no_double_quant",
              "compute_dtype", "tokens", "epochs")
_LAYOUT_DESTS = ("gpus_per_node", "nodes", "strategy", "offload_optimizer", "offload_params", "tp", "pp")


def _overrides(a: argparse.Namespace, defaults: dict, dests) -> dict:
    return {d: getattr(a, d) for d in dests if getattr(a, d) != defaults.get(d)}


def _job_and_layout(a: argparse.Namespace):
    from dataclasses import replace

    from .cli import job_from_args, layout_from_args

    if not a.from_json:
        return job_from_args(a), layout_from_args(a)
    from .train import load_plan_json

    job, layout = load_plan_json(a.from_json, a.plan)
    defaults = a._defaults
    ov = _overrides(a, defaults, _JOB_DESTS)
    if ov:  # options given on the command line win over the plan
        j = job_from_args(a)
        fields = {"method": "method", "precision": "precision", "optimizer": "optimizer",
                  "micro_batch": "micro_batch", "seq_len": "seq_len", "grad_accum": "grad_accum",
                  "gc": "gradient_checkpointing", "attn_impl": "attn_impl", "tokens": "dataset_tokens",
                  "epochs": "epochs"}
        job = replace(job, **{fields[d]: getattr(j, fields[d]) for d in ov if d in fields})
        lora = {"lora_r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "lora_targets": "target_modules"}
        if any(d in ov for d in lora):
            job = replace(job, lora=replace(job.lora, **{lora[d]: getattr(j.lora, lora[d]) for d in ov if d in lora}))
        quant = {"quant_type": "quant_type", "no_double_quant": "double_quant", "compute_dtype": "compute_dtype"}
        if any(d in ov for d in quant):
            job = replace(job, quant=replace(job.quant, **{quant[d]: getattr(j.quant, quant[d])
                                                           for d in ov if d in quant}))
    lov = _overrides(a, defaults, _LAYOUT_DESTS)
    if lov:
        lay = layout_from_args(a)
        names = {"gpus_per_node": "gpus_per_node", "nodes": "nodes", "strategy": "strategy",
                 "offload_optimizer": "offload_optimizer", "offload_params": "offload_params", "tp": "tp", "pp": "pp"}
        layout = replace(layout, **{names[d]: getattr(lay, names[d]) for d in lov})
        if ("gpus_per_node" in lov or "nodes" in lov) and "strategy" not in lov:
            if layout.world_size == 1:
                layout = replace(layout, strategy="single")
            elif layout.strategy == "single":
                layout = replace(layout, strategy="ddp")
    return job, layout


def cmd_train(a: argparse.Namespace) -> int:
    from .train import train

    job, layout = _job_and_layout(a)
    return train(a.model_dir, a.dataset, a.out, job, layout, max_steps=a.max_steps, save_steps=a.save_steps,
                 logging_steps=a.logging_steps, seed=a.seed, record=a.record)


def add_train_commands(sub) -> None:
    """Add ``train`` to the ``ftplan`` sub-command parser ``sub``."""
    from .cli import add_job_options, add_layout_options

    s = sub.add_parser(
        "train", help="run a plan on this machine (TRL SFTTrainer; needs the 'train' extra)",
        description="Write the plan's TRL training script into --out and run it here: python train.py on "
                    "one GPU or CPU, accelerate launch on several GPUs. At the end, predicted vs measured "
                    "peak memory and tokens/s.")
    s.add_argument("model_dir", help="local model folder: config.json, tokenizer files and weights")
    t = s.add_argument_group("training")
    t.add_argument("--dataset", required=True,
                   help="JSONL/JSON/Parquet/CSV file, a folder of them, a save_to_disk folder or a hub dataset "
                        "name; rows need 'messages', 'prompt'+'completion' or 'text'")
    t.add_argument("--out", required=True, help="new output folder: train.py, checkpoints, the trained model")
    t.add_argument("--from-json", default=None,
                   help="take job and layout from a --json document of estimate/recommend/compare "
                        "(options given here override it)")
    t.add_argument("--plan", type=int, default=1, help="which plan of --from-json (1 = first)")
    t.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: the epochs)")
    t.add_argument("--save-steps", type=int, default=None, help="checkpoint every N steps (default 500)")
    t.add_argument("--logging-steps", type=int, default=None, help="log every N steps (default 10)")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--record", default=None, help="append a measurement record (ftplan.measurement/1) here")
    add_job_options(s)
    add_layout_options(s)
    defaults = {d: s.get_default(d) for d in _JOB_DESTS + _LAYOUT_DESTS}
    s.set_defaults(func=cmd_train, _defaults=defaults)
