"""The fine-tuning job and the parallel layout: typed, validated, immutable.

``Job`` says *what* is trained (method, precision, optimizer, batch shape); ``Layout`` says *where*
(GPUs, nodes, sharding strategy, offload, tensor/pipeline parallelism). Both are plain frozen
dataclasses; ``validate_job`` checks them against a ``ModelSpec`` and collects every problem into
one ``ConfigError`` (torchtune-style: report all errors together).

Their fields are ftplan's job and layout **options schema** (read them like litgpt's config): each
field declared with :func:`~ftplan.optionspec.option` is a CLI flag, a web request field, an
:mod:`ftplan.api` keyword and a key of the job/layout JSON, with its default, choices, bounds and
help; ``validate_job`` checks the declared choices and bounds. Adding an option is one field here
(plus the formula that uses it): see ``docs/extending.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from .errors import ConfigError, Problem
from .model import ModelSpec
from .optionspec import group, groups, internal, json_field, lower, option, walk

__all__ = [
    "METHODS",
    "PRECISIONS",
    "OPTIMIZERS",
    "STRATEGIES",
    "ENGINES",
    "ATTN_IMPLS",
    "QUANT_TYPES",
    "COMPUTE_DTYPES",
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
COMPUTE_DTYPES = ("bf16", "fp16", "fp32")


def _optimizer_name(text: str) -> str:
    return lower(text).replace("-", "_")


def _auto_lora_dropout(model: ModelSpec, job: "Job") -> float:
    """0 where PEFT refuses dropout (all-linear on a transformers-5 MoE model), else 0.05."""
    return 0.0 if lora_wraps_experts(model, job.lora) else 0.05


def _auto_strategy(model: ModelSpec | None, layout: "Layout") -> str:
    """single on one GPU; ddp on several (a sharded strategy already chosen is kept)."""
    if layout.world_size == 1:
        return "single"
    return "ddp" if layout.strategy == "single" else layout.strategy


@dataclass(frozen=True)
class LoraSpec:
    r: int = option(16, name="lora_r", label="LoRA rank", minimum=1, web_max=65536, help="LoRA rank r")
    alpha: int = option(32, name="lora_alpha", label="LoRA alpha", exclusive_minimum=0, web_max=1 << 20,
                        help="LoRA alpha (scaling alpha/r)")
    dropout: float = option(0.05, name="lora_dropout", label="LoRA dropout", minimum=0.0, exclusive_maximum=1.0,
                            auto=_auto_lora_dropout,
                            help="LoRA dropout (default 0.05; 0 where PEFT requires it: all-linear on MoE models)")
    #: PEFT ``target_modules``: leaf module names, or ("all-linear",)
    target_modules: tuple[str, ...] = option(
        ("all-linear",), name="lora_targets", normalize=lambda names: names or ("all-linear",),
        help="comma-separated PEFT target_modules, or all-linear (default)")


@dataclass(frozen=True)
class QuantSpec:
    """bitsandbytes 4-bit quantization of the frozen base (QLoRA)."""

    quant_type: str = option("nf4", choices=QUANT_TYPES, label="quant type", help="QLoRA 4-bit type: nf4 | fp4")
    double_quant: bool = option(True, name="no_double_quant", invert=True,
                                help="QLoRA without double quantization of the quantization constants")
    compute_dtype: str = option("bf16", choices=COMPUTE_DTYPES, label="QLoRA compute dtype",
                                help="QLoRA compute dtype: bf16 | fp16 | fp32")
    blocksize: int = internal(64)  # bitsandbytes' default 4-bit block size
    #: modules bitsandbytes leaves unquantized (transformers skips the output embedding)
    skip_modules: tuple[str, ...] = json_field(("lm_head",))


@dataclass(frozen=True)
class Job:
    method: str = option("full", choices=METHODS, help="full | lora | qlora")
    precision: str = option("bf16-mixed", choices=tuple(PRECISIONS),
                            help="bf16-mixed (fp32 master weights) | fp16-mixed | bf16 | fp16 | fp32")
    optimizer: str = option("adamw", choices=OPTIMIZERS, normalize=_optimizer_name,
                            help="adamw | adamw_8bit | paged_adamw_8bit | adafactor | sgd")
    micro_batch: int = option(1, flags=("--batch-size",), label="micro-batch", minimum=1, web_max=65536,
                              help="sequences per GPU per step")
    seq_len: int = option(2048, label="sequence length", minimum=1, web_max=1 << 21, help="tokens per sequence")
    grad_accum: int = option(1, label="gradient accumulation", minimum=1, web_max=1 << 20,
                             help="micro-batches per optimizer step")
    gradient_checkpointing: bool = option(False, flags=("--gc",),
                                          help="recompute activations in the backward pass")
    attn_impl: str = option("sdpa", name="attn", choices=ATTN_IMPLS, label="attention implementation",
                            help="sdpa | flash | eager")
    lora: LoraSpec = group(LoraSpec, when="uses_lora")
    quant: QuantSpec = group(QuantSpec, when="uses_quant")
    #: training data, for runtime and cost (tokens per epoch x epochs)
    dataset_tokens: int | None = option(None, type="tokens", name="tokens", label="dataset tokens",
                                        exclusive_minimum=0, web_max=10**15, example="50M", json="data",
                                        help="dataset tokens per epoch, e.g. 50M")
    epochs: float = option(1.0, exclusive_minimum=0.0, web_max=1000.0, json="data", help="passes over the dataset")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def uses_lora(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def uses_quant(self) -> bool:
        """The frozen base is quantized to 4 bits (QLoRA)."""
        return self.method == "qlora"

    def with_(self, **changes) -> "Job":
        return replace(self, **changes)


#: sharding engine per strategy: DDP (torch), ZeRO-1/2/3 (DeepSpeed), fsdp (PyTorch FSDP, version
#: ``Layout.fsdp_version``: 2 = ``fully_shard``, what ``accelerate config`` writes by default)
ENGINES = {"single": "torch", "ddp": "ddp", "zero1": "deepspeed", "zero2": "deepspeed", "zero3": "deepspeed",
           "fsdp": "fsdp"}
FSDP_VERSIONS = (1, 2)


@dataclass(frozen=True)
class Layout:
    gpus_per_node: int = option(1, name="gpus", label="GPUs per node", minimum=1, web_max=1024,
                                help="GPUs per node")
    nodes: int = option(1, minimum=1, web_max=1024, help="nodes")
    strategy: str = option("single", choices=STRATEGIES, auto=_auto_strategy,
                           help="single | ddp | zero1 | zero2 | zero3 | fsdp (default: single, or ddp with >1 GPU)")
    #: ZeRO: DeepSpeed ``offload_optimizer`` (optimizer states, fp32 master and gradient partitions on
    #: the host, AdamW runs on the CPU); fsdp: only together with ``offload_params``
    offload_optimizer: bool = option(False, help="optimizer states (and step) on the CPU")
    #: ZeRO-3: DeepSpeed ``offload_param``; fsdp: ``CPUOffloadPolicy`` / ``CPUOffload(offload_params=True)``,
    #: which keeps parameters, gradients and the optimizer step on the host
    offload_params: bool = option(False, help="parameters on the CPU (zero3; fsdp: with their gradients "
                                              "and the optimizer step)")
    tp: int = option(1, label="tensor-parallel degree", minimum=1, web_max=1024, help="tensor-parallel degree")
    pp: int = option(1, label="pipeline-parallel degree", minimum=1, web_max=1024, help="pipeline-parallel degree")
    #: strategy fsdp: 2 = FSDP2 (``fully_shard``), 1 = FSDP1 (``FullyShardedDataParallel``)
    fsdp_version: int = option(2, choices=FSDP_VERSIONS, label="FSDP version",
                               help="strategy fsdp: 2 = FSDP2 fully_shard (accelerate config's default) | 1 = FSDP1")
    #: strategy fsdp: free the gathered layer after its forward (FSDP2 ``reshard_after_forward=True``,
    #: FSDP1 FULL_SHARD) or keep it until its backward (``False``, FSDP1 SHARD_GRAD_OP)
    reshard_after_forward: bool = option(True, name="no_reshard", invert=True,
                                         help="strategy fsdp: keep each gathered layer from its forward to its "
                                              "backward (FSDP2 reshard_after_forward=False, FSDP1 SHARD_GRAD_OP)")
    #: strategy fsdp over several nodes: shard within a node, replicate across nodes (HSDP,
    #: FSDP1 HYBRID_SHARD); the shard group is the node's data-parallel GPUs
    hsdp: bool = option(False, help="strategy fsdp on several nodes: shard within a node, replicate across "
                                    "nodes (HSDP / HYBRID_SHARD)")
    #: strategy ddp: ``gradient_as_bucket_view`` (gradients live in DDP's buckets instead of
    #: next to them); HF Trainer / accelerate default False
    ddp_bucket_view: bool = option(False, help="strategy ddp: gradient_as_bucket_view (gradients live in "
                                               "the reducer's buckets, no second copy)")

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


def _check(cond: bool, problems: list[Problem], msg: str, field: str | None = None,
           hint: str | None = None) -> None:
    if not cond:
        problems.append(Problem(field, msg, hint))


def _option_problems(obj, cls, skip: tuple[str, ...] = ()) -> list[Problem]:
    """Problems of ``obj``'s declared choices and bounds (nested groups only when they apply)."""
    active = {name for name, (_, when) in groups(cls).items() if when is None or getattr(obj, when)}
    out: list[Problem] = []
    for opt in walk(cls):
        head = opt.attr.split(".")[0]
        if opt.name in skip or ("." in opt.attr and head not in active):
            continue
        value = obj
        for part in opt.attr.split("."):
            value = getattr(value, part)
        out += opt.check(value)
    return out


