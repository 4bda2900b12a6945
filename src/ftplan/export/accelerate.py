"""``accelerate_config.yaml`` for a plan: the launcher side of the layout.

``distributed_type`` follows the plan's strategy (see :func:`backend`): ``NO`` on one GPU,
``MULTI_GPU`` for DDP, ``DEEPSPEED`` for ZeRO-1/2/3 (the ZeRO settings live in ``ds_config.json``,
which this file points at), ``FSDP`` for ``fsdp`` (and for ``zero3`` when FSDP is asked for:
FULL_SHARD is ZeRO-3 in memory and traffic). ``num_machines`` / ``num_processes`` are the layout's
nodes and GPUs (all machines together). Gradient checkpointing is *not* turned on here: the training
script asks the trainer for it (``gradient_checkpointing=True``, non-reentrant), the one place that
does, so FSDP's own ``activation_checkpointing`` stays off (transformers refuses both at once).

Keys are those of accelerate's ``ClusterConfig`` / ``accelerate config`` (accelerate >= 1.0); the
FSDP block follows PEFT's FSDP (+QLoRA) recipe: transformer-layer auto wrap (the model's
``_no_split_modules``), ``use_orig_params: false``, CPU-RAM-efficient loading, sharded state dict.
"""

from __future__ import annotations

from typing import Any

from ..job import Job, Layout
from .yamltext import Commented, dump_yaml

__all__ = ["backend", "accelerate_config", "render_accelerate_config", "mixed_precision", "fp8_config",
           "FP8_CONFIG", "MAIN_PROCESS_PORT"]

MAIN_PROCESS_PORT = 29500
ZERO3_BACKENDS = ("deepspeed", "fsdp")


def backend(layout: Layout, zero3_backend: str = "deepspeed") -> str:
    """How the layout is launched: ``single``, ``ddp``, ``deepspeed`` or ``fsdp``."""
    s = layout.strategy
    if s == "single":
        return "single"
    if s == "ddp":
        return "ddp"
    if s in ("zero1", "zero2"):
        return "deepspeed"
    if s == "zero3":
        return zero3_backend
    if s == "fsdp":
        return "fsdp"
    raise ValueError(f"unknown strategy {s!r}")


def mixed_precision(job: Job) -> str:
    """accelerate's ``mixed_precision`` for the job (autocast only for the ``-mixed`` precisions;
    ``fp8`` for an FP8 recipe accelerate can select: bf16 autocast plus FP8 linears)."""
    if job.low_precision in FP8_CONFIG:
        return "fp8"
    return {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(job.precision, "no")


#: FP8 recipes an accelerate config selects (``fp8_config`` -> ``ACCELERATE_FP8_*`` env of
#: ``accelerate launch``, read by ``AORecipeKwargs`` / ``TERecipeKwargs`` in accelerate 1.15); the
#: other recipes are chosen in code (torchao ``Float8LinearConfig`` recipes, TE's current scaling
#: and NVFP4) or are not training paths accelerate knows
FP8_CONFIG: dict[str, dict[str, Any]] = {
    "fp8-tensorwise": {"backend": "AO", "pad_inner_dim": True},
    "fp8-te-delayed": {"backend": "TE", "fp8_format": "HYBRID", "amax_history_len": 1024,
                       "amax_compute_algo": "most_recent", "margin": 0, "interval": 1},
    "mxfp8-te": {"backend": "TE", "fp8_format": "HYBRID", "use_mxfp8_block_scaling": True},
}


def fp8_config(job: Job, kind: str, fsdp_version: int) -> dict[str, Any] | None:
    """The ``fp8_config`` block for an FP8 plan (None otherwise). torchao's float8 all-gather needs
    FSDP2, so it is off under FSDP1 and without FSDP."""
    base = FP8_CONFIG.get(job.low_precision or "")
    if base is None:
        return None
    out = dict(base)
    if out["backend"] == "AO":
        out["enable_fsdp_float8_all_gather"] = Commented(
            kind == "fsdp" and fsdp_version == 2,
            "FSDP2 only: gather the converted weights in FP8 (torchao WeightWithDynamicFloat8CastTensor)")
    return out


def accelerate_config(layout: Layout, job: Job, *, kind: str) -> dict[str, Any]:
    """The config as a dict (insertion order = file order)."""
    multi = layout.nodes > 1
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if kind == "single":
        cfg["distributed_type"] = "NO"
    elif kind == "ddp":
        cfg["distributed_type"] = "MULTI_GPU"
    elif kind == "deepspeed":
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "deepspeed_config_file": Commented(
                "ds_config.json", "ZeRO stage, offload and precision live in this file (accelerate ignores\n"
                "zero_stage/offload/mixed_precision keys here when a config file is given)"),
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": layout.strategy == "zero3",
        }
    elif kind == "fsdp":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 1,
            "fsdp_reshard_after_forward": Commented("FULL_SHARD", "FULL_SHARD = ZeRO-3: parameters, gradients "
                                                    "and optimizer states sharded"),
            "fsdp_auto_wrap_policy": Commented("TRANSFORMER_BASED_WRAP", "wraps the model's decoder layers "
                                               "(transformers' _no_split_modules)"),
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_forward_prefetch": False,
            "fsdp_offload_params": Commented(bool(layout.offload_params),
                                             "CPU offload of parameters, gradients and the optimizer step"),
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
            "fsdp_use_orig_params": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": Commented(
                False, "gradient checkpointing is turned on by the training script (one place only)"),
        }
    else:
        raise ValueError(f"unknown launch kind {kind!r}")
    if kind != "deepspeed":
        # with a DeepSpeed config file, precision is set there (accelerate refuses both)
        cfg["mixed_precision"] = mixed_precision(job)
        cfg["downcast_bf16"] = "no"
        fp8 = fp8_config(job, kind, int(cfg.get("fsdp_config", {}).get("fsdp_version", 0)))
        if fp8 is not None:
            cfg["fp8_config"] = fp8
    cfg["machine_rank"] = Commented(0, "multi-node: each node passes its own --machine_rank") if multi else 0
    cfg["num_machines"] = layout.nodes
    cfg["num_processes"] = Commented(layout.world_size, "all GPUs of all machines "
                                     f"({layout.gpus_per_node} x {layout.nodes})")
    if multi:
        cfg["main_process_port"] = MAIN_PROCESS_PORT
    cfg["main_training_function"] = "main"
    cfg["rdzv_backend"] = "static"
    cfg["same_network"] = True
    cfg["use_cpu"] = False
    return cfg


def render_accelerate_config(layout: Layout, job: Job, *, kind: str, title: str) -> str:
    header = (f"accelerate config for {title}\n"
              "generated by ftplan export; run: accelerate launch --config_file accelerate_config.yaml train.py ...")
    if layout.nodes > 1:
        header += ("\nmulti-node: on every node add --machine_rank RANK --main_process_ip HEAD_IP "
                   "(sky.yaml does this with SkyPilot's env vars)")
    return dump_yaml(accelerate_config(layout, job, kind=kind), header=header)
