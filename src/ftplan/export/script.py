"""A standalone TRL training script for a plan: ``render_train_script``.

The rendered script imports nothing from ftplan: it runs on a cloud machine that has only
``trl``, ``peft``, ``transformers``, ``datasets``, ``accelerate`` (and ``bitsandbytes`` for QLoRA or
the 8-bit optimizers). It is built on TRL's ``SFTTrainer`` + ``SFTConfig`` and PEFT's ``LoraConfig``
and applies exactly the job ftplan planned: method, precision, optimizer, micro-batch, gradient
accumulation, sequence length, gradient checkpointing, attention kernel, LoRA and 4-bit settings.

Those choices are a block of constants at the top of the script, so a user can read and edit them.
How the job maps onto the stack (what ftplan's memory model assumes, see README "Reference stack"):

* weights are loaded in the dtype the precision gives them (``job.PRECISIONS``): full training with
  ``bf16-mixed`` keeps fp32 weights (the master copy) and autocasts to bf16 (``SFTConfig(bf16=True)``);
  LoRA keeps the frozen base in bf16 and the adapters in fp32; pure ``bf16``/``fp16`` train in that
  dtype without autocast;
* QLoRA loads the base with ``BitsAndBytesConfig(load_in_4bit=True, ...)`` and calls
  ``peft.prepare_model_for_kbit_training`` (it upcasts the non-quantized weights to fp32) before
  ``get_peft_model`` (TRL's own path, PEFT's recommended recipe); sharded QLoRA (FSDP2 / ZeRO-3)
  stores the 4-bit weights in the compute dtype (``bnb_4bit_quant_storage``), loads on the CPU for
  the launcher to shard, and skips that upcast (TRL's ``is_sharded_qlora`` path), so the non-quantized
  weights stay in the compute dtype (less than ftplan's single-GPU QLoRA model counts for them);
* QLoRA with ``qlora_recipe=trl`` (TRL ``SFTTrainer``'s own path): no ``prepare_model_for_kbit_training``
  (``KBIT_PREPARE = False``), the non-quantized weights stay in the load dtype and the adapters keep
  the bf16 TRL casts them to;
* the trainable parameters are put in the plan's trainable dtype after the trainer is built
  (TRL >= 1.0 casts QLoRA adapters to bf16; PEFT's recipe, ftplan's default, plans fp32 adapters);
* ftplan's optimizers map to HF ``optim`` names (:data:`HF_OPTIM`), SGD with momentum 0.9;
* the batch and loss path follow TRL 1.16's ``SFTConfig``: ``max_length`` (the plan's sequence
  length), ``packing`` / ``padding_free`` (off unless the plan asks: ftplan's memory model assumes
  padded rows of ``max_length``), ``loss_type="nll"`` (TRL's default; ``chunked_nll`` is its deprecated
  alias), ``gradient_checkpointing`` (non-reentrant) and ``activation_offloading`` as planned;
* tensor-parallel plans (``ENGINE = "tp"``) load the model already sharded by transformers
  (``from_pretrained(distributed_config=DistributedConfig(tp_size=..., fsdp_size=...))``, the model's own
  TP plan); the HF Trainer passes the same sizes to accelerate. DeepSpeed AutoTP plans
  (``ENGINE = "autotp"``) load normally: DeepSpeed shards the model when the trainer starts.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..version import __version__
from ..job import PRECISIONS, Job, Layout
from ..model import ModelSpec

__all__ = ["render_train_script", "HF_OPTIM", "HF_ATTN", "TORCH_DTYPE", "script_constants"]

#: ftplan optimizer -> (HF TrainingArguments ``optim``, ``optim_args``)
HF_OPTIM: dict[str, tuple[str, str | None]] = {
    "adamw": ("adamw_torch_fused", None),
    "adamw_8bit": ("adamw_bnb_8bit", None),
    "paged_adamw_8bit": ("paged_adamw_8bit", None),
    "adafactor": ("adafactor", None),
    "sgd": ("sgd", "momentum=0.9"),
}

#: ftplan attention -> transformers ``attn_implementation``
HF_ATTN = {"sdpa": "sdpa", "flash": "flash_attention_2", "eager": "eager"}

#: ftplan dtype name -> torch dtype attribute
TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

#: learning rates when the plan has none (the usual starting points)
DEFAULT_LR = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}


def script_constants(model: ModelSpec, job: Job, layout: Layout, *, model_ref: str,
                     kind: str | None = None) -> dict[str, object]:
    """The constants block of the script, in order: name -> value (plain Python literals).

    ``kind`` is the launch kind (:func:`ftplan.export.targets.engine`; default: from the strategy).
    """
    from .accelerate import backend
    from .targets import tp_mesh

    kind = kind or ("tp" if layout.tp > 1 else backend(layout))
    mesh = tp_mesh(layout) if kind == "tp" else {"tp_size": 1, "dp_shard_size": 1, "dp_replicate_size": 1}
    prec = PRECISIONS[job.precision]
    mixed = job.precision.endswith("-mixed")
    if job.method == "full":
        load = prec["trainable"]
    elif job.method == "lora":
        load = job.frozen_dtype
    else:
        load = job.quant.compute_dtype
    optim, optim_args = HF_OPTIM[job.optimizer]
    from ..job import peft_target_modules

    target: object = peft_target_modules(model, job.lora)
    sharded_qlora = job.method == "qlora" and layout.strategy in ("zero3", "fsdp") and layout.world_size > 1
    return {
        "MODEL": model_ref,
        "METHOD": job.method,
        "PRECISION": job.precision,
        "MODEL_DTYPE": TORCH_DTYPE[load],
        # TRL's QLoRA recipe on one GPU / DDP keeps SFTTrainer's bf16 adapters (the plan's); sharded
        # engines hold fp32 trainable parameters whatever the recipe (see memory._engine_qlora_recipe)
        "TRAINABLE_DTYPE": TORCH_DTYPE[job.adapter_dtype if job.method == "qlora" and not sharded_qlora
                                       and job.adapter_dtype != "fp32" else prec["trainable"]],
        # FP8 plans: accelerate_config.yaml sets mixed_precision fp8 (bf16 autocast + FP8 linears);
        # SFTConfig(bf16=True) would replace it with plain bf16 (transformers reads the launcher's
        # ACCELERATE_MIXED_PRECISION only when bf16/fp16 are off)
        "BF16": mixed and prec["compute"] == "bf16" and job.low_precision is None,
        "FP16": mixed and prec["compute"] == "fp16",
        "OPTIM": optim,
        "OPTIM_ARGS": optim_args,
        "LEARNING_RATE": DEFAULT_LR[job.method],
        "MICRO_BATCH": job.micro_batch,
        "GRAD_ACCUM": job.grad_accum,
        "MAX_LENGTH": job.seq_len,
        "GRADIENT_CHECKPOINTING": job.gradient_checkpointing and getattr(job, "checkpointing", "full") != "none",
        "REENTRANT": getattr(job, "checkpointing", "full") == "full-reentrant",
        "LIGER": getattr(job, "loss", "trl") == "liger",
        "ACTIVATION_OFFLOADING": bool(getattr(job, "activation_offloading", False)),
        "PACKING": bool(getattr(job, "packing", False)),
        "PADDING_FREE": bool(getattr(job, "padding_free", False)),
        "LOSS_TYPE": "nll",
        "ATTN_IMPLEMENTATION": HF_ATTN[job.attn_impl],
        "LORA_R": job.lora.r,
        "LORA_ALPHA": job.lora.alpha,
        "LORA_DROPOUT": job.lora.dropout,
        "LORA_TARGET_MODULES": target,
        "QUANT_TYPE": job.quant.quant_type,
        "DOUBLE_QUANT": job.quant.double_quant,
        "COMPUTE_DTYPE": TORCH_DTYPE.get(job.quant.compute_dtype, job.quant.compute_dtype),
        "QUANT_STORAGE": TORCH_DTYPE.get(job.quant.compute_dtype, "uint8") if sharded_qlora else "uint8",
        "SHARDED_QLORA": sharded_qlora,
        "KBIT_PREPARE": job.method == "qlora" and job.kbit_upcast and not sharded_qlora,
        "NUM_EPOCHS": float(job.epochs),
        "WORLD_SIZE": layout.world_size,
        "STRATEGY": layout.strategy,
        "ENGINE": kind,
        "TP_SIZE": mesh["tp_size"],
        "DP_SHARD": mesh["dp_shard_size"],
        "DP_REPLICATE": mesh["dp_replicate_size"],
    }


_COMMENTS = {
    "MODEL": "local directory or hub id (--model overrides)",
    "METHOD": "full | lora | qlora",
    "PRECISION": "ftplan precision; the five lines below implement it",
    "MODEL_DTYPE": "dtype the weights are loaded in",
    "TRAINABLE_DTYPE": "dtype of the trained parameters (fp32 = master weights)",
    "BF16": "autocast to bf16 (mixed precision)",
    "FP16": "autocast to fp16 with loss scaling (mixed precision)",
    "OPTIM": "transformers TrainingArguments.optim",
    "OPTIM_ARGS": "TrainingArguments.optim_args",
    "LEARNING_RATE": "not planned by ftplan: a usual starting point (--learning-rate overrides)",
    "MICRO_BATCH": "per_device_train_batch_size",
    "GRAD_ACCUM": "gradient_accumulation_steps",
    "MAX_LENGTH": "SFTConfig.max_length: sequences are truncated to this many tokens",
    "GRADIENT_CHECKPOINTING": "non-reentrant activation checkpointing",
    "REENTRANT": "gradient_checkpointing_kwargs use_reentrant (ftplan plans non-reentrant unless asked)",
    "LIGER": "SFTConfig.use_liger_kernel: Liger's fused linear cross-entropy (CUDA, pip install liger-kernel)",
    "ACTIVATION_OFFLOADING": "SFTConfig.activation_offloading: saved activations kept on the CPU",
    "PACKING": "SFTConfig.packing: concatenate rows into max_length blocks",
    "PADDING_FREE": "SFTConfig.padding_free: flatten the batch (flash attention only)",
    "LOSS_TYPE": "SFTConfig.loss_type (TRL's default; chunked_nll is its deprecated alias)",
    "ATTN_IMPLEMENTATION": "sdpa | flash_attention_2 | eager",
    "LORA_R": "LoRA rank (lora / qlora)",
    "LORA_ALPHA": "",
    "LORA_DROPOUT": "",
    "LORA_TARGET_MODULES": "PEFT target_modules: 'all-linear' or a list of module names",
    "QUANT_TYPE": "QLoRA 4-bit type: nf4 | fp4",
    "DOUBLE_QUANT": "bnb_4bit_use_double_quant",
    "COMPUTE_DTYPE": "bnb_4bit_compute_dtype",
    "QUANT_STORAGE": "bnb_4bit_quant_storage (the compute dtype for FSDP/ZeRO-3 QLoRA)",
    "SHARDED_QLORA": "FSDP/ZeRO-3 QLoRA: every weight stays in QUANT_STORAGE (no fp32 upcast) so all shard alike",
    "KBIT_PREPARE": "QLoRA: peft.prepare_model_for_kbit_training (PEFT's recipe; False: TRL SFTTrainer's own)",
    "NUM_EPOCHS": "--num-epochs overrides; --max-steps wins over epochs",
    "WORLD_SIZE": "GPUs the plan uses (accelerate launch --num_processes)",
    "STRATEGY": "single | ddp | zero1 | zero2 | zero3 | fsdp (set by the accelerate config)",
    "ENGINE": "single | ddp | deepspeed | fsdp (FSDP2) | tp (transformers TP) | autotp (DeepSpeed)",
    "TP_SIZE": "tensor-parallel degree when ENGINE is tp (the model is loaded sharded)",
    "DP_SHARD": "FSDP2 data-parallel shards next to TP (ENGINE tp)",
    "DP_REPLICATE": "HSDP replicas next to TP (ENGINE tp)",
}


def _docstring_text(text: str) -> str:
    """``text`` safe inside the script's triple-quoted docstring: backslashes, quotes and
    non-printable characters escaped (a model name from a file path can hold anything)."""
    out = []
    for ch in str(text):
        if ch in ('\\', '"'):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _constants_block(consts: dict[str, object]) -> str:
    width = max(len(f"{k} = {v!r}") for k, v in consts.items())
    lines = []
    for k, v in consts.items():
        text = f"{k} = {v!r}"
        note = _COMMENTS.get(k, "")
        lines.append(f"{text:<{width}}  # {note}" if note else text)
    return "\n".join(lines)


def render_train_script(model: ModelSpec, job: Job, layout: Layout, *, model_ref: str,
                        kind: str | None = None) -> str:
    """The standalone ``train.py`` for ``job`` on ``model`` under ``layout`` (a str of Python).

    ``model_ref`` is what the script loads by default (a local directory or a hub id); ``kind`` the
    launch kind (:func:`ftplan.export.targets.engine`).
    """
    from ..job import validate_job
    from .skypilot import transformers_floor

    validate_job(model, job, layout)
    consts = script_constants(model, job, layout, model_ref=model_ref, kind=kind)
    for k, v in consts.items():  # a plan must never write inf/nan (NameError) into the script
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"train.py constant {k} would be {v!r}", "give finite numbers (e.g. `epochs=3`)")
    header = (
        f'#!/usr/bin/env python3\n'
        f'"""Fine-tune {_docstring_text(model.name)} ({job.method}) with TRL SFTTrainer: generated by ftplan {__version__}.\n\n'
        f'Plan: {job.method}, {job.precision}, {job.optimizer}, micro-batch {job.micro_batch} x '
        f'grad-accum {job.grad_accum}, seq {job.seq_len}'
        f'{", gradient checkpointing" if job.gradient_checkpointing else ""}, {layout.describe()}.\n'
        f'Needs: pip install "trl>=0.20" "datasets>=3.0" peft "transformers>={transformers_floor(str(consts["ENGINE"]), model.family)}" accelerate'
        f'{" bitsandbytes" if job.method == "qlora" or "8bit" in job.optimizer else ""}\n\n'
        f'Run:   python train.py --dataset data.jsonl --output-dir out'
        f'{"" if layout.world_size == 1 else f"   (or: accelerate launch --num_processes {layout.world_size} train.py ...)"}\n'
        f'Data:  a JSONL/JSON/Parquet/CSV file, a folder of them, a datasets.save_to_disk folder, or a hub\n'
        f'       dataset name; rows need "messages" (chat), "prompt" + "completion", or "text".\n'
        f'"""\n'
    )
    return (header + _PRELUDE + "# ---- the plan (edit freely) " + "-" * 66 + "\n"
            + _constants_block(consts) + "\n# " + "-" * 93 + "\n" + _BODY)


