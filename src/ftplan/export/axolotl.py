"""``axolotl.yaml`` for a plan (``--target axolotl``): ``axolotl train axolotl.yaml``.

Keys follow axolotl's pydantic input schema (``axolotl.utils.schemas.config.AxolotlInputConfig``,
axolotl 0.19.0, the newest release that installs on Python 3.11; 0.20+ needs Python 3.12), read from
the PyPI wheel's ``utils/schemas/{config,training,model,peft,fsdp,datasets}.py`` and
``integrations/liger/args.py``. The tests load the file with axolotl's own ``validate_config`` when
axolotl is importable, and against :data:`SCHEMA_KEYS` (encoded from that schema) always.

What the plan decides is written explicitly, so that axolotl's defaults cannot change the job:

* method: full (no ``adapter``), ``adapter: lora`` or ``adapter: qlora`` + ``load_in_4bit: true`` with
  ``bnb_config_kwargs`` (quant type, double quant, ``bnb_4bit_quant_storage`` = the compute dtype,
  which FSDP/ZeRO-3 need to shard 4-bit weights); LoRA rank, alpha, dropout, targets
  (``lora_target_linear: true`` for all-linear);
* precision: ``bf16``/``fp16`` (autocast for the ``-mixed`` precisions; pure ``bf16`` loads the weights
  in bf16 with ``bfloat16: true``), ``tf32: false``;
* batch: ``micro_batch_size``, ``gradient_accumulation_steps``, ``sequence_len`` with
  ``pad_to_sequence_len: true`` and ``sample_packing: false`` (ftplan's memory is per padded row of
  ``sequence_len``), ``gradient_checkpointing`` (non-reentrant), ``activation_offloading``;
* optimizer (HF names, :data:`ftplan.export.script.HF_OPTIM`), ``attn_implementation``;
* layout: ``fsdp_version: 2`` + ``fsdp_config`` (``reshard_after_forward``, offload, CPU-RAM-efficient
  loading: off with 4-bit weights, which axolotl refuses under FSDP2), ``dp_shard_size`` /
  ``dp_replicate_size`` (HSDP across nodes), ``deepspeed: ds_config.json`` for ZeRO and offload,
  ``tensor_parallel_size`` with DeepSpeed AutoTP, ``context_parallel_size: 1``;
* ``plugins: [axolotl.integrations.liger.LigerPlugin]`` + ``liger_*`` keys when the plan's loss path is
  Liger (``job.loss == "liger"``); ``fp8: false`` (FP8 training is not planned yet).
"""

from __future__ import annotations

from typing import Any

from ..job import Job, Layout
from ..model import ModelSpec
from .script import DEFAULT_LR, HF_OPTIM
from .yamltext import Commented, dump_yaml

__all__ = ["axolotl_config", "render_axolotl", "SCHEMA_KEYS", "SCHEMA_SOURCE"]

SCHEMA_SOURCE = "axolotl 0.19.0 (PyPI wheel): axolotl/utils/schemas/*.py, axolotl/integrations/liger/args.py"

#: top-level keys the export writes, with the types axolotl 0.19.0's schema declares for them
SCHEMA_KEYS: dict[str, tuple[type, ...]] = {
    "base_model": (str,), "load_in_4bit": (bool,), "adapter": (str,), "bnb_config_kwargs": (dict,),
    "lora_r": (int,), "lora_alpha": (int,), "lora_dropout": (float, int), "lora_target_linear": (bool,),
    "lora_target_modules": (str, list), "datasets": (list,), "dataset_prepared_path": (str,),
    "val_set_size": (float, int), "output_dir": (str,), "sequence_len": (int,), "sample_packing": (bool,),
    "pad_to_sequence_len": (bool,), "micro_batch_size": (int,), "gradient_accumulation_steps": (int,),
    "num_epochs": (float, int), "learning_rate": (float, str), "optimizer": (str,), "lr_scheduler": (str,),
    "bf16": (bool, str), "fp16": (bool,), "bfloat16": (bool,), "tf32": (bool, str), "fp8": (bool,),
    "gradient_checkpointing": (bool, str), "gradient_checkpointing_kwargs": (dict,),
    "activation_offloading": (bool, str), "attn_implementation": (str,), "fsdp_version": (int,),
    "fsdp_config": (dict,), "dp_shard_size": (int,), "dp_replicate_size": (int,), "deepspeed": (str, dict),
    "tensor_parallel_size": (int,), "context_parallel_size": (int,), "plugins": (list,),
    "liger_rope": (bool,), "liger_rms_norm": (bool,), "liger_glu_activation": (bool,),
    "liger_fused_linear_cross_entropy": (bool,), "logging_steps": (int,), "saves_per_epoch": (int,),
    "save_steps": (int,), "special_tokens": (dict,), "trust_remote_code": (bool,),
}
#: fsdp_config keys of axolotl 0.19.0's ``FSDPConfig`` (``utils/schemas/fsdp.py``, no ``fsdp_`` prefix)
FSDP_KEYS = {"fsdp_version", "activation_checkpointing", "offload_params", "sync_module_states",
             "cpu_ram_efficient_loading", "cpu_offload_pin_memory", "use_orig_params", "state_dict_type",
             "final_state_dict_type", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "min_num_params",
             "reshard_after_forward", "mixed_precision_policy"}

