"""The fine-tuning job and the parallel layout: typed, validated, immutable.

``Job`` says *what* is trained (method, precision, optimizer, batch shape); ``Layout`` says *where*
(GPUs, nodes, sharding strategy, offload, tensor/pipeline parallelism). Both are plain frozen
dataclasses; ``validate_job`` checks them against a ``ModelSpec`` and collects every problem into
one ``ConfigError`` (torchtune-style: report all errors together).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from .errors import ConfigError, did_you_mean
from .model import ModelSpec

__all__ = [
    "METHODS",
    "PRECISIONS",
    "OPTIMIZERS",
    "STRATEGIES",
    "ENGINES",
    "ATTN_IMPLS",
    "LoraSpec",
    "QuantSpec",
    "Job",
    "Layout",
    "validate_job",
    "lora_targets",
    "lora_wraps_experts",
]

Method = Literal["full", "lora", "qlora", "fp8", "nvfp4"]
METHODS = ("full", "lora", "qlora")
FUTURE_METHODS = ("fp8", "nvfp4")  # designed for, not yet modelled

#: precision -> (working weight dtype, master/trainable dtype, gradient dtype, compute dtype)
#: "bf16-mixed" is what HF Trainer does with ``bf16=True``: trainable weights stay fp32 and are the
#: master copy, autocast makes bf16 copies for the matmuls, gradients are fp32.
PRECISIONS = {
    "bf16-mixed": {"compute": "bf16", "trainable": "fp32", "grad": "fp32", "frozen": "bf16"},
    "fp16-mixed": {"compute": "fp16", "trainable": "fp32", "grad": "fp32", "frozen": "fp16"},
    "bf16": {"compute": "bf16", "trainable": "bf16", "grad": "bf16", "frozen": "bf16"},
    "fp16": {"compute": "fp16", "trainable": "fp16", "grad": "fp16", "frozen": "fp16"},
    "fp32": {"compute": "fp32", "trainable": "fp32", "grad": "fp32", "frozen": "fp32"},
}

OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp")
ATTN_IMPLS = ("sdpa", "flash", "eager")
QUANT_TYPES = ("nf4", "fp4")


@dataclass(frozen=True)
class LoraSpec:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    #: PEFT ``target_modules``: leaf module names, or ("all-linear",)
    target_modules: tuple[str, ...] = ("all-linear",)


@dataclass(frozen=True)
class QuantSpec:
    """bitsandbytes 4-bit quantization of the frozen base (QLoRA)."""

    quant_type: str = "nf4"
    double_quant: bool = True
    compute_dtype: str = "bf16"
    blocksize: int = 64  # bitsandbytes' default 4-bit block size
    #: modules bitsandbytes leaves unquantized (transformers skips the output embedding)
    skip_modules: tuple[str, ...] = ("lm_head",)


@dataclass(frozen=True)
class Job:
    method: str = "full"
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    gradient_checkpointing: bool = False
    attn_impl: str = "sdpa"
    lora: LoraSpec = field(default_factory=LoraSpec)
    quant: QuantSpec = field(default_factory=QuantSpec)
    #: training data, for runtime and cost (tokens per epoch x epochs)
    dataset_tokens: int | None = None
    epochs: float = 1.0

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def uses_lora(self) -> bool:
        return self.method in ("lora", "qlora")

    def with_(self, **changes) -> "Job":
        return replace(self, **changes)


#: sharding engine per strategy: DDP (torch), ZeRO-1/2/3 (DeepSpeed), fsdp (PyTorch FSDP, version
#: ``Layout.fsdp_version``: 2 = ``fully_shard``, what ``accelerate config`` writes by default)
ENGINES = {"single": "torch", "ddp": "ddp", "zero1": "deepspeed", "zero2": "deepspeed", "zero3": "deepspeed",
           "fsdp": "fsdp"}
FSDP_VERSIONS = (1, 2)


@dataclass(frozen=True)
class Layout:
    gpus_per_node: int = 1
    nodes: int = 1
    strategy: str = "single"
    #: ZeRO: DeepSpeed ``offload_optimizer`` (optimizer states, fp32 master and gradient partitions on
    #: the host, AdamW runs on the CPU); fsdp: only together with ``offload_params``
    offload_optimizer: bool = False
    #: ZeRO-3: DeepSpeed ``offload_param``; fsdp: ``CPUOffloadPolicy`` / ``CPUOffload(offload_params=True)``,
    #: which keeps parameters, gradients and the optimizer step on the host
    offload_params: bool = False
    tp: int = 1
    pp: int = 1
    #: strategy fsdp: 2 = FSDP2 (``fully_shard``), 1 = FSDP1 (``FullyShardedDataParallel``)
    fsdp_version: int = 2
    #: strategy fsdp: free the gathered layer after its forward (FSDP2 ``reshard_after_forward=True``,
    #: FSDP1 FULL_SHARD) or keep it until its backward (``False``, FSDP1 SHARD_GRAD_OP)
    reshard_after_forward: bool = True
    #: strategy fsdp over several nodes: shard within a node, replicate across nodes (HSDP,
    #: FSDP1 HYBRID_SHARD); the shard group is the node's data-parallel GPUs
    hsdp: bool = False
    #: strategy ddp: ``gradient_as_bucket_view`` (gradients live in DDP's buckets instead of
    #: next to them); HF Trainer / accelerate default False
    ddp_bucket_view: bool = False

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel degree (the group that ZeRO/FSDP shards over)."""
        return max(1, self.world_size // (self.tp * self.pp))

    @property
    def engine(self) -> str:
        """``torch`` (one GPU), ``ddp``, ``deepspeed``, ``fsdp1`` or ``fsdp2``."""
        e = ENGINES.get(self.strategy, self.strategy)
        return f"fsdp{self.fsdp_version}" if e == "fsdp" else e

    @property
    def shard_degree(self) -> int:
        """GPUs one copy of the sharded states is spread over: the data-parallel group, or the
        node's data-parallel GPUs under HSDP."""
        if self.hsdp and self.strategy == "fsdp":
            return max(1, self.gpus_per_node // (self.tp * self.pp))
        return self.dp

    @property
    def shards_params(self) -> bool:
        return self.strategy in ("zero3", "fsdp")

    @property
    def shards_grads(self) -> bool:
        return self.strategy in ("zero2", "zero3", "fsdp")

    @property
    def shards_optimizer(self) -> bool:
        return self.strategy in ("zero1", "zero2", "zero3", "fsdp")

    def describe(self) -> str:
        parts = [f"{self.world_size} GPU" + ("s" if self.world_size > 1 else "")]
        if self.nodes > 1:
            parts.append(f"{self.nodes} nodes x {self.gpus_per_node}")
        parts.append(self.strategy)
        if self.tp > 1:
            parts.append(f"tp={self.tp}")
        if self.pp > 1:
            parts.append(f"pp={self.pp}")
        if self.offload_optimizer:
            parts.append("offload-optimizer")
        if self.offload_params:
            parts.append("offload-params")
        if self.strategy == "fsdp":
            if self.fsdp_version != 2:
                parts.append(f"fsdp{self.fsdp_version}")
            if not self.reshard_after_forward:
                parts.append("no-reshard")
            if self.hsdp:
                parts.append("hsdp")
        if self.strategy == "ddp" and self.ddp_bucket_view:
            parts.append("bucket-view")
        return ", ".join(parts)


def lora_targets(model: ModelSpec, lora: LoraSpec) -> frozenset[str]:
    """The leaf module names PEFT wraps, as PEFT resolves ``target_modules`` for this model.

    ``all-linear`` means every ``nn.Linear`` except the output layer (PEFT excludes the
    ``lm_head``); routed experts stored as 3-D parameters (transformers 5) are not ``nn.Linear``.
    On MoE models PEFT (>= 0.18) rewrites ``all-linear``: the MLP projection names leave
    ``target_modules`` (so dense MLP layers and shared experts stay frozen) and the fused experts
    and the router become ``target_parameters`` (see :func:`lora_wraps_experts`).
    """
    names = model.module_names()
    if "all-linear" in lora.target_modules:
        if model.is_moe:
            mlp = {lin.module for lin in model.linears() if lin.category == "mlp"}
            return frozenset(n for n in names if n != "lm_head" and n not in mlp)
        return frozenset(n for n in names if n != "lm_head")
    return frozenset(lora.target_modules) & names


def lora_wraps_experts(model: ModelSpec, lora: LoraSpec) -> bool:
    """True when PEFT wraps the fused expert weights (``gate_up_proj`` at rank 2r, ``down_proj``
    at rank r) and the router weight (rank r) with ``ParamWrapper``: ``all-linear`` on a
    transformers-5 MoE model. ParamWrapper refuses ``lora_dropout`` > 0 and adds the merged
    ``W + BA`` of every expert to each forward."""
    return model.is_moe and "all-linear" in lora.target_modules


def _check(cond: bool, problems: list[str], msg: str) -> None:
    if not cond:
        problems.append(msg)


def validate_job(model: ModelSpec, job: Job, layout: Layout | None = None) -> None:
    """Raise one ``ConfigError`` listing every problem with ``job``/``layout`` for ``model``."""
    layout = layout or Layout()
    p: list[str] = []
    if job.method in FUTURE_METHODS:
        raise ConfigError(
            f"method {job.method!r} is not modelled yet",
            "use --method full, lora or qlora (fp8/nvfp4 training are planned)",
        )
    if job.method not in METHODS:
        hint = did_you_mean(job.method, METHODS) or f"use one of {', '.join(METHODS)}"
        raise ConfigError(f"unknown method {job.method!r}", hint)
    for value, choices, what in (
        (job.precision, PRECISIONS, "precision"),
        (job.optimizer, OPTIMIZERS, "optimizer"),
        (job.attn_impl, ATTN_IMPLS, "attention implementation"),
        (layout.strategy, STRATEGIES, "strategy"),
    ):
        if value not in choices:
            hint = did_you_mean(value, choices) or f"use one of {', '.join(choices)}"
            raise ConfigError(f"unknown {what} {value!r}", hint)
    _check(job.micro_batch >= 1, p, f"micro-batch must be >= 1 (got {job.micro_batch})")
    _check(job.seq_len >= 1, p, f"sequence length must be >= 1 (got {job.seq_len})")
    _check(job.grad_accum >= 1, p, f"gradient accumulation must be >= 1 (got {job.grad_accum})")
    _check(job.epochs > 0, p, f"epochs must be > 0 (got {job.epochs})")
    _check(job.dataset_tokens is None or job.dataset_tokens > 0, p,
           f"dataset tokens must be > 0 (got {job.dataset_tokens})")
    if job.uses_lora:
        lo = job.lora
        _check(lo.r >= 1, p, f"LoRA rank must be >= 1 (got {lo.r})")
        _check(lo.alpha > 0, p, f"LoRA alpha must be > 0 (got {lo.alpha})")
        _check(0.0 <= lo.dropout < 1.0, p, f"LoRA dropout must be in [0, 1) (got {lo.dropout})")
        _check(not (lora_wraps_experts(model, lo) and lo.dropout > 0), p,
               f"LoRA dropout {lo.dropout} with all-linear on MoE model {model.name}: PEFT wraps its fused "
               "experts with ParamWrapper, which refuses lora_dropout > 0 (use --lora-dropout 0, or "
               "target attention only, e.g. --lora-targets q_proj,k_proj,v_proj,o_proj)")
        names = model.module_names()
        unknown = [t for t in lo.target_modules if t != "all-linear" and t not in names]
        if unknown:
            p.append(
                f"LoRA target module(s) {', '.join(map(repr, unknown))} not in {model.name} "
                f"(it has {', '.join(sorted(names))}, or use all-linear)"
            )
        elif not lora_targets(model, lo):
            p.append("LoRA targets no module")
    if job.method == "qlora":
        q = job.quant
        _check(q.quant_type in QUANT_TYPES, p, f"quant type must be nf4 or fp4 (got {q.quant_type!r})")
        _check(q.compute_dtype in ("bf16", "fp16", "fp32"), p,
               f"QLoRA compute dtype must be bf16, fp16 or fp32 (got {q.compute_dtype!r})")
    if job.precision in ("bf16", "fp16") and job.method == "full" and job.optimizer == "adamw":
        pass  # legal (pure half-precision training), the memory model handles it
    # layout
    _check(layout.gpus_per_node >= 1 and layout.nodes >= 1, p, "GPUs per node and nodes must be >= 1")
    _check(layout.tp >= 1 and layout.pp >= 1, p, "tensor- and pipeline-parallel degrees must be >= 1")
    if layout.tp >= 1 and layout.pp >= 1 and layout.gpus_per_node >= 1 and layout.nodes >= 1:
        _check(layout.world_size % (layout.tp * layout.pp) == 0, p,
               f"tp x pp = {layout.tp * layout.pp} must divide the {layout.world_size} GPUs")
        a = model.attention
        if layout.tp > 1:
            _check(a.num_heads % layout.tp == 0, p,
                   f"tensor-parallel degree {layout.tp} must divide the {a.num_heads} attention heads")
            _check(a.num_kv_heads % layout.tp == 0 or layout.tp % a.num_kv_heads == 0, p,
                   f"tensor-parallel degree {layout.tp} must divide (or be a multiple of) the "
                   f"{a.num_kv_heads} key/value heads")
            _check(layout.tp <= layout.gpus_per_node, p,
                   f"tensor parallelism of {layout.tp} must stay inside a node of {layout.gpus_per_node} GPUs")
        if layout.pp > 1:
            _check(layout.pp <= model.num_layers, p,
                   f"pipeline degree {layout.pp} exceeds the {model.num_layers} layers")
        if layout.world_size == 1:
            _check(layout.strategy == "single", p,
                   f"strategy {layout.strategy!r} needs more than one GPU (use single, or --gpus N)")
        elif layout.strategy == "single" and layout.dp > 1:
            p.append(f"{layout.world_size} GPUs need a data-parallel strategy (ddp, zero1/2/3, fsdp)")
    if layout.offload_params:
        _check(layout.strategy in ("zero3", "fsdp"), p, "parameter offload needs zero3 or fsdp")
    if layout.offload_optimizer:
        _check(layout.strategy in ("zero1", "zero2", "zero3", "fsdp"), p,
               "optimizer offload needs a ZeRO stage or fsdp")
        _check(layout.strategy != "fsdp" or layout.offload_params, p,
               "FSDP cannot offload only the optimizer (its CPU offload moves parameters, gradients and the "
               "optimizer step together): add --offload-params, or use a ZeRO strategy")
    _check(layout.fsdp_version in FSDP_VERSIONS, p, f"FSDP version must be 1 or 2 (got {layout.fsdp_version!r})")
    if layout.hsdp:
        _check(layout.strategy == "fsdp", p, "HSDP (shard within a node, replicate across nodes) needs strategy fsdp")
        _check(layout.nodes > 1, p, "HSDP replicates across nodes: it needs more than one node")
    if layout.ddp_bucket_view:
        _check(layout.strategy == "ddp", p, "gradient_as_bucket_view is a DDP option (strategy ddp)")
    if not layout.reshard_after_forward:
        _check(layout.strategy == "fsdp", p,
               "reshard-after-forward off is an FSDP option (strategy fsdp; ZeRO-3 always re-gathers)")
    if job.method == "qlora" and layout.strategy in ("zero3", "fsdp"):
        pass  # supported by accelerate/FSDP-QLoRA with bnb_4bit_quant_storage; modelled as sharded
    if p:
        raise ConfigError("; ".join(p), "fix the options above")