_PRELUDE = '''
import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

'''

_BODY = r'''
FIELD_SETS = (("messages",), ("prompt", "completion"), ("text",))  # first match wins


def fail(message):
    """One line on stderr and exit code 2 (bad input)."""
    print(f"train.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=MODEL, help=f"local directory or hub id (default {MODEL!r})")
    p.add_argument("--dataset", required=True,
                   help="JSONL/JSON/Parquet/CSV file, a folder of them, a save_to_disk folder or a hub name")
    p.add_argument("--output-dir", default="output", help="checkpoints and the final model")
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (wins over --num-epochs)")
    p.add_argument("--num-epochs", type=float, default=NUM_EPOCHS)
    p.add_argument("--save-steps", type=int, default=500, help="checkpoint every N steps")
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let the tokenizer run the checkpoint's own code (e.g. Kimi K2's); the model always "
                        "loads transformers' implementation of its architecture, the one ftplan planned")
    p.add_argument("--report-json", default=None,
                   help="write measured peak memory, tokens/s and step time here at the end")
    return p.parse_args(argv)


# ---- data -----------------------------------------------------------------------------------
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_train_dataset(spec):
    from datasets import DatasetDict, load_dataset, load_from_disk

    path = os.path.expanduser(spec)
    if os.path.isfile(path):
        ext = os.path.splitext(path)[1].lower()
        if ext not in _BUILDERS:
            fail(f"dataset file {spec!r} must end in {', '.join(_BUILDERS)}")
        ds = load_dataset(_BUILDERS[ext], data_files=path, split="train")
    elif os.path.isdir(path):
        names = set(os.listdir(path))
        if names & {"dataset_info.json", "state.json", "dataset_dict.json"}:
            ds = load_from_disk(path)
            if isinstance(ds, DatasetDict):
                ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
        else:
            files = {}
            for root, _, fs in os.walk(path):
                for f in fs:
                    ext = os.path.splitext(f)[1].lower()
                    if ext in _BUILDERS and not f.startswith("."):
                        files.setdefault(_BUILDERS[ext], []).append(os.path.join(root, f))
            if not files:
                ds = load_dataset(path, split="train")
            else:
                builder = "json" if "json" in files else sorted(files)[0]
                ds = load_dataset(builder, data_files=sorted(files[builder]), split="train")
    else:
        ds = load_dataset(spec, split="train")
    return ds


def select_fields(ds, spec):
    cols = list(ds.column_names)
    for fields in FIELD_SETS:
        if all(f in cols for f in fields):
            return ds.select_columns(list(fields)), fields
    fail(f"dataset {spec!r} has no 'messages', 'prompt'+'completion' or 'text' field "
         f"(fields found: {', '.join(cols) or 'none'})")


# ---- model ----------------------------------------------------------------------------------
def _config_dict(model_ref):
    from transformers import PretrainedConfig

    try:
        return PretrainedConfig.get_config_dict(model_ref)[0]
    except (OSError, ValueError) as e:
        fail(f"cannot read the config.json of {model_ref!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def _prequantized(raw):
    """The checkpoint's own quantization ("mxfp4": gpt-oss's experts, "fp8": DeepSeek-V3 / Kimi K2
    128x128 blocks), whose kernels are for inference: ftplan plans the weights dequantized."""
    qc = raw.get("quantization_config")
    method = str(qc.get("quant_method")) if isinstance(qc, dict) else ""
    return method if method in ("mxfp4", "fp8") else None


def _is_mxfp4(model_ref):
    return _prequantized(_config_dict(model_ref)) == "mxfp4"


def _architecture_config(raw):
    """transformers' own config for a checkpoint whose model_type it does not know but whose declared
    architecture it implements (Kimi K2: model_type kimi_k2, remote code = DeepseekV3ForCausalLM), so
    the model ftplan planned loads without trust_remote_code. None when transformers knows the type."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = raw.get("model_type")
    if model_type in CONFIG_MAPPING_NAMES:
        return None
    for arch in raw.get("architectures") or []:
        # the class's own config type (several model types reuse DeepseekV3ForCausalLM; its own is deepseek_v3)
        own = getattr(getattr(getattr(transformers, str(arch), None), "config_class", None), "model_type", None)
        if own in CONFIG_MAPPING_NAMES:
            fields = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map", "transformers_version")}
            return AutoConfig.for_model(own, **fields)
    fail(f"config model_type {model_type!r} is unknown to transformers {transformers.__version__} and declares "
         "no architecture it implements (architectures: "
         f"{', '.join(map(str, raw.get('architectures') or [])) or 'none'}): update transformers")


def _causal_lm_class(raw):
    """The causal LM class of a model type AutoModelForCausalLM does not map (transformers 5.24:
    mistral4, whose Mistral4ForCausalLM only the pretraining and image-text auto classes name), else
    None. Mistral Small 4's own checkpoint is a Mistral3ForConditionalGeneration (a Pixtral vision
    tower around the mistral4 text model), which AutoModelForCausalLM does not load either."""
    import transformers

    text = raw.get("text_config")
    if raw.get("model_type") == "mistral4":
        return transformers.Mistral4ForCausalLM
    if isinstance(text, dict) and text.get("model_type") == "mistral4":
        fail("this checkpoint is a Mistral3ForConditionalGeneration (vision tower + mistral4 text model), which "
             "AutoModelForCausalLM does not load; ftplan planned its text model: point --model at a "
             "Mistral4ForCausalLM copy of the text weights")
    return None


def load_model(model_ref):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": getattr(torch, MODEL_DTYPE), "attn_implementation": ATTN_IMPLEMENTATION}
    raw = _config_dict(model_ref)
    model_cls = _causal_lm_class(raw) or AutoModelForCausalLM
    config = _architecture_config(raw)
    if config is not None:
        kwargs["config"] = config
    prequantized = _prequantized(raw)
    if prequantized:  # gpt-oss's MXFP4 experts, DeepSeek-V3 / Kimi K2's FP8 blocks: inference kernels
        if METHOD == "qlora":
            fail(f"this checkpoint is {prequantized.upper()} ({raw.get('model_type')}): transformers refuses a "
                 "BitsAndBytesConfig for it; QLoRA needs a bf16 copy of the weights (--model DIR), or plan LoRA instead")
        from transformers import FineGrainedFP8Config, Mxfp4Config

        dequantized = Mxfp4Config if prequantized == "mxfp4" else FineGrainedFP8Config
        kwargs["quantization_config"] = dequantized(dequantize=True)  # train on the bf16 weights ftplan plans
    if ENGINE == "tp":  # sharded at load time by transformers (the model's TP plan, FSDP2 over DP_SHARD)
        from transformers import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(tp_size=TP_SIZE, fsdp_size=DP_SHARD,
                                                         dp_replicate_size=DP_REPLICATE)
    if METHOD == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=QUANT_TYPE,
            bnb_4bit_use_double_quant=DOUBLE_QUANT,
            bnb_4bit_compute_dtype=getattr(torch, COMPUTE_DTYPE),
            bnb_4bit_quant_storage=getattr(torch, QUANT_STORAGE),
        )
        if ENGINE not in ("fsdp", "deepspeed") or STRATEGY not in ("zero3", "fsdp"):
            # one GPU per process; sharded QLoRA (FSDP / ZeRO-3) loads on CPU and the launcher shards
            if torch.cuda.is_available():
                kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
            else:
                kwargs["device_map"] = {"": "cpu"}
    model = model_cls.from_pretrained(model_ref, **kwargs)
    model.config.use_cache = False
    if METHOD == "qlora" and SHARDED_QLORA:
        # FSDP / ZeRO-3 QLoRA (TRL's and PEFT's recipe): no prepare_model_for_kbit_training, whose fp32 upcast
        # of the non-quantized weights would leave them in another dtype than the 4-bit storage to shard
        if GRADIENT_CHECKPOINTING:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": REENTRANT})
            model.enable_input_require_grads()
    elif METHOD == "qlora" and KBIT_PREPARE:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=GRADIENT_CHECKPOINTING,
            gradient_checkpointing_kwargs={"use_reentrant": REENTRANT})
    return model


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=LORA_DROPOUT,
                      target_modules=LORA_TARGET_MODULES, bias="none", task_type="CAUSAL_LM")


# ---- measurement ----------------------------------------------------------------------------
def make_trainer_class(SFTTrainer, TrainerCallback):
    class StepTimer(TrainerCallback):
        def __init__(self, stats):
            self.stats = stats
            self.t0 = None

        def on_step_begin(self, args, state, control, **kw):
            _sync()
            self.t0 = time.perf_counter()
            self.stats["tokens_at_begin"] = self.stats["tokens"]

        def on_step_end(self, args, state, control, **kw):
            if self.t0 is None:
                return
            _sync()
            self.stats["step_times"].append(time.perf_counter() - self.t0)
            self.stats["step_tokens"].append(self.stats["tokens"] - self.stats["tokens_at_begin"])

    class MeasuredSFTTrainer(SFTTrainer):
        """SFTTrainer that counts the tokens of every micro-batch (padded and real)."""

        def __init__(self, *args, **kwargs):
            self.stats = {"tokens": 0, "real_tokens": 0, "max_len": 0, "micro_batches": 0,
                          "step_times": [], "step_tokens": [], "tokens_at_begin": 0}
            super().__init__(*args, **kwargs)
            self.add_callback(StepTimer(self.stats))

        def training_step(self, model, inputs, *args, **kwargs):
            ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
            if ids is not None:
                mask = inputs.get("attention_mask")
                self.stats["tokens"] += int(ids.numel())
                self.stats["real_tokens"] += int(mask.sum()) if mask is not None else int(ids.numel())
                self.stats["max_len"] = max(self.stats["max_len"], int(ids.shape[-1]))
                self.stats["micro_batches"] += 1
            return super().training_step(model, inputs, *args, **kwargs)

    return MeasuredSFTTrainer


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def write_report(path, trainer, wall_s, device):
    import torch

    st = trainer.stats
    times, toks = st["step_times"], st["step_tokens"]
    timed = list(range(1, len(times))) if len(times) > 1 else list(range(len(times)))  # skip warm-up
    t_sum = sum(times[i] for i in timed)
    world = trainer.args.world_size
    losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    losses = [x for x in losses if math.isfinite(x)]
    tps_dev = sum(toks[i] for i in timed) / t_sum if t_sum > 0 else None
    report = {
        "schema": "ftplan.train-report/1",
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "cuda": torch.version.cuda,
        "device_total_bytes": (int(torch.cuda.get_device_properties(0).total_memory)
                               if device == "cuda" else None),
        "world_size": world,
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()) if device == "cuda" else None,
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()) if device == "cuda" else None,
        "steps": int(trainer.state.global_step),
        "step_times_s": [round(t, 6) for t in times],
        "median_step_s": statistics.median([times[i] for i in timed]) if timed else None,
        "tokens_per_s": tps_dev * world if tps_dev else None,  # all processes (rank 0 x world size)
        "tokens_per_s_per_device": tps_dev,
        "tokens_seen": st["tokens"],
        "real_tokens_seen": st["real_tokens"],
        "max_seq_len_seen": st["max_len"],
        "mean_tokens_per_micro_batch": st["tokens"] / st["micro_batches"] if st["micro_batches"] else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "train_loss": next((h["train_loss"] for h in reversed(trainer.state.log_history)
                            if "train_loss" in h), None),
        "wall_s": wall_s,
        "plan": {k: globals()[k] for k in ("METHOD", "PRECISION", "OPTIM", "MICRO_BATCH", "GRAD_ACCUM",
                                            "MAX_LENGTH", "GRADIENT_CHECKPOINTING", "ATTN_IMPLEMENTATION")},
        "versions": _versions(),
    }
    for k in ("train_loss",):
        if isinstance(report[k], float) and not math.isfinite(report[k]):
            report[k] = None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)


def _versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


# ---- main -----------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_ds, fields = select_fields(load_train_dataset(args.dataset), args.dataset)

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        hint = ("; its tokenizer is the checkpoint's own code: rerun with --trust-remote-code"
                if "trust_remote_code" in str(e) and not args.trust_remote_code else "")
        fail(f"cannot load the tokenizer of {args.model!r}: {(str(e).splitlines() or [type(e).__name__])[0]}{hint}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if fields == ("messages",) and not getattr(tokenizer, "chat_template", None):
        fail(f"dataset {args.dataset!r} is chat ('messages') but the tokenizer of {args.model!r} has no "
             "chat_template (use a 'text' dataset or a model with a chat template)")

    # names differ across versions: TRL < 0.20 has max_seq_length; transformers >= 5 renamed
    # gradient_checkpointing to activation_checkpointing (the old name is a deprecated alias)
    names = {f.name for f in dataclasses.fields(SFTConfig)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    length = "max_length" if "max_length" in names else "max_seq_length"
    config = SFTConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=GRAD_ACCUM,
        num_train_epochs=args.num_epochs,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        optim=OPTIM,
        optim_args=OPTIM_ARGS,
        bf16=BF16,
        fp16=FP16,
        use_cpu=device == "cpu",
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_steps=args.logging_steps,
        seed=args.seed,
        report_to="none",
        disable_tqdm=False,
        **{length: MAX_LENGTH, ckpt: GRADIENT_CHECKPOINTING,
           ckpt + "_kwargs": {"use_reentrant": REENTRANT} if GRADIENT_CHECKPOINTING else None},
        **{k: v for k, v in (("packing", PACKING), ("padding_free", PADDING_FREE), ("loss_type", LOSS_TYPE),
                             ("activation_offloading", ACTIVATION_OFFLOADING), ("use_liger_kernel", LIGER))
           if k in names and (v or k != "use_liger_kernel")},
    )
    model = load_model(args.model)
    Trainer = make_trainer_class(SFTTrainer, TrainerCallback)
    trainer = Trainer(
        model=model,
        args=config,
        train_dataset=train_ds,
        processing_class=tokenizer,
        peft_config=lora_config() if METHOD in ("lora", "qlora") else None,
    )
    # the plan's trainable dtype (TRL >= 1.0 casts QLoRA adapters to bf16; PEFT's default is fp32)
    dtype = getattr(torch, TRAINABLE_DTYPE)
    for p in trainer.model.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # a restarted run (e.g. a recovered spot job) resumes from the last checkpoint in --output-dir
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if last and trainer.is_world_process_zero():
        print(f"resuming from {last}")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=last)
    wall = time.perf_counter() - t0
    if getattr(trainer, "is_fsdp_enabled", False):  # one consolidated file, not per-rank shards
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(args.output_dir)  # the adapter (LoRA/QLoRA) or the full weights (all ranks take part)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(args.output_dir)
        if args.report_json:
            write_report(args.report_json, trainer, wall, device)
        print(f"saved {'adapter' if METHOD != 'full' else 'model'} and tokenizer to {args.output_dir}")


if __name__ == "__main__":
    main()
'''
