"""``llamafactory.yaml`` for a plan (``--target llamafactory``): ``llamafactory-cli train llamafactory.yaml``.

Keys follow LLaMA-Factory 0.9.5's argument dataclasses (``llamafactory/hparams/{model,data,finetuning,
training}_args.py`` + transformers' ``Seq2SeqTrainingArguments``), which ``llamafactory-cli train``
parses with ``HfArgumentParser.parse_dict`` and refuses unknown keys. The tests parse the file with
LLaMA-Factory's own ``hparams.parser._parse_train_args`` when it is importable, and against
:data:`SCHEMA_KEYS` (encoded from those dataclasses) always.

The engine files it references: ``deepspeed: ds_config.json`` for ZeRO (launched with
``FORCE_TORCHRUN=1``, as LLaMA-Factory requires for DeepSpeed), or an accelerate FSDP2 config
(``accelerate launch --config_file accelerate_config.yaml -m llamafactory.launcher llamafactory.yaml``,
LLaMA-Factory's FSDP recipe). ``dataset_info.json`` registers the dataset as ``train`` in
ShareGPT/OpenAI form (``messages`` of ``{role, content}``, what ``train.py`` reads).

What the plan decides is written explicitly: ``finetuning_type`` full/lora (+ ``quantization_bit: 4``
bitsandbytes for QLoRA, whose ``bnb_4bit_quant_storage`` LLaMA-Factory sets to the compute dtype under
FSDP/ZeRO-3), LoRA rank/alpha/dropout/targets, ``cutoff_len``, ``packing: false``, batch, optimizer,
precision (``pure_bf16`` for pure bf16), gradient checkpointing (LLaMA-Factory turns it on unless
``disable_gradient_checkpointing``; ``use_reentrant_gc: false`` = non-reentrant like the planner),
attention (``flash_attn``: sdpa / fa2 / disabled).
"""

from __future__ import annotations

import json
from typing import Any

from ..job import Job, Layout
from ..model import ModelSpec
from .script import DEFAULT_LR, HF_OPTIM
from .yamltext import Commented, dump_yaml

__all__ = ["llamafactory_config", "render_llamafactory", "template_for", "SCHEMA_KEYS", "SCHEMA_SOURCE"]

SCHEMA_SOURCE = "LLaMA-Factory 0.9.5 (PyPI wheel): llamafactory/hparams/*_args.py, data/template.py"

#: keys the export writes, with their types in LLaMA-Factory 0.9.5's dataclasses (or TrainingArguments)
SCHEMA_KEYS: dict[str, tuple[type, ...]] = {
    "model_name_or_path": (str,), "trust_remote_code": (bool,), "flash_attn": (str,),
    "quantization_bit": (int,), "quantization_method": (str,), "quantization_type": (str,),
    "double_quantization": (bool,), "stage": (str,), "do_train": (bool,), "finetuning_type": (str,),
    "lora_rank": (int,), "lora_alpha": (int,), "lora_dropout": (float, int), "lora_target": (str,),
    "deepspeed": (str,), "dataset": (str,), "dataset_dir": (str,), "template": (str,), "cutoff_len": (int,),
    "packing": (bool,), "overwrite_cache": (bool,), "preprocessing_num_workers": (int,),
    "output_dir": (str,), "logging_steps": (int,), "save_steps": (int,), "plot_loss": (bool,),
    "report_to": (str,), "per_device_train_batch_size": (int,), "gradient_accumulation_steps": (int,),
    "learning_rate": (float,), "num_train_epochs": (float, int), "lr_scheduler_type": (str,),
"bf16": (bool,), "fp16": (bool,), "pure_bf16": (bool,), "optim": (str,),
    "disable_gradient_checkpointing": (bool,), "use_reentrant_gc": (bool,), "ddp_timeout": (int,),
    "enable_liger_kernel": (bool,), "val_size": (float,),
}