def validate_job(model: ModelSpec, job: Job, layout: Layout | None = None) -> None:
    """Raise one ``ConfigError`` listing every problem with ``job``/``layout`` for ``model``."""
    layout = layout or Layout()
    p: list[Problem] = []
    if job.method in FUTURE_METHODS:
        p.append(Problem("method", f"method {job.method!r} is not modelled yet",
                         "use `method=full`, lora or qlora (fp8/nvfp4 training are planned)"))
    p += _option_problems(job, Job, skip=("method",) if job.method in FUTURE_METHODS else ())
    p += _option_problems(layout, Layout)
    if job.uses_lora:
        lo = job.lora
        _check(not (lora_wraps_experts(model, lo) and lo.dropout > 0), p,
               f"LoRA dropout {lo.dropout} with all-linear on MoE model {model.name}: PEFT wraps its fused "
               "experts with ParamWrapper, which refuses lora_dropout > 0",
               "lora_dropout",
               "use `lora_dropout=0`, or target attention only, e.g. `lora_targets=q_proj,k_proj,v_proj,o_proj`")
        names = model.module_names()
        unknown = [t for t in lo.target_modules if t != "all-linear" and t not in names]
        if unknown:
            p.append(Problem(
                "lora_targets",
                f"LoRA target module(s) {', '.join(map(repr, unknown))} not in {model.name} "
                f"(it has {', '.join(sorted(names))}, or use all-linear)"))
        elif not lora_targets(model, lo):
            p.append(Problem("lora_targets", "LoRA targets no module"))
    if job.precision in ("bf16", "fp16") and job.method == "full" and job.optimizer == "adamw":
        pass  # legal (pure half-precision training), the memory model handles it
    # layout
    if layout.tp >= 1 and layout.pp >= 1 and layout.gpus_per_node >= 1 and layout.nodes >= 1:
        _check(layout.world_size % (layout.tp * layout.pp) == 0, p,
               f"tp x pp = {layout.tp * layout.pp} must divide the {layout.world_size} GPUs", "tp")
        a = model.attention
        if layout.tp > 1:
            _check(a.num_heads % layout.tp == 0, p,
                   f"tensor-parallel degree {layout.tp} must divide the {a.num_heads} attention heads", "tp")
            _check(a.num_kv_heads % layout.tp == 0 or layout.tp % a.num_kv_heads == 0, p,
                   f"tensor-parallel degree {layout.tp} must divide (or be a multiple of) the "
                   f"{a.num_kv_heads} key/value heads", "tp")
            _check(layout.tp <= layout.gpus_per_node, p,
                   f"tensor parallelism of {layout.tp} must stay inside a node of {layout.gpus_per_node} GPUs",
                   "tp")
        if layout.pp > 1:
            _check(layout.pp <= model.num_layers, p,
                   f"pipeline degree {layout.pp} exceeds the {model.num_layers} layers", "pp")
        if layout.world_size == 1:
            _check(layout.strategy == "single", p,
                   f"strategy {layout.strategy!r} needs more than one GPU", "strategy", "use single, or `gpus=N`")
        elif layout.strategy == "single" and layout.dp > 1:
            p.append(Problem("strategy",
                             f"{layout.world_size} GPUs need a data-parallel strategy (ddp, zero1/2/3, fsdp)"))
    if layout.offload_params:
        _check(layout.strategy in ("zero3", "fsdp"), p, "parameter offload needs zero3 or fsdp", "offload_params")
    if layout.offload_optimizer:
        _check(layout.strategy in ("zero1", "zero2", "zero3", "fsdp"), p,
               "optimizer offload needs a ZeRO stage or fsdp", "offload_optimizer")
        _check(layout.strategy != "fsdp" or layout.offload_params, p,
               "FSDP cannot offload only the optimizer (its CPU offload moves parameters, gradients and the "
               "optimizer step together)", "offload_optimizer",
               "add `offload_params`, or use a ZeRO strategy (zero1/zero2/zero3)")
    if layout.hsdp:
        _check(layout.strategy == "fsdp", p, "HSDP (shard within a node, replicate across nodes) needs strategy fsdp",
               "hsdp")
        _check(layout.nodes > 1, p, "HSDP replicates across nodes: it needs more than one node", "hsdp",
               "use `nodes=N` with N > 1")
    if layout.ddp_bucket_view:
        _check(layout.strategy == "ddp", p, "gradient_as_bucket_view is a DDP option (strategy ddp)",
               "ddp_bucket_view")
    if not layout.reshard_after_forward:
        _check(layout.strategy == "fsdp", p,
               "keeping gathered layers after forward is an FSDP option (strategy fsdp; ZeRO-3 always re-gathers)",
               "no_reshard")
    if job.method == "qlora" and layout.strategy in ("zero3", "fsdp"):
        pass  # supported by accelerate/FSDP-QLoRA with bnb_4bit_quant_storage; modelled as sharded
    if p:
        raise ConfigError(problems=p)
