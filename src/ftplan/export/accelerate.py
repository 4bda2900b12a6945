"""``accelerate_config.yaml`` for a plan: the launcher side of the layout (accelerate >= 1.12).

The launch *kind* comes from :mod:`ftplan.export.targets` (``engine``):

* ``single``: ``distributed_type: NO``; ``ddp``: ``MULTI_GPU``;
* ``deepspeed`` / ``autotp``: ``DEEPSPEED``, the ZeRO stage, offload, precision and AutoTP size live
  in ``ds_config.json``, which this file points at;
* ``fsdp``: ``FSDP`` with ``fsdp_version: 2`` (``fully_shard``): ``fsdp_reshard_after_forward: true``
  (= ZeRO-3: parameters, gradients and optimizer states sharded), transformer-layer auto wrap,
  ``fsdp_cpu_ram_efficient_loading`` (rank 0 reads the checkpoint, the others start on ``meta``; off
  for QLoRA, whose 4-bit weights are quantized on rank 0 only and cannot be scattered),
  ``fsdp_offload_params`` (FSDP2 ``CPUOffloadPolicy``: parameters, gradients and the optimizer step on
  the CPU), ``SHARDED_STATE_DICT`` checkpoints. Across nodes, **HSDP** (``parallelism_config``:
  ``dp_replicate_size`` = nodes, ``dp_shard_size`` = GPUs per node) when the plan still fits with its
  states sharded over one node only (checked with ftplan's own memory model by the caller);
  otherwise FSDP over all GPUs;
* ``tp``: ``MULTI_GPU`` with ``parallelism_config`` (``tp_size``, ``dp_shard_size``): the model is
  sharded at load time by transformers (``DistributedConfig``; TP, plus FSDP2 over the data-parallel
  ranks), and the HF Trainer hands the same sizes to accelerate, which then neither wraps nor shards it
  again (transformers 5.23 ``Trainer``: "Sharded at load time ... Accelerate must not wrap or shard it
  again").

Gradient checkpointing is *not* turned on here: the training script asks the trainer for it
(``gradient_checkpointing=True``, non-reentrant), the one place that does, so FSDP's own
``fsdp_activation_checkpointing`` stays off (transformers refuses both at once).
``num_machines`` / ``num_processes`` are the layout's nodes and GPUs (all machines together).
"""

from __future__ import annotations

from typing import Any

from ..job import Job, Layout
from .targets import tp_mesh
from .yamltext import Commented, dump_yaml

__all__ = ["backend", "accelerate_config", "render_accelerate_config", "mixed_precision", "launch_command",
           "fp8_config", "FP8_CONFIG", "MAIN_PROCESS_PORT"]

MAIN_PROCESS_PORT = 29500
ZERO3_BACKENDS = ("deepspeed", "fsdp")


def backend(layout: Layout, zero3_backend: str = "deepspeed") -> str:
    """Launch kind without the target rule (``ftplan train``): ``single``, ``ddp``, ``deepspeed``, ``fsdp``."""
    s = layout.strategy
    if layout.world_size == 1 or s == "single":
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


def _parallelism(sizes: dict[str, int]) -> dict[str, Any]:
    return {f"parallelism_config_{k}": v for k, v in sizes.items()}


