"""``ds_config.json`` for a ZeRO plan (DeepSpeed through accelerate and the HF Trainer).

What the plan decides is written as numbers: the ZeRO ``stage``, CPU offload of the optimizer
states (``offload_optimizer``) and of the parameters (``offload_param``), bf16/fp16. What the HF
integration fills from the training script's ``TrainingArguments`` is ``"auto"``: micro-batch,
gradient accumulation, the global batch, gradient clipping, and the bucket sizes derived from the
model's hidden size. So the script stays the one place that says ``per_device_train_batch_size`` and
``gradient_accumulation_steps`` (transformers checks the two agree at start-up and fills the rest).
``bf16.enabled`` / ``fp16.enabled`` are explicit and equal to the script's ``bf16=`` / ``fp16=``
(autocast only for the ``-mixed`` precisions); transformers refuses a mismatch.

With optimizer offload DeepSpeed must run its own CPU AdamW (``DeepSpeedCPUAdam``; a client
optimizer is refused by default), so an ``optimizer`` block of type ``AdamW`` is written with
``"auto"`` hyper-parameters (filled from the script's learning rate, betas, eps, weight decay);
the script's ``optim=`` is then not used. Only AdamW is supported for offloaded plans.

Tensor-parallel plans exported to DeepSpeed run **AutoTP** (DeepSpeed >= 0.16.4 training mode):
``tensor_parallel.autotp_size`` = the plan's ``tp``, with the plan's ZeRO stage over the data-parallel
ranks (stage 0 when ``dp = 1``); the HF integration calls ``deepspeed.tp_model_init`` and AutoTP
shards the model with its HF ``tp_plan`` (the same split as transformers' own TP). With TP the
16-bit weights are gathered when the model is saved (``gather_16bit_weights_on_model_save``).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConfigError
from ..job import Job, Layout

__all__ = ["deepspeed_config", "render_deepspeed_config", "ZERO_STAGE"]

ZERO_STAGE = {"zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}


def _half(job: Job) -> tuple[bool, bool]:
    """(bf16, fp16): the autocast flags the training script passes to SFTConfig."""
    return job.precision == "bf16-mixed", job.precision == "fp16-mixed"


def deepspeed_config(layout: Layout, job: Job) -> dict[str, Any]:
    stage = ZERO_STAGE.get(layout.strategy)
    if stage is None and layout.tp > 1 and layout.strategy == "single":
        stage = 0  # AutoTP alone: no data-parallel sharding
    if stage is None:
        raise ConfigError(f"strategy {layout.strategy!r} has no DeepSpeed ZeRO stage", "use zero1, zero2 or zero3")
    if layout.offload_params and stage != 3:
        raise ConfigError("parameter offload needs ZeRO stage 3", "pick a zero3 plan")
    if layout.offload_optimizer and job.optimizer != "adamw":
        raise ConfigError(
            f"DeepSpeed's optimizer offload runs AdamW on the CPU (DeepSpeedCPUAdam), not {job.optimizer}",
            "plan with `optimizer=adamw`, or pick a plan without offload (`plan=N`)")
    bf16, fp16 = _half(job)
    zero: dict[str, Any] = {"stage": stage}
    if layout.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if layout.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    zero["overlap_comm"] = True
    zero["contiguous_gradients"] = True
    # an explicit Layout.ds_reduce_bucket_size is written as is (the plan's memory assumed it)
    zero["reduce_bucket_size"] = layout.ds_reduce_bucket_size or "auto"
    if layout.tp > 1 and stage != 3:
        zero["gather_16bit_weights_on_model_save"] = True  # AutoTP: save whole 16-bit weights
    if stage == 3:
        zero.update({
            # explicit Layout values are written as they are (the plan's memory assumed them)
            "stage3_prefetch_bucket_size": layout.ds_prefetch_bucket_size or "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": layout.ds_max_live_parameters or 1_000_000_000,
            "stage3_max_reuse_distance": layout.ds_max_reuse_distance or 1_000_000_000,
            "sub_group_size": 1_000_000_000,
            "stage3_gather_16bit_weights_on_model_save": True,
        })
    elif stage in (1, 2):
        zero.update({"allgather_partitions": True, "allgather_bucket_size": 500_000_000, "reduce_scatter": True})
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": bf16},
        "fp16": ({"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                  "hysteresis": 2, "min_loss_scale": 1} if fp16 else {"enabled": False}),
        "zero_optimization": zero,
    }
    if layout.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.offload_optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                        "weight_decay": "auto"}}
    cfg["steps_per_print"] = 100
    cfg["wall_clock_breakdown"] = False
    return cfg


def render_deepspeed_config(layout: Layout, job: Job) -> str:
    return json.dumps(deepspeed_config(layout, job), indent=2) + "\n"
