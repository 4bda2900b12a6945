"""Which engine runs a layout, per export target: the rule the planner and the exporters share.

``exportable(layout, job, target, model=None) -> (ok, reason)`` says whether the files of ``target``
run ``layout`` for ``job`` (and why not); ``engine(...)`` says *how* (the launch kind). The planner
ranks by default only layouts that the default target runs (``planner.recommend(target=...)``), so its
best answer can always be exported; ``target=None`` ranks everything, the reason stays attached.

Targets and what they run (reference stack: accelerate 1.15, transformers 5.23, DeepSpeed 0.19.8,
axolotl 0.19, LLaMA-Factory 0.9.5):

* ``accelerate`` (default): ``accelerate launch`` + the TRL script.
  ``single`` one process; ``ddp`` ``MULTI_GPU``; ``zero1``/``zero2`` DeepSpeed ZeRO-1/2;
  ``zero3``/``fsdp`` **FSDP2** (``fully_shard``), HSDP across nodes where a node's GPUs can hold the
  shards; ``zero3`` with CPU offload runs DeepSpeed ZeRO-3 (``DeepSpeedCPUAdam``: what the planner's
  offload runtime assumes); ``fsdp`` with parameter offload runs FSDP2 ``CPUOffloadPolicy``.
  Tensor parallelism runs transformers' own TP plan (``from_pretrained(distributed_config=
  DistributedConfig(tp_size=N))``, every bundled family has a ``base_model_tp_plan``) through
  accelerate's ``ParallelismConfig``: pure TP (``dp = 1``) as ``MULTI_GPU`` + ``tp_size``, TP with data
  parallelism as FSDP2 over ``dp_shard`` x TP (accelerate refuses DDP + TP).
* ``deepspeed``: everything sharded runs DeepSpeed (ZeRO-3 for ``zero3``/``fsdp``); tensor
  parallelism runs DeepSpeed AutoTP (``tensor_parallel.autotp_size``) with the plan's ZeRO stage
  (0 for ``dp = 1``), for dense models only (transformers refuses DeepSpeed TP for checkpoints whose
  weights it converts on load, i.e. fused MoE experts).
* ``axolotl``: its YAML; FSDP2 (``fsdp_version: 2``) for ``zero3``/``fsdp``, a DeepSpeed JSON for
  ZeRO-1/2 and offload, ``tensor_parallel_size`` only with DeepSpeed AutoTP (axolotl 0.19's schema:
  "Only supported with DeepSpeed AutoTP").
* ``llamafactory``: its train YAML; DeepSpeed JSON (``deepspeed:``) for ZeRO, an accelerate FSDP2
  file for ``zero3``/``fsdp``; no tensor parallelism (only its Megatron backend has it).

Nobody runs pipeline parallelism for Hugging Face models in training: transformers 5.23's
``pp_size`` is a forward-only naive stage split (``distributed/pipeline_parallel.py``: "TODO ...
dispatch to different pipeline parallelism schedules (gpipe, 1f1b, etc.)"), and accelerate, TRL,
axolotl and LLaMA-Factory have no PP schedule for them. QLoRA with TP: bitsandbytes 4-bit weights are
not split by either TP plan.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..job import Job, Layout

__all__ = ["TARGETS", "DEFAULT_TARGET", "KINDS", "engine", "exportable", "check_target", "tp_mesh"]

TARGETS = ("accelerate", "deepspeed", "axolotl", "llamafactory")
DEFAULT_TARGET = "accelerate"
#: launch kinds: one process, DDP, DeepSpeed ZeRO, FSDP2, accelerate ND-parallel TP, DeepSpeed AutoTP
KINDS = ("single", "ddp", "deepspeed", "fsdp", "tp", "autotp")

_PP = ("pipeline parallelism: no training engine runs it for Hugging Face models (transformers 5 has a "
       "forward-only stage split; accelerate, TRL, axolotl and LLaMA-Factory have no pipeline schedule)")
_FSDP_OPT_ONLY = ("FSDP cannot offload only the optimizer states (its CPU offload moves parameters, "
                  "gradients and the optimizer step together)")


def check_target(target: str) -> str:
    if target not in TARGETS:
        from ..errors import did_you_mean

        raise ConfigError(f"unknown export target {target!r}",
                          did_you_mean(target, TARGETS) or f"use one of {', '.join(TARGETS)}")
    return target


def _is_moe(model) -> bool:
    return bool(model is not None and getattr(model, "is_moe", False))


def _engine(layout: Layout, job: Job, target: str, model) -> tuple[str | None, str]:
    """(kind or None, reason when None)."""
    s = layout.strategy
    if job.torchao_nf4:
        return None, ("torchao-nf4 is torchtune's QLoRA (its own recipes and model code): no export target "
                      "writes a torchtune config; `quant_type=nf4` is bitsandbytes' QLoRA, which they export")
    if getattr(layout, "ep", 1) > 1:
        # transformers runs expert parallelism at load time (from_pretrained(distributed_config=
        # DistributedConfig(ep_size=...)), FSDP2 over the rest): none of the exported launches sets it up,
        # so their files would run the plan without EP, holding other bytes than its answer
        return None, ("expert parallelism (`ep` > 1): the exported launches do not set up transformers' "
                      "load-time expert sharding, so they would run another layout than the plan; plan the export "
                      "with `ep=1`")
    if layout.pp > 1:
        return None, _PP
    if layout.tp > 1:
        if job.method == "qlora":
            return None, ("tensor parallelism with QLoRA: bitsandbytes 4-bit weights are not split by "
                          "transformers' TP plan nor by DeepSpeed AutoTP")
        if layout.offload_optimizer or layout.offload_params:
            return None, "tensor parallelism with CPU offload: no engine runs both"
        if target == "llamafactory":
            return None, "tensor parallelism: LLaMA-Factory runs it only on its Megatron backend, not on HF models"
        if target in ("deepspeed", "axolotl"):
            if _is_moe(model):
                return None, (f"DeepSpeed AutoTP on an MoE model ({model.name}): transformers refuses DeepSpeed "
                              "tensor parallelism for checkpoints whose weights it converts on load (fused experts)")
            if target == "axolotl" and "8bit" in job.optimizer:
                return None, f"axolotl refuses tensor_parallel_size with {job.optimizer}"
            return "autotp", ""
        return "tp", ""
    if layout.world_size == 1:
        return "single", ""
    if s == "ddp":
        return "ddp", ""
    if s in ("zero1", "zero2"):
        if layout.offload_optimizer and job.optimizer != "adamw":
            return None, (f"optimizer offload runs AdamW on the CPU (DeepSpeedCPUAdam), not {job.optimizer}")
        return "deepspeed", ""
    if s in ("zero3", "fsdp"):
        offload = layout.offload_optimizer or layout.offload_params
        if target == "deepspeed" or (s == "zero3" and offload):
            if layout.offload_optimizer and job.optimizer != "adamw":
                return None, f"optimizer offload runs AdamW on the CPU (DeepSpeedCPUAdam), not {job.optimizer}"
            return "deepspeed", ""
        # fsdp (and zero3 without offload): FSDP2
        if s == "fsdp" and layout.fsdp_wrap != "accelerate":
            return None, (f"{layout.fsdp_wrap}'s own FSDP2 wrapping (`fsdp_wrap`): the exported files wrap as "
                          "accelerate does; plan the export with `fsdp_wrap=accelerate`")
        if layout.offload_optimizer and not layout.offload_params:
            return None, _FSDP_OPT_ONLY
        if target == "axolotl" and job.optimizer in ("adamw_8bit", "paged_adamw_8bit") and s == "fsdp":
            return None, f"axolotl refuses FSDP2 with bitsandbytes' {job.optimizer}"
        if target == "axolotl" and job.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
            return "deepspeed", ""  # axolotl: FSDP2 + bnb 8-bit optimizers is refused; ZeRO-3 runs it
        return "fsdp", ""
    return None, f"unknown strategy {s!r}"


def engine(layout: Layout, job: Job, target: str = DEFAULT_TARGET, *, model=None) -> str:
    """The launch kind (one of :data:`KINDS`) of ``layout`` under ``target``; ``ConfigError`` if none."""
    check_target(target)
    kind, why = _engine(layout, job, target, model)
    if kind is None:
        raise ConfigError(f"the {target} export cannot run {layout.describe()}: {why}",
                          "pick another plan (`plan=N`) or another `target`")
    return kind


def exportable(layout: Layout, job: Job, target: str = DEFAULT_TARGET, model=None) -> tuple[bool, str]:
    """(True, "") when ``target``'s files run ``layout`` for ``job``; else (False, the reason)."""
    check_target(target)
    kind, why = _engine(layout, job, target, model)
    return (kind is not None), why


def tp_mesh(layout: Layout) -> dict[str, int]:
    """accelerate ``ParallelismConfig`` sizes for a TP layout (TP inside a node).

    ``dp = 1``: pure TP (``MULTI_GPU``). Otherwise FSDP2 shards over all ``dp`` ranks (``dp_shard``),
    across nodes too: every model state is then divided by at least what the plan's ZeRO-1 + TP
    divides it by, so the plan's memory holds. (HSDP inside TP would shard over a node's
    ``gpus_per_node / tp`` ranks only, which can hold more than the plan predicts.)
    """
    tp, dp = layout.tp, layout.dp
    return {"dp_replicate_size": 1, "dp_shard_size": dp, "tp_size": tp, "cp_size": 1}