def accelerate_config(layout: Layout, job: Job, *, kind: str, hsdp: bool = False) -> dict[str, Any]:
    """The config as a dict (insertion order = file order)."""
    multi = layout.nodes > 1
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if kind == "single":
        cfg["distributed_type"] = "NO"
    elif kind == "ddp":
        cfg["distributed_type"] = "MULTI_GPU"
    elif kind in ("deepspeed", "autotp"):
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "deepspeed_config_file": Commented(
                "ds_config.json", "ZeRO stage, offload, precision" + (" and AutoTP size" if kind == "autotp" else "")
                + " live in this file (accelerate ignores\nzero_stage/offload/mixed_precision keys here when a "
                "config file is given)"),
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": layout.strategy in ("zero3", "fsdp") and kind == "deepspeed",
        }
    elif kind == "fsdp":
        cfg["distributed_type"] = "FSDP"
        efficient = job.method != "qlora"
        cfg["fsdp_config"] = {
            "fsdp_version": Commented(2, "FSDP2 (fully_shard): per-parameter sharding, DTensor state dicts"),
            "fsdp_reshard_after_forward": Commented(True, "= ZeRO-3: parameters, gradients and optimizer states "
                                                    "sharded; each layer gathered for its forward and backward"),
            "fsdp_auto_wrap_policy": Commented("TRANSFORMER_BASED_WRAP", "one FSDP unit per decoder layer "
                                               "(transformers' _no_split_modules)"),
            "fsdp_offload_params": Commented(bool(layout.offload_params),
                                             "CPUOffloadPolicy: parameters, gradients and the optimizer step on the CPU"),
            "fsdp_cpu_ram_efficient_loading": Commented(
                efficient, "rank 0 loads the checkpoint, the other ranks start on meta and receive their shards"
                if efficient else "off for QLoRA: 4-bit weights quantized on rank 0 cannot be scattered"),
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": Commented(
                False, "gradient checkpointing is turned on by the training script (one place only)"),
        }
        if hsdp:
            cfg["parallelism_config"] = Commented(
                _parallelism({"dp_replicate_size": layout.nodes, "dp_shard_size": layout.gpus_per_node,
                              "tp_size": 1, "cp_size": 1}),
                "HSDP: shard inside a node, replicate across nodes (only the gradient all-reduce crosses nodes)")
    elif kind == "tp":
        cfg["distributed_type"] = "MULTI_GPU"
        mesh = tp_mesh(layout)
        what = (f"tensor parallelism over {mesh['tp_size']} GPUs"
                + (f" x FSDP2 over {mesh['dp_shard_size']} data-parallel ranks" if mesh["dp_shard_size"] > 1 else ""))
        cfg["parallelism_config"] = Commented(
            _parallelism(mesh), f"{what}: train.py loads the model sharded (transformers DistributedConfig)\n"
            "and the HF Trainer gives accelerate these sizes; accelerate does not wrap the model again")
    else:
        raise ValueError(f"unknown launch kind {kind!r}")
    if kind not in ("deepspeed", "autotp"):
        # with a DeepSpeed config file, precision is set there (accelerate refuses both)
        cfg["mixed_precision"] = mixed_precision(job)
        cfg["downcast_bf16"] = "no"
        version = cfg.get("fsdp_config", {}).get("fsdp_version", 0)
        fp8 = fp8_config(job, kind, int(getattr(version, "value", version)))
        if fp8 is not None:
            cfg["fp8_config"] = fp8
            if kind == "fsdp" and fp8["backend"] == "AO":
                # accelerate 1.15 refuses torchao FP8 with FSDP2's CPU-RAM-efficient loading
                cfg["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] = Commented(
                    False, "off: accelerate refuses torchao FP8 (fp8_backend AO) with FSDP2 cpu_ram_efficient_loading")
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


def launch_command(layout: Layout, script_args: str = "", *, config: str = "accelerate_config.yaml",
                   script: str = "train.py") -> str:
    """The exact ``accelerate launch`` line (multi-node: per node, with ``$NODE_RANK`` and ``$HEAD_IP``)."""
    parts = [f"accelerate launch --config_file {config}"]
    if layout.nodes > 1:
        parts.append("--machine_rank $NODE_RANK --main_process_ip $HEAD_IP")
    parts.append(script)
    if script_args:
        parts.append(script_args)
    return " ".join(parts)


def render_accelerate_config(layout: Layout, job: Job, *, kind: str, title: str, hsdp: bool = False) -> str:
    header = (f"accelerate config for {title}\n"
              "generated by ftplan export; run: accelerate launch --config_file accelerate_config.yaml train.py ...")
    if layout.nodes > 1:
        header += ("\nmulti-node: on every node add --machine_rank RANK --main_process_ip HEAD_IP "
                   "(sky.yaml does this with SkyPilot's env vars)")
    return dump_yaml(accelerate_config(layout, job, kind=kind, hsdp=hsdp), header=header)
