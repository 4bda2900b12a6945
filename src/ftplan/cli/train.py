"""CLI command that runs a plan on this machine: train.

Nothing heavy is imported here: torch only when ``train`` runs (in :mod:`ftplan.train`).
"""

from __future__ import annotations

import argparse

from .. import api
from ..options import JOB_OPTIONS, LAYOUT_OPTIONS, build_job, build_layout
from .options import Command, values
from .plan import add_job_options, add_layout_options

__all__ = ["COMMANDS", "run_train", "job_and_layout"]


def job_and_layout(a: argparse.Namespace):
    """The Job and Layout of the options given; with ``--from-json``, the plan's, with the options
    given on the command line overriding it."""
    jv, lv = values(a, JOB_OPTIONS), values(a, LAYOUT_OPTIONS)
    if not a.from_json:
        return build_job(jv), build_layout(lv)
    from ..train import load_plan_json

    job, layout = load_plan_json(a.from_json, a.plan)
    return build_job(jv, base=job), build_layout(lv, base=layout)


def run_train(a: argparse.Namespace) -> int:
    job, layout = job_and_layout(a)
    return api.train(a.model_dir, a.dataset, a.out, job, layout, max_steps=a.max_steps, save_steps=a.save_steps,
                     logging_steps=a.logging_steps, seed=a.seed, record=a.record)


def _train_args(s: argparse.ArgumentParser) -> None:
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


COMMANDS = {
    "train": Command(
        "run a plan on this machine (TRL SFTTrainer; needs the 'train' extra)", _train_args, run_train,
        description="Write the plan's TRL training script into --out and run it here: python train.py on "
                    "one GPU or CPU, accelerate launch on several GPUs. At the end, predicted vs measured "
                    "peak memory and tokens/s."),
}