#: LLaMA-Factory 0.9.5 chat templates (``data/template.py``) per bundled family / model
_TEMPLATES = {"llama": "llama3", "qwen2": "qwen", "qwen3": "qwen3", "qwen3_moe": "qwen3", "mistral": "mistral",
              "mixtral": "mistral", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
              "phi3": "phi", "deepseek_v3": "deepseek3", "gpt_oss": "gpt_oss",
              "glm4_moe": "glm4_moe", "qwen3_5": "qwen3_5", "qwen3_5_moe": "qwen3_5", "qwen3_next": "qwen3",
              # 0.9.5 has no olmo2/olmo3/smollm3 template: OLMo 2 Instruct's Tulu tags (<|user|>/<|assistant|>)
              # are its "olmo"; OLMo 3 Instruct and SmolLM3 speak ChatML (<|im_start|>...<|im_end|>), without
              # their default system prompts and tool formats there ("chatml", "smollm")
              "olmo2": "olmo", "olmo3": "chatml", "smollm3": "smollm", "llama4_text": "llama4",
              "gemma4": "gemma4",  # 0.9.5 registers gemma4 (and gemma4n for the audio models)
              # GLM-4.7-Flash: 0.9.5's constants.py registers it with glm4_7 (glm4_moe's format and <think>)
              "glm4_moe_lite": "glm4_7",
              # MiniMax-M2 / M2.1: 0.9.5's constants.py registers both with minimax2 (]~b]ROLE ... [e~[, <think>)
              "minimax_m2": "minimax2",
              # LFM2: 0.9.5 registers lfm2 (LiquidAI's ChatML-like format with its tool tokens) for LFM2.5
              "lfm2": "lfm2",
              # Granite 3.x: 0.9.5's constants.py registers granite-3.x (3.0 to 3.3) with granite3
              "granite": "granite3",
              # ERNIE 4.5: 0.9.5's constants.py registers the -PT (instruct) checkpoints with ernie_nothink
              "ernie4_5": "ernie_nothink",
              # Seed-OSS: 0.9.5's constants.py registers Seed-OSS-36B (Base and Instruct) with seed_oss
              "seed_oss": "seed_oss",
              # Granite 3.x MoE (1b-a400m, 3b-a800m): registered with granite3 as the dense ones
              "granitemoe": "granite3",
              # Hunyuan dense (0.5B to 7B Instruct): 0.9.5's constants.py registers them with hunyuan
              "hunyuan_v1_dense": "hunyuan",
              # ERNIE 4.5 MoE: 0.9.5's constants.py registers ERNIE-4.5-21B-A3B-PT / 300B-A47B-PT with
              # ernie_nothink (the 21B-A3B-Thinking checkpoint with ernie)
              "ernie4_5_moe": "ernie_nothink",
              # Gemma 1 (Gemma-2B/7B and -Instruct), Qwen1.5-MoE / Qwen2-57B-A14B, GLM-4-9B/32B-0414: 0.9.5's
              # constants.py registers them with gemma, qwen and glm4
              "gemma": "gemma", "qwen2_moe": "qwen", "glm4": "glm4"}
#: Kimi K2 (planned as deepseek_v3) speaks Moonshot's <|im_user|>/<|im_assistant|>/<|im_middle|> format,
#: which 0.9.5 registers as kimi_vl; Phi-4-mini's <|user|>...<|end|> format as phi4_mini. The catalog's
#: Qwen3-Next is the Instruct checkpoint, which 0.9.5's constants.py registers with qwen3_nothink (the
#: family's default, qwen3, is the Thinking checkpoint's)
_BY_NAME = {"phi-4": "phi4", "mistral-small-24b": "mistral_small", "kimi-k2": "kimi_vl", "phi-4-mini": "phi4_mini",
            "qwen3-next-80b-a3b": "qwen3_nothink"}
_FLASH = {"sdpa": "sdpa", "flash": "fa2", "eager": "disabled"}


def template_for(model: ModelSpec) -> str:
    return _BY_NAME.get(model.name) or _TEMPLATES.get(model.family, "default")


def _dataset_info(dataset: str | None) -> dict[str, Any]:
    path = dataset or "data.jsonl"
    local = path.endswith((".json", ".jsonl", ".parquet", ".csv", ".arrow")) or path.startswith((".", "/", "~"))
    entry: dict[str, Any] = {"file_name": path} if local else {"hf_hub_url": path}
    entry.update({
        "formatting": "sharegpt",
        "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                 "system_tag": "system"},
    })
    return {"train": entry}