_ATTN = {"sdpa": "sdpa", "flash": "flash_attention_2", "eager": "eager"}
_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _dataset_entry(dataset: str | None) -> dict[str, Any]:
    path = dataset or "data.jsonl"
    entry: dict[str, Any] = {"path": path}
    if path.endswith((".jsonl", ".json")):
        entry["ds_type"] = "json"
    elif path.endswith(".parquet"):
        entry["ds_type"] = "parquet"
    entry["type"] = "chat_template"
    entry["field_messages"] = "messages"
    entry["split"] = "train"
    return entry


def axolotl_config(model: ModelSpec, job: Job, layout: Layout, *, kind: str, hsdp: bool, model_ref: str,
                   dataset: str | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"base_model": model_ref}
    if job.method == "qlora":
        q = job.quant
        cfg["adapter"] = "qlora"
        cfg["load_in_4bit"] = True
        cfg["bnb_config_kwargs"] = Commented(
            {"bnb_4bit_quant_type": q.quant_type, "bnb_4bit_use_double_quant": q.double_quant,
             "bnb_4bit_quant_storage": _DTYPE.get(q.compute_dtype, "bfloat16")},
            "4-bit storage in the compute dtype: FSDP / ZeRO-3 shard the packed weights like any other")
    elif job.method == "lora":
        cfg["adapter"] = "lora"
    if job.uses_lora:
        lo = job.lora
        cfg["lora_r"] = lo.r
        cfg["lora_alpha"] = lo.alpha
        cfg["lora_dropout"] = float(lo.dropout)
        from ..job import peft_target_modules

        targets = peft_target_modules(model, lo)
        if targets == "all-linear":
            cfg["lora_target_linear"] = True
        else:
            cfg["lora_target_modules"] = list(targets)
    cfg["datasets"] = Commented([_dataset_entry(dataset)],
                                'chat rows with a "messages" list (role/content), as train.py reads them')
    cfg["dataset_prepared_path"] = "last_run_prepared"
    cfg["val_set_size"] = 0.0
    cfg["output_dir"] = "./output"
    cfg["sequence_len"] = job.seq_len
    cfg["sample_packing"] = Commented(bool(getattr(job, "packing", False)),
                                      "ftplan's memory is per padded row of sequence_len")
    pad = not bool(getattr(job, "packing", False) or getattr(job, "padding_free", False))
    if pad and job.attn_impl != "flash" and not getattr(job, "padded_batches", False):
        # a row shorter than sequence_len is padded (attention_mask 0): sdpa then takes a
        # materialised mask and repeats k/v, which this plan (no padded batches) leaves out
        cfg["pad_to_sequence_len"] = Commented(True, "rows shorter than sequence_len get attention_mask zeros: "
                                                     "planned without them (ftplan --padded plans them)")
    else:
        cfg["pad_to_sequence_len"] = pad
    cfg["micro_batch_size"] = job.micro_batch
    cfg["gradient_accumulation_steps"] = job.grad_accum
    cfg["num_epochs"] = float(job.epochs)
    cfg["learning_rate"] = DEFAULT_LR[job.method]
    cfg["optimizer"] = HF_OPTIM[job.optimizer][0]
    cfg["lr_scheduler"] = "cosine"
    cfg["bf16"] = job.precision == "bf16-mixed" or (job.method == "qlora" and job.quant.compute_dtype == "bf16"
                                                    and job.precision != "fp16-mixed")
    cfg["fp16"] = job.precision == "fp16-mixed"
    if job.precision == "bf16" and job.method == "full":
        cfg["bfloat16"] = Commented(True, "pure bf16: weights, gradients and optimizer states in bf16")
    cfg["tf32"] = False
    cfg["fp8"] = Commented(False, "FP8 training is not planned by ftplan yet")
    gc = job.gradient_checkpointing and getattr(job, "checkpointing", "full") != "none"
    cfg["gradient_checkpointing"] = gc
    if gc:
        cfg["gradient_checkpointing_kwargs"] = {"use_reentrant": getattr(job, "checkpointing", "full") == "full-reentrant"}
    cfg["activation_offloading"] = bool(getattr(job, "activation_offloading", False)) and gc
    cfg["attn_implementation"] = _ATTN[job.attn_impl]
    if getattr(job, "loss", None) == "liger":
        cfg["plugins"] = ["axolotl.integrations.liger.LigerPlugin"]
        cfg["liger_rope"] = True
        cfg["liger_rms_norm"] = True
        cfg["liger_glu_activation"] = True
        cfg["liger_fused_linear_cross_entropy"] = True
    if kind == "fsdp":
        cfg["fsdp_version"] = 2
        cfg["fsdp_config"] = Commented({
            "reshard_after_forward": True,
            "offload_params": bool(layout.offload_params),
            "cpu_ram_efficient_loading": job.method != "qlora",
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
            "final_state_dict_type": "FULL_STATE_DICT",
            "activation_checkpointing": False,
        }, "FSDP2; gradient checkpointing is the top-level key (one place only); 4-bit weights need "
           "cpu_ram_efficient_loading off under FSDP2 (axolotl refuses it)")
        if hsdp:
            cfg["dp_replicate_size"] = layout.nodes
            cfg["dp_shard_size"] = layout.gpus_per_node
        else:
            cfg["dp_shard_size"] = layout.world_size
    elif kind in ("deepspeed", "autotp"):
        cfg["deepspeed"] = "ds_config.json"
        if kind == "autotp":
            cfg["tensor_parallel_size"] = Commented(layout.tp, "DeepSpeed AutoTP (axolotl: TP only with DeepSpeed)")
    cfg["context_parallel_size"] = 1
    cfg["logging_steps"] = 10
    cfg["saves_per_epoch"] = 1
    return cfg


