"""Host RAM and disk a plan needs, per node, and the check against an offer's instance.

``checkpoint_size(model, job, layout) -> CheckpointSize``: what a training checkpoint holds (HF
Trainer: the trainable weights in their dtype, the optimizer states, RNG/scheduler scalars):
the whole model for full fine-tuning, the adapters only for LoRA/QLoRA; with or without the
optimizer states; sharded (FSDP ``SHARDED_STATE_DICT``, DeepSpeed ZeRO: every rank writes its
own shard) or full (one writer).

``host_requirements(model, job, layout, memory) -> HostRequirements``: host RAM per node at its
peak, the larger of
  * loading: every process materialises the whole model on the CPU before moving it to its GPU
    (``from_pretrained`` without a device map), except with FSDP/ZeRO-3 CPU-RAM-efficient
    loading (accelerate ``fsdp_cpu_ram_efficient_loading``, what ftplan exports: the first rank
    of each node loads, the others build on ``meta``), and QLoRA, which quantizes onto the GPU
    one checkpoint shard at a time;
  * training: the offloaded optimizer states / parameters (``MemoryBreakdown.host_bytes`` per
    GPU, the memory model's own figure) plus the dataloader, and, while a checkpoint is saved,
    the state staged in CPU memory (a full state dict is gathered on the node of rank 0; a
    sharded one stages each rank's shard);
plus a per-process baseline (Python, torch, CUDA libraries). Disk per node: the model download
(the hub checkpoint in bf16), the dataset, ``checkpoints_kept`` training checkpoints and the
final model. Constants: ``catalog/data/host.json`` (sources and status there).

``check_offer(req, offer)`` returns why an offer's instance lacks the host RAM, or ``None``;
``disk_note(req, offer)`` warns when its local disk is too small (a volume can be attached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .catalog.hostdata import HostConstants, host_constants
from .job import PRECISIONS, Job, Layout
from .memory import MemoryBreakdown, model_states
from .model import ModelSpec
from .units import GB, GIB, dtype_bytes

__all__ = ["CheckpointSize", "HostRequirements", "checkpoint_size", "host_requirements", "check_offer", "disk_note"]


@dataclass(frozen=True)
class CheckpointSize:
    kind: str  # "full" (whole model) or "adapter" (LoRA / QLoRA adapters only)
    weights_bytes: int
    optimizer_bytes: int  # 0 when the optimizer states are left out
    sharded: bool  # every rank writes its own shard
    writers: int  # processes writing in parallel

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.optimizer_bytes

    @property
    def per_writer_bytes(self) -> int:
        return -(-self.total_bytes // self.writers)


def checkpoint_size(model: ModelSpec, job: Job, layout: Layout | None = None, *,
                    include_optimizer: bool = True, sharded: bool | None = None,
                    states: Any | None = None) -> CheckpointSize:
    """A training checkpoint (``include_optimizer``) or the saved model/adapter (without).

    ``sharded`` defaults to the layout: ZeRO-1/2/3 and FSDP write one shard per rank (what
    ftplan's exports configure: ``SHARDED_STATE_DICT``, DeepSpeed's per-rank optimizer files).
    ``states``: ``model_states(model, job)`` when the caller has it."""
    layout = layout or Layout()
    st = states if states is not None else model_states(model, job)
    weights = st.trainable_weights + (st.frozen_weights if job.method == "full" else 0)
    opt = st.optimizer_states if include_optimizer else 0
    if sharded is None:
        sharded = layout.shards_optimizer
    writers = layout.world_size if sharded else 1
    return CheckpointSize("adapter" if job.uses_lora else "full", int(weights), int(opt), sharded, writers)


@dataclass(frozen=True)
class HostRequirements:
    ram_bytes: int  # host RAM per node at its peak
    ram_phase: str  # "loading" or "training"
    ram_breakdown: dict[str, int]
    disk_bytes: int  # local disk per node
    disk_breakdown: dict[str, int]
    checkpoint: CheckpointSize
    efficient_loading: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def ram_gib(self) -> float:
        return self.ram_bytes / GIB

    @property
    def disk_gb(self) -> float:
        return self.disk_bytes / GB


def _load_bytes(model: ModelSpec, job: Job) -> int:
    """Bytes of the model as ``from_pretrained`` materialises it (the exported script's dtype)."""
    prec = PRECISIONS[job.precision]
    dt = prec["trainable"] if job.method == "full" else job.frozen_dtype
    return int(model.params.total * dtype_bytes(dt))


def host_requirements(
    model: ModelSpec,
    job: Job,
    layout: Layout,
    memory: MemoryBreakdown,
    *,
    efficient_loading: bool | None = None,
    checkpoints_kept: int = 2,
    dataset_bytes: int = 0,
    consts: HostConstants | None = None,
) -> HostRequirements:
    """Host RAM and local disk per node for ``job`` on ``layout`` (``memory`` from
    ``estimate_memory`` for the same job and layout: its ``host_bytes`` is the offload per GPU).

    ``efficient_loading`` defaults to True for FSDP / ZeRO-3 (the exports turn it on) and is
    ignored elsewhere; ``checkpoints_kept`` is HF ``save_total_limit`` (None there keeps every
    checkpoint; ftplan assumes 2 unless told)."""
    c = consts or host_constants()
    gpn = layout.gpus_per_node
    notes: list[str] = []
    can_efficient = layout.shards_params
    eff = can_efficient if efficient_loading is None else (efficient_loading and can_efficient)
    if efficient_loading and not can_efficient:
        notes.append("CPU-RAM-efficient loading needs FSDP or ZeRO-3: every process loads the model")
    model_b = _load_bytes(model, job)
    if job.method == "qlora":
        load = gpn * min(model_b, c.load_shard_bytes)
        notes.append("qlora: weights are quantized onto the GPU one checkpoint shard at a time")
    elif eff:
        load = model_b  # first rank of the node; the others build on meta
    else:
        load = gpn * model_b
    baseline = gpn * c.process_baseline_bytes
    offload = gpn * memory.host_bytes
    dataloader = gpn * c.dataloader_bytes_per_process
    st = model_states(model, job)
    ck = checkpoint_size(model, job, layout, states=st)
    if ck.sharded:
        # each rank stages its own shard (this node's share)
        save = math.ceil(ck.total_bytes * gpn / layout.world_size)
    else:
        # a full state dict is gathered on rank 0 (its node) before writing
        save = ck.total_bytes
    training = offload + dataloader + save
    ram_phase = "loading" if load >= training else "training"
    ram = baseline + max(load, training)
    # disk
    download = int(model.params.total * 2)  # the hub checkpoint in bf16
    per_node_ck = math.ceil(ck.total_bytes / layout.nodes) if ck.sharded else ck.total_bytes
    final = checkpoint_size(model, job, layout, include_optimizer=False, sharded=False, states=st).total_bytes
    disk = {
        "model_download": download,
        "dataset": int(dataset_bytes),
        "checkpoints": max(0, checkpoints_kept) * per_node_ck,
        "final_model": final,
    }
    if checkpoints_kept > 0:
        notes.append(f"{checkpoints_kept} training checkpoints kept on local disk (HF save_total_limit; its "
                     "default None keeps every one)")
    return HostRequirements(
        ram_bytes=int(ram), ram_phase=ram_phase,
        ram_breakdown={"process_baseline": int(baseline), "model_loading": int(load), "offload": int(offload),
                       "dataloader": int(dataloader), "checkpoint_staging": int(save)},
        disk_bytes=sum(disk.values()), disk_breakdown=disk, checkpoint=ck, efficient_loading=bool(eff),
        notes=tuple(notes),
    )


def check_offer(req: HostRequirements, offer: Any) -> str | None:
    """Why ``offer``'s instance cannot hold the plan in host RAM, or None when it can or the
    catalog does not know the instance's RAM. (Disk is a warning, see :func:`disk_note`: a
    volume can be attached; RAM cannot be added.)"""
    ram = getattr(offer, "host_ram_gib", None)
    if ram is not None and req.ram_bytes > ram * GIB:
        return (f"needs {req.ram_gib:,.0f} GiB host RAM per node ({req.ram_phase}: "
                + ", ".join(f"{k.replace('_', ' ')} {v / GIB:,.0f}" for k, v in req.ram_breakdown.items() if v)
                + f" GiB), the {offer.sku} instance has {ram:,.0f} GiB")
    return None


def disk_note(req: HostRequirements, offer: Any) -> str | None:
    """A warning when the plan's disk exceeds the instance's local disk (when known)."""
    disk = getattr(offer, "local_disk_gb", None)
    if disk is not None and req.disk_bytes > disk * GB:
        return (f"needs {req.disk_gb:,.0f} GB disk per node, the {offer.sku} instance has {disk:,.0f} GB local: "
                "attach a larger volume")
    return None