def llamafactory_config(model: ModelSpec, job: Job, layout: Layout, *, kind: str, model_ref: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {"model_name_or_path": model_ref, "trust_remote_code": False,
                           "flash_attn": _FLASH[job.attn_impl]}
    if job.method == "qlora":
        q = job.quant
        cfg["quantization_bit"] = 4
        cfg["quantization_method"] = "bnb"
        cfg["quantization_type"] = q.quant_type
        cfg["double_quantization"] = q.double_quant
    cfg["stage"] = "sft"
    cfg["do_train"] = True
    cfg["finetuning_type"] = "full" if job.method == "full" else "lora"
    if job.uses_lora:
        lo = job.lora
        cfg["lora_rank"] = lo.r
        cfg["lora_alpha"] = lo.alpha
        cfg["lora_dropout"] = float(lo.dropout)
        from ..job import peft_target_modules

        targets = peft_target_modules(model, lo)
        cfg["lora_target"] = "all" if targets == "all-linear" else ",".join(targets)
    if kind == "deepspeed":
        cfg["deepspeed"] = "ds_config.json"
    cfg["dataset"] = Commented("train", "registered in dataset_info.json (dataset_dir)")
    cfg["dataset_dir"] = "."
    cfg["template"] = template_for(model)
    cfg["cutoff_len"] = job.seq_len
    cfg["packing"] = bool(getattr(job, "packing", False))
    cfg["overwrite_cache"] = True
    cfg["preprocessing_num_workers"] = 8
    cfg["output_dir"] = "output"
    cfg["logging_steps"] = 10
    cfg["save_steps"] = 500
    cfg["plot_loss"] = False
    cfg["report_to"] = "none"
    cfg["per_device_train_batch_size"] = job.micro_batch
    cfg["gradient_accumulation_steps"] = job.grad_accum
    cfg["learning_rate"] = float(DEFAULT_LR[job.method])
    cfg["num_train_epochs"] = float(job.epochs)
    cfg["lr_scheduler_type"] = "cosine"
    pure = job.precision == "bf16"
    cfg["bf16"] = job.precision == "bf16-mixed"
    cfg["fp16"] = job.precision == "fp16-mixed"
    if pure:
        cfg["pure_bf16"] = Commented(True, "pure bf16: weights, gradients and optimizer states in bf16")
    cfg["optim"] = HF_OPTIM[job.optimizer][0]
    ckpt = getattr(job, "checkpointing", "full")
    cfg["disable_gradient_checkpointing"] = not (job.gradient_checkpointing and ckpt != "none")
    cfg["use_reentrant_gc"] = Commented(ckpt == "full-reentrant", "non-reentrant checkpointing unless the plan "
                                        "says full-reentrant")
    if getattr(job, "loss", None) == "liger":
        cfg["enable_liger_kernel"] = True
    cfg["ddp_timeout"] = 180000000
    return cfg


def render_llamafactory(files: dict[str, str], model: ModelSpec, job: Job, layout: Layout, *, kind: str,
                        hsdp: bool, title: str, model_ref: str, dataset: str | None,
                        notes: list[str]) -> dict[str, Any]:
    """Add ``llamafactory.yaml``, ``dataset_info.json`` and the engine file to ``files``; return the launch."""
    from .accelerate import render_accelerate_config
    from .deepspeed import render_deepspeed_config

    cfg = llamafactory_config(model, job, layout, kind=kind, model_ref=model_ref)
    header = (f"LLaMA-Factory train config for {title}\ngenerated by ftplan export; run: see README.md "
              "(schema: LLaMA-Factory 0.9.5)")
    files["llamafactory.yaml"] = dump_yaml(cfg, header=header)
    files["dataset_info.json"] = json.dumps(_dataset_info(dataset), indent=2) + "\n"
    pkgs = ["llamafactory>=0.9.5"]
    if kind == "deepspeed":
        files["ds_config.json"] = render_deepspeed_config(layout, job)
        pkgs.append("deepspeed>=0.16")
    if job.method == "qlora" or "8bit" in job.optimizer:
        pkgs.append("bitsandbytes>=0.45")
    if kind == "fsdp":
        files["accelerate_config.yaml"] = render_accelerate_config(layout, job, kind="fsdp", title=title, hsdp=hsdp)
        cmd = "accelerate launch --config_file accelerate_config.yaml"
        if layout.nodes > 1:
            cmd += " --machine_rank $NODE_RANK --main_process_ip $HEAD_IP"
        cmd += " -m llamafactory.launcher llamafactory.yaml"
    elif layout.world_size > 1:
        cmd = f"FORCE_TORCHRUN=1 NPROC_PER_NODE={layout.gpus_per_node} llamafactory-cli train llamafactory.yaml"
        if layout.nodes > 1:
            cmd = f"FORCE_TORCHRUN=1 NNODES={layout.nodes} llamafactory-cli train llamafactory.yaml"
    else:
        cmd = "llamafactory-cli train llamafactory.yaml"
    notes.append(f"LLaMA-Factory: chat template {cfg['template']!r}; the learning rate is not planned by ftplan "
                 "(a usual starting point is written)")
    prelude = ['if [ "$DATASET" != "data.jsonl" ]; then python -c "import json,sys; p=\'dataset_info.json\'; '
               "d=json.load(open(p)); e=d['train']; e.pop('file_name',None); e.pop('hf_hub_url',None); "
               "import os; e['file_name' if os.path.exists(sys.argv[1]) else 'hf_hub_url']=sys.argv[1]; "
               'json.dump(d,open(p,\'w\'),indent=2)" "$DATASET"; fi']
    return {
        "packages": pkgs,
        "command": cmd,
        "sky_prelude": prelude,
        "sky_command": cmd,
        "data_text": ["The dataset (`dataset_info.json`, entry `train`: a local JSON/JSONL/Parquet file or a hub "
                      "dataset) has chat rows: a `messages` list of `{role, content}` (ShareGPT/OpenAI form).", ""],
    }