def _launch(layout: Layout, job: Job, kind: str) -> dict[str, Any]:
    pkgs = ["axolotl>=0.19"]
    if kind in ("deepspeed", "autotp"):
        pkgs.append("deepspeed>=0.16.4")
    if getattr(job, "loss", None) == "liger":
        pkgs.append("liger-kernel")
    cmd = "axolotl train axolotl.yaml"
    if layout.nodes > 1:
        cmd += (f" --launcher torchrun -- --nnodes {layout.nodes} --nproc_per_node {layout.gpus_per_node} "
                "--node_rank $NODE_RANK --master_addr $HEAD_IP --master_port 29500")
    elif layout.world_size > 1:
        cmd += f" --launcher torchrun -- --nproc_per_node {layout.world_size}"
    return {
        "packages": pkgs,
        "command": cmd,
        "sky_prelude": ['if [ "$DATASET" != "data.jsonl" ]; then sed -i "s|path: data.jsonl|path: $DATASET|" '
                        "axolotl.yaml; fi"],
        "sky_command": cmd,
        "data_text": ["The dataset (`datasets[0].path` in `axolotl.yaml`: a local JSON/JSONL/Parquet file or a hub "
                      "dataset) has chat rows: a `messages` list of `{role, content}`.", ""],
    }


def render_axolotl(files: dict[str, str], model: ModelSpec, job: Job, layout: Layout, *, kind: str, hsdp: bool,
                   title: str, model_ref: str, dataset: str | None, notes: list[str]) -> dict[str, Any]:
    """Add ``axolotl.yaml`` (and ``ds_config.json``) to ``files``; return the launch description."""
    from .deepspeed import render_deepspeed_config

    cfg = axolotl_config(model, job, layout, kind=kind, hsdp=hsdp, model_ref=model_ref, dataset=dataset)
    header = (f"axolotl config for {title}\ngenerated by ftplan export; run: axolotl train axolotl.yaml "
              f"(schema: axolotl 0.19)")
    files["axolotl.yaml"] = dump_yaml(cfg, header=header)
    if kind in ("deepspeed", "autotp"):
        files["ds_config.json"] = render_deepspeed_config(layout, job)
    if job.uses_lora and job.lora.dropout and model.is_moe:
        notes.append("axolotl: LoRA dropout on an MoE model's fused experts is refused by PEFT; use `lora_dropout=0`")
    notes.append("axolotl: the learning rate is not planned by ftplan (a usual starting point is written); "
                 "axolotl tokenizes the dataset first (dataset_prepared_path)")
    return _launch(layout, job, kind)
