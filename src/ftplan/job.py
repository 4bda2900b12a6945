"""The fine-tuning job and the parallel layout: typed, validated, immutable.

``Job`` says *what* is trained (method, precision, optimizer, batch shape); ``Layout`` says *where*
(GPUs, nodes, sharding strategy, offload, tensor/pipeline parallelism). Both are plain frozen
dataclasses; ``validate_job`` checks them against a ``ModelSpec`` and collects every problem into
one ``ConfigError`` (torchtune-style: report all errors together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from .errors import ConfigError, did_you_mean
from .inputs import show_value
from .model import ModelSpec

__all__ = [
    "METHODS",
    "PRECISIONS",
    "OPTIMIZERS",
    "STRATEGIES",
    "ATTN_IMPLS",
    "LoraSpec",
    "QuantSpec",
    "Job",
    "Layout",
    "validate_job",
    "lora_targets",
    "lora_wraps_experts",
    "JOB_LIMITS",
    "check_job_fields",
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


@dataclass(frozen=True)
class Layout:
    gpus_per_node: int = 1
    nodes: int = 1
    strategy: str = "single"
    offload_optimizer: bool = False
    offload_params: bool = False
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel degree (the group that ZeRO/FSDP shards over)."""
        return max(1, self.world_size // (self.tp * self.pp))

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


#: Sanity bounds on job and layout numbers: validation limits, not physical data. Each is far above
#: any real fine-tuning job (sequences of 10M tokens, 100k GPUs, the largest pretraining corpora
#: ~4e13 tokens) and low enough that arithmetic on them stays exact and finite.
JOB_LIMITS: dict[str, float] = {
    "micro_batch": 1 << 16,
    "seq_len": 1 << 24,
    "grad_accum": 1 << 20,
    "dataset_tokens": 10**15,
    "epochs": 10_000,
    "lora_r": 1 << 16,
    "lora_alpha": 1e6,
    "gpus_per_node": 1024,
    "nodes": 1 << 17,
    "world_size": 1 << 20,
}


def _int_ok(v: object, what: str, key: str, p: list[str], minimum: int = 1) -> bool:
    if isinstance(v, bool) or not isinstance(v, int):
        p.append(f"{what} must be an integer (got {show_value(v)})")
        return False
    if v < minimum:
        p.append(f"{what} must be >= {minimum} (got {show_value(v)})")
        return False
    hi = JOB_LIMITS.get(key)
    if hi is not None and v > hi:
        p.append(f"{what} {show_value(v)} is implausibly large (at most {hi:,.0f})")
        return False
    return True


def _num_ok(v: object, what: str, p: list[str]) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        p.append(f"{what} must be a number (got {show_value(v)})")
        return False
    if isinstance(v, float) and not math.isfinite(v):
        p.append(f"{what} must be a finite number (got {v!r})")
        return False
    return True


def _types(job: Job, layout: Layout) -> list[str]:
    """Type problems of the fields (a job built from JSON or a web form can hold anything)."""
    p: list[str] = []
    for name in ("method", "precision", "optimizer", "attn_impl"):
        if not isinstance(getattr(job, name), str):
            p.append(f"{name} must be a name (got {show_value(getattr(job, name))})")
    if not isinstance(layout.strategy, str):
        p.append(f"strategy must be a name (got {show_value(layout.strategy)})")
    for obj, name in ((job, "gradient_checkpointing"), (layout, "offload_optimizer"), (layout, "offload_params"),
                      (job.quant, "double_quant")):
        if not isinstance(getattr(obj, name), bool):
            p.append(f"{name} must be true or false (got {show_value(getattr(obj, name))})")
    if not isinstance(job.lora, LoraSpec) or not isinstance(job.quant, QuantSpec):
        p.append("lora and quant must be LoraSpec and QuantSpec")
        return p
    tm = job.lora.target_modules
    if not isinstance(tm, tuple) or not tm or not all(isinstance(t, str) and t and t.isprintable()
                                                       and len(t) <= 256 for t in tm) or len(tm) > 256:
        p.append("LoRA target modules must be a non-empty list of module names")
    for q in ("quant_type", "compute_dtype"):
        if not isinstance(getattr(job.quant, q), str):
            p.append(f"{q} must be a name (got {show_value(getattr(job.quant, q))})")
    return p


def check_job_fields(job: Job, layout: Layout | None = None) -> None:
    """The model-independent part of :func:`validate_job`: types, names, finiteness and sanity
    bounds (:data:`JOB_LIMITS`). For jobs read from files before the model is known."""
    layout = layout or Layout()
    p = _fields(job, layout)
    if p:
        raise ConfigError("; ".join(p), "fix the options above")


def validate_job(model: ModelSpec, job: Job, layout: Layout | None = None) -> None:
    """Raise one ``ConfigError`` listing every problem with ``job``/``layout`` for ``model``.

    Types, finiteness and sanity bounds (:data:`JOB_LIMITS`) are checked first, so that a NaN, an
    infinity or a 400-digit number never reaches the memory, runtime or cost arithmetic.
    """
    layout = layout or Layout()
    p = _fields(job, layout)
    if p:
        raise ConfigError("; ".join(p), "fix the options above")
    _validate_for_model(model, job, layout, p)


def _fields(job: Job, layout: Layout) -> list[str]:
    """Type, name and bound problems (raises at once for an unknown method/precision/...)."""
    p = _types(job, layout)
    if p:
        raise ConfigError("; ".join(p), "fix the options above")
    if job.method in FUTURE_METHODS:
        raise ConfigError(
            f"method {job.method!r} is not modelled yet",
            "use --method full, lora or qlora (fp8/nvfp4 training are planned)",
        )
    if job.method not in METHODS:
        hint = did_you_mean(job.method[:100], METHODS) or f"use one of {', '.join(METHODS)}"
        raise ConfigError(f"unknown method {job.method[:100]!r}", hint)
    for value, choices, what in (
        (job.precision, PRECISIONS, "precision"),
        (job.optimizer, OPTIMIZERS, "optimizer"),
        (job.attn_impl, ATTN_IMPLS, "attention implementation"),
        (layout.strategy, STRATEGIES, "strategy"),
    ):
        if value not in choices:
            hint = did_you_mean(value[:100], choices) or f"use one of {', '.join(choices)}"
            raise ConfigError(f"unknown {what} {value[:100]!r}", hint)
    _int_ok(job.micro_batch, "micro-batch", "micro_batch", p)
    _int_ok(job.seq_len, "sequence length", "seq_len", p)
    _int_ok(job.grad_accum, "gradient accumulation", "grad_accum", p)
    if _num_ok(job.epochs, "epochs", p):
        _check(job.epochs > 0, p, f"epochs must be > 0 (got {show_value(job.epochs)})")
        _check(job.epochs <= JOB_LIMITS["epochs"], p,
               f"epochs {float(job.epochs):g} is implausibly large (at most {JOB_LIMITS['epochs']:,.0f})")
    tokens = job.dataset_tokens
    if tokens is not None:
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens <= 0:
            p.append(f"dataset tokens must be > 0 (got {show_value(tokens)})")
        else:
            _int_ok(tokens, "dataset tokens", "dataset_tokens", p)
    layout_ints = [_int_ok(getattr(layout, k), what, k, p) for k, what in (
        ("gpus_per_node", "GPUs per node"), ("nodes", "nodes"), ("tp", "tensor-parallel degree"),
        ("pp", "pipeline-parallel degree"))]
    if all(layout_ints) and layout.world_size > JOB_LIMITS["world_size"]:
        p.append(f"{show_value(layout.world_size)} GPUs is implausibly many (at most {JOB_LIMITS['world_size']:,.0f})")
    if job.uses_lora:
        lo = job.lora
        if _int_ok(lo.r, "LoRA rank", "lora_r", p) and _num_ok(lo.alpha, "LoRA alpha", p) \
                and _num_ok(lo.dropout, "LoRA dropout", p):
            _check(lo.alpha > 0, p, f"LoRA alpha must be > 0 (got {show_value(lo.alpha)})")
            _check(lo.alpha <= JOB_LIMITS["lora_alpha"], p, f"LoRA alpha {show_value(lo.alpha)} is implausibly large")
            _check(0.0 <= lo.dropout < 1.0, p, f"LoRA dropout must be in [0, 1) (got {show_value(lo.dropout)})")
    return p


def _validate_for_model(model: ModelSpec, job: Job, layout: Layout, p: list[str]) -> None:
    if job.uses_lora:
        lo = job.lora
        _check(not (lora_wraps_experts(model, lo) and lo.dropout > 0), p,
               f"LoRA dropout {show_value(lo.dropout)} with all-linear on MoE model {model.name}: PEFT wraps its fused "
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
    # layout (types and bounds checked above)
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
    if job.method == "qlora" and layout.strategy in ("zero3", "fsdp"):
        pass  # supported by accelerate/FSDP-QLoRA with bnb_4bit_quant_storage; modelled as sharded
    if p:
        raise ConfigError("; ".join(p), "fix the options above")
