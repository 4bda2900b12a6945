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

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from .errors import ConfigError, Problem
from .inputs import show_value
from .model import FAMILIES, ModelSpec
from .optionspec import Option, group, groups, internal, json_field, lower, option, options_of

__all__ = [
    "METHODS",
    "PRECISIONS",
    "BASE_DTYPES",
    "OPTIMIZERS",
    "STRATEGIES",
    "ENGINES",
    "ATTN_IMPLS",
    "QUANT_TYPES",
    "COMPUTE_DTYPES",
    "QLORA_RECIPES",
    "OPTIMIZER_IMPLS",
    "CHECKPOINTING",
    "LOSSES",
    "LOGITS_LOSSES",
    "LoraSpec",
    "QuantSpec",
    "Job",
    "Layout",
    "validate_job",
    "lora_targets",
    "lora_wraps_experts",
    "check_job_fields",
    "JOB_LIMITS",
]

Method = Literal["full", "lora", "qlora", "fp8", "nvfp4"]
METHODS = ("full", "lora", "qlora")
FUTURE_METHODS = ("fp8", "nvfp4")  # not methods: FP8/NVFP4 recipes are precisions

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

#: FP8 / NVFP4 recipes users pass as ``precision`` (names, then aliases); their formats, GPUs,
#: libraries and sources are in ``catalog/data/precisions.json`` (``tests/test_lowprec.py`` holds
#: these names equal to the data file)
LOW_PRECISION_RECIPES = ("fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp", "fp8-te-delayed", "fp8-te-current",
                         "mxfp8-te", "nvfp4-te", "mxfp8-torchao", "nvfp4-torchao", "fp8-weight-only",
                         "nvfp4-weight-only")
LOW_PRECISIONS = LOW_PRECISION_RECIPES + ("fp8", "fp8-torchao", "float8", "fp8-torchao-rowwise",
                                          "fp8-rowwise-with-gw-hp", "fp8-te", "te-fp8", "mxfp8", "nvfp4", "fp4",
                                          "lora-fp8-base", "lora-nvfp4-base")

#: LoRA: dtype the frozen base weights are loaded in (Job.base_dtype)
BASE_DTYPES = ("compute", "fp32")
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp")
ATTN_IMPLS = ("sdpa", "flash", "eager")
#: bitsandbytes' 4-bit types, and ``torchao-nf4``: torchao's ``NF4Tensor`` as torchtune's QLoRA uses it
#: (``to_nf4(w, 64, 256)`` on every decoder-layer linear; ``ftplan.torchao_nf4``)
QUANT_TYPES = ("nf4", "fp4", "torchao-nf4")
#: the torchao NF4 quant type (torchtune's QLoRA)
TORCHAO_NF4 = "torchao-nf4"
#: how the optimizer step is implemented: one fused kernel (HF Trainer ``adamw_torch_fused``, torch
#: ``fused=True``), torch's default multi-tensor ``foreach`` path, or the per-tensor for-loop
OPTIMIZER_IMPLS = ("fused", "foreach", "forloop")
COMPUTE_DTYPES = ("bf16", "fp16", "fp32")
#: how the quantized model is prepared for LoRA: ``peft`` = ``prepare_model_for_kbit_training``
#: (non-quantized weights upcast to fp32) + fp32 adapters (PEFT's QLoRA docs, the QLoRA paper's
#: script, ftplan's exported train.py); ``trl`` = TRL >= 1.0 ``SFTTrainer`` handed a quantized
#: model and a ``peft_config`` (no kbit preparation: non-quantized weights stay in the load dtype;
#: the adapters are cast to bf16)
QLORA_RECIPES = ("peft", "trl")
#: activation checkpointing variants (``Job.checkpointing``; used when ``gradient_checkpointing``):
#: ``full`` = HF/torch non-reentrant checkpointing of every decoder layer (transformers 5 default),
#: ``full-reentrant`` = ``use_reentrant=True`` (what TRL forces for PEFT + DeepSpeed ZeRO-3),
#: ``selective`` = torch selective activation checkpointing with torchtitan's per-op policy (save
#: the attention kernel's outputs and every other matmul output), ``selective-attention`` = TRL's
#: ``gradient_checkpointing_kwargs={"selective": True}`` (save the attention kernel's outputs only),
#: ``every-k`` = checkpoint every ``checkpoint_every``-th decoder layer (transformers'
#: ``every_n_layers``: layers 0, k, 2k, ...), ``none`` = off
CHECKPOINTING = ("none", "full", "full-reentrant", "selective", "selective-attention", "every-k")
#: the loss path: ``trl`` = TRL >= 1.x SFTTrainer's fused LM head (``loss_type="nll"``, alias
#: ``chunked_nll``: chunked log-probabilities, the logits are never materialised), ``hf`` =
#: transformers' ``ForCausalLMLoss`` through ``model(labels=...)`` (full logits, upcast to fp32),
#: ``liger`` = Liger-Kernel's fused linear cross-entropy (HF Trainer ``use_liger_kernel``; CUDA),
#: ``hf-legacy`` = transformers < 4.46 (``LlamaForCausalLM.forward`` upcasts the logits with
#: ``logits.float()``, returns them in fp32, and copies the shifted logits with ``.contiguous()``
#: before ``CrossEntropyLoss``): the stacks of 2023-2024 recipes and published runs;
#: ``torchtune`` = torchtune's ``CEWithChunkedOutputLoss`` (alias ``torchtune_chunked_ce``): the
#: model applies its output projection per chunk of the sequence (8 chunks, compute-dtype logits,
#: all kept), the loss upcasts and scores one chunk at a time; with ``torch_compile`` the recipe
#: also compiles the loss's ``compute_cross_entropy`` (inductor), which then keeps the compute-dtype
#: logits instead of fp32 log-probabilities (torchtune's own trainer: pure ``bf16`` / ``fp32``)
LOSSES = ("trl", "hf", "liger", "hf-legacy", "torchtune")
#: the loss paths that materialise the whole logits tensor (transformers' own loss)
LOGITS_LOSSES = ("hf", "hf-legacy")
#: TRL's names for its loss: both are the fused head
_LOSS_ALIASES = {"nll": "trl", "chunked_nll": "trl", "chunked-nll": "trl", "torchtune_chunked_ce": "torchtune",
                 "torchtune-chunked-ce": "torchtune"}


def _loss_name(text: str) -> str:
    name = lower(text)
    return _LOSS_ALIASES.get(name, name)


#: Sanity bounds on job and layout numbers (the declared ``maximum`` of each option): validation
#: limits, not physical data. Each is far above any real fine-tuning job (sequences of 10M tokens,
#: 100k GPUs, the largest pretraining corpora ~4e13 tokens) and low enough that arithmetic on them
#: stays exact and finite, so a NaN, an infinity or a 400-digit number never reaches the memory,
#: runtime or cost formulas.
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
    "tp": 1 << 10,
    "pp": 1 << 12,
    "world_size": 1 << 20,
    "target_modules": 256,
    "checkpoint_every": 4096,
    "ep": 1 << 16,
    "ds_reduce_bucket_size": 10**12,
    "ds_zero3_elements": 10**13,
}


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


def _cached_hash(self) -> int:
    """Frozen option dataclasses key the planner's caches thousands of times per search: their
    (immutable) hash is computed once."""
    d = self.__dict__
    h = d.get("_hash")
    if h is None:
        h = d["_hash"] = hash(tuple(getattr(self, f.name) for f in fields(self)))
    return h


def _state_without_hash(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    state.pop("_hash", None)  # hashes of strings differ between processes
    return state


def _hash_once(cls):
    """Class decorator (after @dataclass): cache the hash, never pickle it."""
    cls.__hash__ = _cached_hash
    cls.__getstate__ = _state_without_hash
    return cls


@_hash_once
@dataclass(frozen=True)
class LoraSpec:
    r: int = option(16, name="lora_r", label="LoRA rank", minimum=1, maximum=JOB_LIMITS["lora_r"], web_max=65536,
                    help="LoRA rank r")
    alpha: int = option(32, name="lora_alpha", label="LoRA alpha", exclusive_minimum=0,
                        maximum=JOB_LIMITS["lora_alpha"], web_max=1 << 20, help="LoRA alpha (scaling alpha/r)")
    dropout: float = option(0.05, name="lora_dropout", label="LoRA dropout", minimum=0.0, exclusive_maximum=1.0,
                            auto=_auto_lora_dropout,
                            help="LoRA dropout (default 0.05; 0 where PEFT requires it: all-linear on MoE models)")
    #: PEFT ``target_modules``: leaf module names, or ("all-linear",)
    target_modules: tuple[str, ...] = option(
        ("all-linear",), name="lora_targets", normalize=lambda names: names or ("all-linear",),
        help="comma-separated PEFT target_modules, or all-linear (default)")


@_hash_once
@dataclass(frozen=True)
class QuantSpec:
    """4-bit quantization of the frozen base (QLoRA): bitsandbytes' nf4/fp4, or torchao's NF4 as
    torchtune's QLoRA uses it (``quant_type="torchao-nf4"``: ``double_quant``, ``recipe``,
    ``blocksize`` do not apply; its own rules in ``_torchao_nf4_problems``)."""

    quant_type: str = option("nf4", choices=QUANT_TYPES, label="quant type",
                             help="QLoRA 4-bit type: nf4 | fp4 (bitsandbytes) | torchao-nf4 (torchtune's QLoRA: "
                                  "torchao NF4Tensor bases, pure bf16/fp32, adapters in that dtype)")
    double_quant: bool = option(True, name="no_double_quant", invert=True,
                                help="QLoRA without double quantization of the quantization constants")
    compute_dtype: str = option("bf16", choices=COMPUTE_DTYPES, label="QLoRA compute dtype",
                                help="QLoRA compute dtype: bf16 | fp16 | fp32")
    recipe: str = option("peft", name="qlora_recipe", choices=QLORA_RECIPES, label="QLoRA recipe",
                         help="peft: prepare_model_for_kbit_training (non-quantized weights in fp32) and fp32 "
                              "adapters | trl: TRL SFTTrainer as-is (no kbit preparation: non-quantized weights "
                              "in the compute dtype; adapters cast to bf16)")
    blocksize: int = internal(64)  # bitsandbytes' default 4-bit block size
    #: modules bitsandbytes leaves unquantized (transformers skips the output embedding)
    skip_modules: tuple[str, ...] = json_field(("lm_head",))


@_hash_once
@dataclass(frozen=True)
class Job:
    method: str = option("full", choices=METHODS, help="full | lora | qlora")
    precision: str = option("bf16-mixed", choices=tuple(PRECISIONS) + LOW_PRECISIONS + ("auto",),
                            help="bf16-mixed (fp32 master weights) | fp16-mixed | bf16 | fp16 | fp32, or an "
                                 "FP8/NVFP4 recipe on bf16-mixed: fp8 (= fp8-tensorwise, torchao) | fp8-rowwise | "
                                 "fp8-te-delayed | mxfp8-te | nvfp4 (nvfp4-te for full, nvfp4-weight-only for "
                                 "LoRA) | fp8-weight-only ... (see benchmarks/notes/low_precision_support.md); "
                                 "recommend/compare: auto = search bf16-mixed, FP8 and FP4 per GPU")
    optimizer: str = option("adamw", choices=OPTIMIZERS, normalize=_optimizer_name,
                            help="adamw | adamw_8bit | paged_adamw_8bit | adafactor | sgd")
    micro_batch: int = option(1, flags=("--batch-size",), label="micro-batch", minimum=1,
                              maximum=JOB_LIMITS["micro_batch"], web_max=65536,
                              help="sequences per GPU per step")
    seq_len: int = option(1024, label="sequence length", minimum=1, maximum=JOB_LIMITS["seq_len"], web_max=1 << 21,
                          help="tokens per sequence (TRL SFTConfig max_length default: 1024)")
    grad_accum: int = option(1, label="gradient accumulation", minimum=1, maximum=JOB_LIMITS["grad_accum"],
                             web_max=1 << 20,
                             help="micro-batches per optimizer step")
    gradient_checkpointing: bool = option(True, flags=("--gc",),
                                          help="recompute activations in the backward pass (on by default, "
                                               "as TRL SFTConfig and PEFT's QLoRA preparation have it; "
                                               "`gradient_checkpointing=false` turns it off)")
    attn_impl: str = option("sdpa", name="attn", choices=ATTN_IMPLS, label="attention implementation",
                            help="sdpa | flash | eager")
    lora: LoraSpec = group(LoraSpec, when="uses_lora")
    quant: QuantSpec = group(QuantSpec, when="uses_quant")
    #: training data, for runtime and cost (tokens per epoch x epochs)
    dataset_tokens: int | None = option(None, type="tokens", name="tokens", label="dataset tokens",
                                        exclusive_minimum=0, maximum=JOB_LIMITS["dataset_tokens"], web_max=10**15,
                                        example="50M", json="data",
                                        help="dataset tokens per epoch, e.g. 50M")
    epochs: float = option(1.0, exclusive_minimum=0.0, maximum=JOB_LIMITS["epochs"], web_max=1000.0, json="data",
                           help="passes over the dataset")
    checkpointing: str = option("full", choices=CHECKPOINTING, label="checkpointing variant", metavar="MODE",
                                help="with checkpointing on: full (non-reentrant, default) | full-reentrant | "
                                     "selective (torchtitan op SAC) | selective-attention (TRL selective) | "
                                     "every-k | none")
    checkpoint_every: int = option(2, minimum=1, maximum=JOB_LIMITS["checkpoint_every"], web_max=4096, label="checkpoint every k layers", metavar="K",
                                   help="every-k checkpointing: layers 0, k, 2k, ... (transformers every_n_layers)")
    activation_offloading: bool = option(False, help="saved activations to pinned CPU memory "
                                                     "(TRL activation_offloading=True)")
    loss: str = option("trl", choices=LOSSES, normalize=_loss_name, label="loss path",
                       help="trl (SFTTrainer's fused LM head, loss_type=nll, default) | hf (transformers' "
                            "ForCausalLMLoss, fp32 logits) | liger (fused linear cross-entropy) | hf-legacy "
                            "(transformers < 4.46: fp32 logits returned by the model, shifted copy) | torchtune "
                            "(CEWithChunkedOutputLoss: 8 output chunks, compiled with `torch_compile`)")
    keep_output: bool = option(False, help="the training loop keeps the model output (its logits) alive through "
                                           "backward (`out = model(**batch); out.loss.backward()`); HF Trainer, "
                                           "TRL and torchtitan drop it first (hf / hf-legacy loss)")
    padding_free: bool = option(False, help="one row of micro-batch x seq-len tokens with position_ids "
                                            "(TRL padding_free=True; flash attention varlen)")
    packing: bool = option(False, help="pack sequences into full rows (TRL packing=True, bfd: padding-free)")
    #: the micro-batch carries padding: TRL's default collator (packing=False, padding_free=False)
    #: pads each micro-batch to its longest row and passes an attention_mask with zeros, so
    #: transformers materialises a (b, 1, s, s) mask for sdpa/eager (no ``is_causal``, k/v repeated
    #: for GQA) and hybrid models mask their conv / linear-attention inputs. Off: every row is full
    #: length (or the mask is all ones: transformers drops it), as at micro-batch 1
    padded_batches: bool = option(False, flags=("--padded",),
                                  help="the micro-batch has padded rows (TRL's default collator at micro-batch "
                                       "> 1 on data of uneven lengths): an attention_mask with zeros, so sdpa "
                                       "gets a materialised mask and repeated k/v; ignored with packing / "
                                       "padding_free")
    #: runtime only: how the optimizer step runs, and torch.compile of the model
    optimizer_impl: str = option("fused", choices=OPTIMIZER_IMPLS, label="optimizer implementation",
                                 help="fused (HF Trainer adamw_torch_fused, the default) | foreach "
                                      "(torch.optim default without fused=True) | forloop")
    torch_compile: bool = option(False, flags=("--compile",), help="the model runs under torch.compile: runtime, and the saved activations of llama-shaped dense decoder layers (each layer compiled)")
    #: LoRA: the dtype the frozen base is loaded in. ``compute``: the mixed-precision dtype (ftplan's
    #: exported script passes it to from_pretrained); ``fp32``: TRL's SFTTrainer given a model id
    #: without ``model_init_kwargs`` dtype (and the ``trl sft`` CLI's ``--dtype`` default), PEFT's
    #: examples/sft: fp32 frozen weights under bf16 autocast (FSDP / ZeRO gather them in bf16)
    base_dtype: str = option("compute", choices=BASE_DTYPES, label="LoRA base dtype",
                             help="lora: dtype of the frozen base weights: compute (loaded in the "
                                  "mixed-precision dtype, default) | fp32 (TRL SFTTrainer's default for a "
                                  "model id without model_init_kwargs dtype)")
    #: FP8 / NVFP4 recipe (``catalog/data/precisions.json``) on top of ``precision`` (its base,
    #: bf16-mixed): set by passing the recipe as ``precision`` (``Job(precision="fp8")`` becomes
    #: precision="bf16-mixed", low_precision="fp8-tensorwise"; see ``__post_init__``); None = none
    low_precision: str | None = json_field(None, choices=LOW_PRECISION_RECIPES)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS and self.precision in LOW_PRECISIONS:
            from .lowprec import resolve_precision

            recipe = resolve_precision(self.precision, self.method)
            if recipe is not None:
                object.__setattr__(self, "precision", recipe.base_precision)
                object.__setattr__(self, "low_precision", recipe.name)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def uses_lora(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def precision_label(self) -> str:
        """What the user picked: the low-precision recipe, else the precision."""
        return self.low_precision or self.precision

    @property
    def uses_quant(self) -> bool:
        """The frozen base is quantized to 4 bits (QLoRA)."""
        return self.method == "qlora"

    @property
    def torchao_nf4(self) -> bool:
        """torchtune's QLoRA: torchao ``NF4Tensor`` base weights (``quant_type="torchao-nf4"``), every
        other weight and the adapters in the precision's dtype (no kbit preparation, no autocast)."""
        return self.method == "qlora" and self.quant.quant_type == TORCHAO_NF4

    @property
    def kbit_upcast(self) -> bool:
        """QLoRA through ``prepare_model_for_kbit_training``: every non-quantized weight in fp32."""
        return self.method == "qlora" and self.quant.recipe == "peft" and not self.torchao_nf4

    @property
    def adapter_dtype(self) -> str:
        """dtype of the LoRA adapters: fp32 (PEFT's ``autocast_adapter_dtype=True``), or bf16 under
        TRL's QLoRA recipe (``SFTTrainer`` casts a quantized model's trainable parameters to
        ``torch.bfloat16``, whatever the compute dtype)."""
        if self.torchao_nf4:
            return self.quant.compute_dtype  # torchtune builds the model in its dtype (validated equal)
        if self.method == "qlora" and self.quant.recipe == "trl":
            return "bf16"
        return "fp32"

    @property
    def frozen_dtype(self) -> str:
        """dtype of the frozen (non-quantized) base weights as loaded: the precision's, or fp32
        (``base_dtype="fp32"``)."""
        return "fp32" if self.base_dtype == "fp32" else PRECISIONS[self.precision]["frozen"]

    @property
    def casts_fp32_base(self) -> bool:
        """LoRA on an fp32-loaded base under autocast (one GPU, DDP): autocast casts every frozen
        matmul weight per use, and the matmul saves the copy for the input's gradient (FSDP and
        DeepSpeed cast the base themselves and run on compute-dtype weights)."""
        return (self.method == "lora" and self.precision.endswith("-mixed")
                and self.frozen_dtype != PRECISIONS[self.precision]["compute"])

    @property
    def unquantized_dtype(self) -> str:
        """QLoRA: dtype of the weights bitsandbytes leaves alone (embedding, norms, lm_head, fused
        3-D experts): fp32 after ``prepare_model_for_kbit_training``, else the load dtype."""
        return "fp32" if self.kbit_upcast else self.quant.compute_dtype

    @property
    def materialises_logits(self) -> bool:
        """The loss path builds the whole logits tensor (transformers' own loss, either version)."""
        return self.loss in LOGITS_LOSSES

    @property
    def ac_mode(self) -> str:
        """The activation checkpointing in effect: ``none`` or one of the variants."""
        if not self.gradient_checkpointing:
            return "none"
        return self.checkpointing

    @property
    def is_padding_free(self) -> bool:
        """TRL flattens the micro-batch into one row (``padding_free``, or ``packing`` with bfd)."""
        return self.padding_free or self.packing

    @property
    def has_padding(self) -> bool:
        """The micro-batch's attention_mask has zeros (``padded_batches``; never in padding-free rows)."""
        return self.padded_batches and not self.is_padding_free

    def with_(self, **changes) -> "Job":
        return replace(self, **changes)


#: sharding engine per strategy: DDP (torch), ZeRO-1/2/3 (DeepSpeed), fsdp (PyTorch FSDP, version
#: ``Layout.fsdp_version``: 2 = ``fully_shard``, what ``accelerate config`` writes by default)
ENGINES = {"single": "torch", "ddp": "ddp", "zero1": "deepspeed", "zero2": "deepspeed", "zero3": "deepspeed",
           "fsdp": "fsdp"}
FSDP_VERSIONS = (1, 2)
#: strategy fsdp: dtype of the gradient reduce-scatter (Layout.fsdp_reduce_dtype)
FSDP_REDUCE_DTYPES = ("compute", "fp32")
#: strategy fsdp (FSDP2): whose ``fully_shard`` calls make the units (Layout.fsdp_wrap)
FSDP_WRAPS = ("accelerate", "torchtune")


@_hash_once
@dataclass(frozen=True)
class Layout:
    gpus_per_node: int = option(1, name="gpus", label="GPUs per node", minimum=1,
                                maximum=JOB_LIMITS["gpus_per_node"], web_max=1024, help="GPUs per node")
    nodes: int = option(1, minimum=1, maximum=JOB_LIMITS["nodes"], web_max=1024, help="nodes")
    strategy: str = option("single", choices=STRATEGIES, auto=_auto_strategy,
                           help="single | ddp | zero1 | zero2 | zero3 | fsdp (default: single, or ddp with >1 GPU)")
    #: ZeRO: DeepSpeed ``offload_optimizer`` (optimizer states, fp32 master and gradient partitions on
    #: the host, AdamW runs on the CPU); fsdp: only together with ``offload_params``
    offload_optimizer: bool = option(False, help="optimizer states (and step) on the CPU")
    #: ZeRO-3: DeepSpeed ``offload_param``; fsdp: ``CPUOffloadPolicy`` / ``CPUOffload(offload_params=True)``,
    #: which keeps parameters, gradients and the optimizer step on the host
    offload_params: bool = option(False, help="parameters on the CPU (zero3; fsdp: with their gradients "
                                              "and the optimizer step)")
    tp: int = option(1, label="tensor-parallel degree", minimum=1, maximum=JOB_LIMITS["tp"], web_max=1024,
                     help="tensor-parallel degree")
    pp: int = option(1, label="pipeline-parallel degree", minimum=1, maximum=JOB_LIMITS["pp"], web_max=1024,
                     help="pipeline-parallel degree")
    #: interleaved pipeline schedule (Megatron-LM virtual pipeline stages; torch.distributed.pipelining
    #: ScheduleInterleaved1F1B): model chunks per pipeline rank, 1 = plain 1F1B
    pp_virtual: int = option(1, label="virtual pipeline stages per rank", minimum=1, maximum=JOB_LIMITS["pp"],
                             web_max=1024, help="interleaved pipeline schedule: model chunks per pipeline rank "
                                                "(1 = plain 1F1B)")
    #: expert parallelism (MoE): routed experts split over ``ep`` ranks of the data-parallel
    #: group, tokens exchanged with all-to-all (see ftplan.expert_parallel)
    ep: int = option(1, label="expert-parallel degree", minimum=1, maximum=JOB_LIMITS["ep"], web_max=1024,
                     help="expert-parallel degree (MoE): routed experts split over EP ranks")
    #: strategy fsdp: 2 = FSDP2 (``fully_shard``), 1 = FSDP1 (``FullyShardedDataParallel``)
    fsdp_version: int = option(2, choices=FSDP_VERSIONS, label="FSDP version",
                               help="strategy fsdp: 2 = FSDP2 fully_shard (accelerate config's default) | 1 = FSDP1")
    #: strategy fsdp: dtype of the gradient reduce-scatter (``MixedPrecisionPolicy`` /
    #: ``MixedPrecision`` ``reduce_dtype``): ``compute`` = the mixed-precision dtype, what
    #: accelerate sets (``param_dtype = reduce_dtype``); ``fp32``: torchtitan's default
    #: (``mixed_precision_reduce = "float32"``)
    fsdp_reduce_dtype: str = option("compute", choices=FSDP_REDUCE_DTYPES, label="FSDP reduce dtype",
                                    help="strategy fsdp: dtype of the gradient reduce-scatter: compute = the "
                                         "mixed-precision dtype (accelerate) | fp32 (torchtitan's default)")
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
    #: strategy zero1/2/3: DeepSpeed's ``reduce_bucket_size`` in elements, as a DeepSpeed config
    #: gives it; 0 = HF Trainer's ``auto`` (hidden_size^2), what ftplan's ds_config.json writes.
    #: Without a DeepSpeed JSON (accelerate's ``deepspeed_config`` questions only) DeepSpeed's own
    #: default applies: 500,000,000 (deepspeed/runtime/zero/config.py)
    ds_reduce_bucket_size: int = option(0, minimum=0, maximum=JOB_LIMITS["ds_reduce_bucket_size"],
                                        label="DeepSpeed reduce_bucket_size",
                                        help="strategy zero1/2/3: DeepSpeed reduce_bucket_size in elements "
                                             "(0 = HF Trainer's auto, hidden_size^2; DeepSpeed's own default "
                                             "without a JSON config: 500000000)")
    #: strategy zero3: DeepSpeed's ``stage3_max_live_parameters``, ``stage3_max_reuse_distance`` and
    #: ``stage3_prefetch_bucket_size`` in elements; 0 = what ftplan's ds_config.json writes (1e9, 1e9
    #: and HF Trainer's ``auto`` 0.9 x hidden_size^2; DeepSpeed's own defaults without a JSON config:
    #: 1e9, 1e9, 5e7). They decide how much ZeRO-3 keeps gathered (sharding.py)
    ds_max_live_parameters: int = option(0, minimum=0, maximum=JOB_LIMITS["ds_zero3_elements"],
                                         label="DeepSpeed stage3_max_live_parameters",
                                         help="strategy zero3: DeepSpeed stage3_max_live_parameters in elements "
                                              "(0 = 1000000000, what ftplan's ds_config.json writes)")
    ds_max_reuse_distance: int = option(0, minimum=0, maximum=JOB_LIMITS["ds_zero3_elements"],
                                        label="DeepSpeed stage3_max_reuse_distance",
                                        help="strategy zero3: DeepSpeed stage3_max_reuse_distance in elements "
                                             "(0 = 1000000000, what ftplan's ds_config.json writes)")
    ds_prefetch_bucket_size: int = option(0, minimum=0, maximum=JOB_LIMITS["ds_zero3_elements"],
                                          label="DeepSpeed stage3_prefetch_bucket_size",
                                          help="strategy zero3: DeepSpeed stage3_prefetch_bucket_size in elements "
                                               "(0 = HF Trainer's auto, 0.9 x hidden_size^2; DeepSpeed's own "
                                               "default without a JSON config: 50000000)")
    #: strategy fsdp (FSDP2): which units ``fully_shard`` makes. ``accelerate`` (accelerate's
    #: ``fsdp2_prepare_model``: decoder layers, the input embedding, [final norm, lm_head] kept
    #: gathered); ``torchtune`` (torchtune 0.3.x ``training.shard_model``: decoder layers, in full
    #: fine-tuning also the input embedding and the output projection (``custom_sharded_layers``),
    #: the root the rest, never resharded after forward; the output projection called once per
    #: loss chunk: ``sharding.fsdp_units``)
    fsdp_wrap: str = option("accelerate", choices=FSDP_WRAPS, label="FSDP wrapping",
                            help="strategy fsdp (FSDP2): accelerate = accelerate's units | torchtune = torchtune's "
                                 "shard_model units (recipes' custom_sharded_layers in full fine-tuning)")

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
            parts.append(f"pp={self.pp}" + (f" x {self.pp_virtual} virtual" if self.pp_virtual > 1 else ""))
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.offload_optimizer:
            parts.append("offload-optimizer")
        if self.offload_params:
            parts.append("offload-params")
        if self.strategy == "fsdp":
            if self.fsdp_version != 2:
                parts.append(f"fsdp{self.fsdp_version}")
            if not self.reshard_after_forward:
                parts.append("no-reshard")
            if self.fsdp_reduce_dtype != "compute":
                parts.append(f"reduce-{self.fsdp_reduce_dtype}")
            if self.fsdp_wrap != "accelerate":
                parts.append(f"{self.fsdp_wrap}-wrap")
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
    and the router become ``target_parameters`` (see :func:`lora_wraps_experts`), for the
    families PEFT has a mapping for.
    """
    names = model.module_names()
    if "all-linear" in lora.target_modules:
        # (a family PEFT does not rewrite, qwen3_5_moe: every nn.Linear, its shared expert and
        # shared_expert_gate included)
        if lora_wraps_experts(model, lora):
            mlp = {lin.module for lin in model.linears() if lin.category == "mlp"}
            return frozenset(n for n in names if n != "lm_head" and n not in mlp)
        return frozenset(n for n in names if n != "lm_head")
    return frozenset(lora.target_modules) & names


def peft_target_modules(model: ModelSpec, lora: LoraSpec) -> str | list[str]:
    """``target_modules`` as an exported job passes it to PEFT (or axolotl / LLaMA-Factory):
    ``"all-linear"``, or the module names. On a family where PEFT's all-linear fails
    (``Family.peft_all_linear`` False: llama4_text's router) all-linear becomes the modules ftplan
    planned, in layer order."""
    fam = FAMILIES.get(model.family)
    if "all-linear" in lora.target_modules:
        if fam is not None and not fam.peft_all_linear:
            targets = lora_targets(model, lora)
            from .model import layer_linears

            return list(dict.fromkeys(lin.module for g in model.groups for lin in layer_linears(model, g)
                                      if lin.module in targets))
        return "all-linear"
    return list(lora.target_modules)


def lora_wraps_experts(model: ModelSpec, lora: LoraSpec) -> bool:
    """True when PEFT wraps the fused expert weights (``gate_up_proj`` at rank 2r, ``down_proj``
    at rank r) and the router weight (rank r) with ``ParamWrapper``: ``all-linear`` on a
    transformers-5 MoE model. ParamWrapper refuses ``lora_dropout`` > 0 and adds the merged
    ``W + BA`` of every expert to each forward."""
    fam = FAMILIES.get(model.family)
    return model.is_moe and "all-linear" in lora.target_modules and (fam is None or fam.peft_wraps_experts)


def attention_targets(model: ModelSpec) -> str:
    """The attention ``nn.Linear`` leaf names of ``model``, comma-separated, in registration order
    (``q_proj,k_proj,v_proj,o_proj``; MLA's ``q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj``)."""
    names = [lin.module for lin in model.linears() if lin.is_module and lin.category == "attention"]
    return ",".join(dict.fromkeys(names)) or "q_proj,k_proj,v_proj,o_proj"


def _check(cond: bool, problems: list[Problem], msg: str, field: str | None = None,
           hint: str | None = None) -> None:
    if not cond:
        problems.append(Problem(field, msg, hint))


@functools.lru_cache(maxsize=64)
def _compiled(cls) -> tuple[tuple[Option, Callable[[Any], Any], str | None, tuple[type, ...]], ...]:
    """(option, value getter, its group or None, accepted Python types) of ``cls``, built once:
    ``validate_job`` runs for every memory estimate of a search."""
    out = []
    for opt in options_of(cls):
        head = opt.attr.split(".")[0] if "." in opt.attr else None
        out.append((opt, operator.attrgetter(opt.attr), head, _KINDS.get(opt.type, (object,))))
    return tuple(out)


def _option_problems(obj, cls, skip: tuple[str, ...] = ()) -> list[Problem]:
    """Problems of ``obj``'s declared choices and bounds (nested groups only when they apply)."""
    active = {name for name, (_, when) in groups(cls).items() if when is None or getattr(obj, when)}
    out: list[Problem] = []
    for opt, get, head, _ in _compiled(cls):
        if (head is not None and head not in active) or opt.name in skip:
            continue
        value = get(obj)
        if value is None:
            continue
        if opt.choices is None and opt.type not in ("int", "float", "tokens"):
            continue
        out += opt.check(value)
    return out


#: Python types a value of each option type may have (bool is not an int here; None = unset)
_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "tokens": (int,), "float": (int, float), "bool": (bool,),
                                       "str": (str,), "names": (tuple,), "paths": (tuple,)}


def _type_problems(obj, cls) -> list[Problem]:
    """Values of the wrong Python type (a job built by a program, or from a hand-edited file, can
    hold anything): found before any comparison, so that ``"8" >= 1`` never raises."""
    out: list[Problem] = []
    for opt, get, _, kinds in _compiled(cls):
        try:
            value = get(obj)
        except AttributeError:
            out.append(Problem(opt.name, f"{opt.words}: not set"))
            continue
        if value is None:
            continue
        t = opt.type
        ok = isinstance(value, kinds) and (t == "bool" or not isinstance(value, bool))
        if ok and t in ("names", "paths"):
            ok = len(value) <= JOB_LIMITS["target_modules"] and all(
                isinstance(x, str) and 0 < len(x) <= 256 and x.isprintable() for x in value)
        if ok and type(value) is float and not math.isfinite(value):
            out.append(Problem(opt.name, f"{opt.words} must be a finite number (got {value})"))
        elif not ok:
            what = {"int": "an integer", "tokens": "an integer", "float": "a number", "bool": "true or false",
                    "names": "a list of names (each 1-256 printable characters)"}.get(t, "text")
            out.append(Problem(opt.name, f"{opt.words} must be {what} (got {show_value(value)})"))
    return out


def _check_ep(model: ModelSpec, layout: Layout, p: list[Problem]) -> None:
    """Expert parallelism as transformers' DistributedConfig / torchtitan lay it out: the EP group
    lies within the data-parallel x tensor-parallel ranks (``ep`` a multiple of ``tp`` dividing
    ``dp x tp``), every rank holds ``num_experts / ep`` whole experts."""
    ep = layout.ep
    if ep < 1:
        return  # the option's own bound reports it
    if not model.is_moe:
        p.append(Problem("ep", f"expert parallelism needs a mixture-of-experts model ({model.name} has no experts)",
                         "use `ep=1`"))
        return
    if model.is_hybrid:
        kind = "Gated DeltaNet" if model.has_gated_deltanet else "short-convolution"
        p.append(Problem("ep", f"expert parallelism on {model.name}'s hybrid {kind} layers is not modelled "
                               "(not held against transformers' EP engine)", "use `ep=1`"))
        return
    if any(g.moe is not None and g.moe.dense_dispatch for g in model.groups):
        p.append(Problem("ep", f"expert parallelism on {model.name}: transformers has no expert-parallel plan for "
                               "Llama 4 (its experts take every token, pre-scaled by the router, so nothing is "
                               "dispatched)", "use `ep=1`"))
    if any(g.moe is not None and g.moe.router == "granitemoe" for g in model.groups):
        p.append(Problem("ep", f"expert parallelism on {model.name}: transformers has no expert-parallel plan for "
                               "Granite MoE (GraniteMoeConfig has no base_model_ep_plan)", "use `ep=1`"))
        return
    if any(g.moe is not None and g.moe.router_is_module for g in model.groups):
        p.append(Problem("ep", f"expert parallelism on {model.name}'s Gemma 4 MoE block (a dense MLP beside the "
                               "experts) is not modelled (not held against transformers' EP engine)", "use `ep=1`"))
        return
    experts = sorted({g.moe.num_experts for g in model.groups if g.moe is not None})
    for e in experts:
        _check(e % ep == 0, p, f"expert-parallel degree {ep} must divide the {e} experts of {model.name}", "ep")
    dp_tp = layout.dp * layout.tp
    _check(ep % layout.tp == 0 and dp_tp % ep == 0, p,
           f"expert-parallel degree {ep} must be a multiple of tp={layout.tp} and divide dp x tp = {dp_tp} "
           "(the EP group lies within the data-parallel ranks)", "ep")
    _check(layout.pp == 1, p, "expert parallelism with pipeline parallelism is not modelled", "ep", "use `pp=1`")
    _check(not (layout.offload_optimizer or layout.offload_params), p,
           "expert parallelism with CPU offload is not modelled", "ep", "drop the offload")
    _check(layout.strategy != "single", p, "expert parallelism needs a data-parallel strategy (fsdp, zero1/2/3, ddp)",
           "strategy")


def check_job_fields(job: Job, layout: Layout | None = None) -> None:
    """The model-independent part of :func:`validate_job`: types, finiteness, choices and bounds.
    For jobs read from files before the model is known (``ftplan train --from-json``)."""
    layout = layout or Layout()
    p = _type_problems(job, Job) + _type_problems(layout, Layout)
    if not p:
        p = _field_problems(job, layout)
    if p:
        raise ConfigError(problems=p)


def _field_problems(job: Job, layout: Layout) -> list[Problem]:
    p: list[Problem] = []
    if job.method in FUTURE_METHODS:
        p.append(Problem("method", f"method {job.method!r} is not modelled: FP8/NVFP4 are precisions, not methods",
                         f"use `method=full` or lora with `precision={job.method}` (e.g. fp8-tensorwise, "
                         "fp8-te-delayed, nvfp4-te, nvfp4-weight-only)"))
    p += _option_problems(job, Job, skip=("method",) if job.method in FUTURE_METHODS else ())
    p += _option_problems(layout, Layout)
    if not p and layout.world_size > JOB_LIMITS["world_size"]:
        p.append(Problem("nodes", f"{layout.world_size:,} GPUs is implausibly many "
                                  f"(at most {JOB_LIMITS['world_size']:,.0f})"))
    return p


def planned_attention(model: ModelSpec, job: Job) -> tuple[Job, str | None]:
    """The job as transformers runs it on ``model``, and a note when that differs: an architecture
    without an sdpa path (attention soft-capping: Gemma2) runs eager attention, which materialises
    the ``(b, heads, s, s)`` scores (measured on an H100: ``h100-sxm-holdout1.jsonl``, where
    ``attn_implementation="sdpa"`` was refused, and ``h100-sxm-eager1.jsonl``)."""
    if job.attn_impl == "sdpa" and not model.supports_sdpa:
        if model.attention.sinks:
            why = "attention sinks (gpt-oss)"
            flash = ("--attn flash for a flash kernel with sinks: transformers swaps flash_attention_2 for "
                     "kernels-community/vllm-flash-attn3")
        else:
            why, flash = "attention soft-capping (Gemma2)", "--attn flash for FlashAttention-2"
        return job.with_(attn_impl="eager"), (
            f"attention: transformers has no sdpa path for {why} and runs eager "
            f"attention; planned eager ({flash})")
    return job, None


def _torchao_nf4_problems(model: ModelSpec, job: Job, layout: Layout) -> list[Problem]:
    """What torchtune 0.3.1's QLoRA (torchao 0.18's ``NF4Tensor``) runs, and what ftplan held of it:
    a pure precision (torchtune's ``dtype``), dense decoder layers whose linears have no bias
    (``FrozenNF4Linear`` / ``LoRALinear(quantize_base=True)`` refuse one), one GPU or FSDP2 over
    one shard dimension (torchtune's ``load_from_full_model_state_dict`` refuses a 2-D mesh),
    and sizes torchao accepts (``ftplan.torchao_nf4.nf4_problems``)."""
    from .torchao_nf4 import nf4_problems

    p: list[Problem] = []
    hint = "use `quant_type=nf4` (bitsandbytes) for this job"
    prec = PRECISIONS.get(job.precision, {}).get("compute")
    _check(job.precision in ("bf16", "fp32") and job.low_precision is None, p,
           f"torchao-nf4 is torchtune's QLoRA, which trains in one dtype (its recipes' dtype: bf16 or fp32) without "
           f"autocast; "
           f"precision is {job.precision_label}", "precision", "use `precision=bf16`")
    _check(prec is None or job.quant.compute_dtype == prec, p,
           f"torchao NF4 dequantizes to the weight's dtype: the compute dtype must be the precision's ({prec}), "
           f"not {job.quant.compute_dtype}", "compute_dtype", f"use `compute_dtype={prec}`")
    _check(job.quant.double_quant, p, "torchao's NF4Tensor always double-quantizes its block scalers",
           "no_double_quant", "drop `no_double_quant`")
    _check(job.quant.recipe == "peft", p, "qlora_recipe picks how PEFT/TRL prepare a bitsandbytes model; "
           "torchao-nf4 follows torchtune's recipe", "qlora_recipe", "drop `qlora_recipe`")
    _check(not model.is_moe and not model.is_hybrid, p,
           f"torchao-nf4 (torchtune 0.3.1's QLoRA builders) is planned for dense decoder layers; {model.name} "
           "is not", "quant_type", hint)
    biased = sorted({lin.module for lin in model.linears() if lin.is_module and lin.bias
                     and lin.module not in job.quant.skip_modules})
    _check(not biased, p, f"torchtune's NF4 linears (FrozenNF4Linear, LoRALinear with quantize_base) refuse a "
           f"bias; {model.name}'s {', '.join(biased)} have one", "quant_type", hint)
    _check(layout.strategy in ("single", "fsdp") and layout.fsdp_version == 2 and layout.tp == 1
           and layout.pp == 1 and layout.ep == 1 and not layout.hsdp and not layout.offload_params, p,
           "torchao-nf4 is planned on one GPU or under FSDP2 sharding one dimension (torchtune's "
           "lora_finetune_distributed), without TP, PP, EP, HSDP or parameter offload", "strategy",
           "use `strategy=fsdp` (FSDP2) or one GPU")
    shard = layout.shard_degree if layout.strategy == "fsdp" else 1
    for msg in nf4_problems(((lin.module, lin.out_features, lin.in_features) for lin in model.linears()
                             if lin.is_module and lin.module not in job.quant.skip_modules), shard):
        p.append(Problem("quant_type", f"{model.name}: {msg}", hint))
    return p


def validate_job(model: ModelSpec, job: Job, layout: Layout | None = None) -> None:
    """Raise one ``ConfigError`` listing every problem with ``job``/``layout`` for ``model``.

    Types and finiteness first (a wrong type stops there: nothing can be compared), then the
    declared choices and bounds of every option (:data:`JOB_LIMITS` among them), then the checks
    across fields and against the model.
    """
    layout = layout or Layout()
    p = _type_problems(job, Job) + _type_problems(layout, Layout)
    if p:
        raise ConfigError(problems=p)
    p = _field_problems(job, layout)
    if any(pr.field in ("gpus", "nodes", "tp", "pp") for pr in p):
        raise ConfigError(problems=p)  # the checks below divide by these
    fam = FAMILIES.get(model.family)
    if job.attn_impl == "flash" and fam is not None and not fam.supports_flash:
        p.append(Problem("attn", f"transformers has no flash-attention path for {model.name} "
                                      f"({model.family}: _supports_flash_attn is False)",
                         "use `attn=sdpa` (or eager)"))
    if job.uses_lora:
        lo = job.lora
        _check(not (lora_wraps_experts(model, lo) and lo.dropout > 0), p,
               f"LoRA dropout {lo.dropout} with all-linear on MoE model {model.name}: PEFT wraps its fused "
               "experts with ParamWrapper, which refuses lora_dropout > 0",
               "lora_dropout",
               f"use `lora_dropout=0`, or target attention only, e.g. `lora_targets={attention_targets(model)}`")
        if layout.ep > 1 and lora_wraps_experts(model, lo):
            # measured (ftplan.measure.ep_run, tests/test_ep_lora.py): get_peft_model after
            # transformers' expert-parallel load wraps the DTensor expert shards with plain-tensor
            # adapters for every expert, and the first forward fails in the merge ("aten.baddbmm
            # got mixed torch.Tensor and DTensor")
            p.append(Problem("lora_targets",
                             f"LoRA on the experts (`lora_targets=all-linear` on {model.name}) with expert "
                             f"parallelism `ep={layout.ep}`: PEFT's ParamWrapper cannot adapt the expert shards "
                             "transformers' expert parallelism makes (its forward fails on the DTensor experts)",
                             f"leave the experts frozen with `lora_targets={attention_targets(model)}`, or use "
                             "`ep=1`"))
        names = model.module_names()
        unknown = [t for t in lo.target_modules if t != "all-linear" and t not in names]
        if unknown:
            p.append(Problem(
                "lora_targets",
                f"LoRA target module(s) {', '.join(map(repr, unknown))} not in {model.name} "
                f"(it has {', '.join(sorted(names))}, or use all-linear)"))
        elif not lora_targets(model, lo):
            p.append(Problem("lora_targets", "LoRA targets no module"))
    if job.method == "qlora" and layout.ep > 1:
        # measured: PEFT's bitsandbytes dispatch reads Params4bit attributes the DTensor shards of
        # transformers' load-time FSDP2 do not have ("'DTensor' object has no attribute
        # 'compress_statistics'"), whatever the targets
        p.append(Problem("method", f"QLoRA with expert parallelism `ep={layout.ep}`: PEFT cannot put adapters on "
                                   "the 4-bit layers transformers' expert-parallel load shards (FSDP2 DTensors)",
                         "use `method=lora`, or `ep=1`"))
    if job.precision == "auto":
        p.append(Problem("precision", "`precision=auto` searches precisions: it is for `ftplan recommend` and "
                                      "`ftplan compare`", "pass one precision, e.g. `precision=bf16-mixed` or fp8"))
    if job.low_precision is not None and job.method not in FUTURE_METHODS:
        from .lowprec import job_problems

        p += job_problems(model, job)
    _check(job.checkpoint_every <= model.num_layers, p,
           f"checkpoint every {job.checkpoint_every} layers: {model.name} has {model.num_layers}",
           "checkpoint_every", f"use `checkpoint_every` between 1 and {model.num_layers}")
    if job.uses_lora and job.loss == "trl" and "lm_head" in job.lora.target_modules:
        p.append(Problem("lora_targets", "TRL's fused LM head reads lm_head.weight directly: SFTTrainer refuses a "
                         "LoRA adapter on lm_head", "drop lm_head from `lora_targets`, or use `loss=hf`"))
    if job.loss == "torchtune":
        _check(not job.precision.endswith("-mixed"), p, "torchtune's recipes train in their `dtype` (bf16 or fp32), "
               "without autocast: the torchtune loss path is planned for a pure precision", "loss",
               "use `precision=bf16` (torchtune's dtype: bf16) or another loss")
        _check(not (job.uses_lora and "lm_head" in job.lora.target_modules), p,
               "the torchtune loss path is planned with a frozen output projection (no LoRA on lm_head)",
               "lora_targets", "drop lm_head from `lora_targets`")
        _check(not job.activation_offloading, p, "activation offloading is not planned with the torchtune loss "
               "path", "activation_offloading", "drop `activation_offloading` or use another loss")
    if job.precision in ("bf16", "fp16") and job.method == "full" and job.optimizer == "adamw":
        pass  # legal (pure half-precision training), the memory model handles it
    # layout
    if layout.tp >= 1 and layout.pp >= 1 and layout.gpus_per_node >= 1 and layout.nodes >= 1:
        _check(layout.world_size % (layout.tp * layout.pp) == 0, p,
               f"tp x pp = {layout.tp * layout.pp} must divide the {layout.world_size} GPUs", "tp")
        a = model.attention
        if layout.tp > 1:
            # transformers' tp_plan gathers the Gated DeltaNet's projections whole on every rank
            # (colwise_gather_output): no head-parallel split ftplan could plan
            _check(not model.is_hybrid, p, f"tensor parallelism is not modelled for the linear-attention / "
                   f"short-convolution layers of {model.name}", "tp")
            # olmo2/olmo3: the q/k norms span the whole projection, so their tp_plan gathers q, k and v
            # whole on every rank (colwise_gather_output) and splits o_proj's input: not the head split
            _check(not a.qk_norm_whole, p, f"tensor parallelism is not modelled for {model.name}'s q/k norms over "
                   "the whole projection (transformers gathers q/k/v on every rank)", "tp")
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
        if layout.pp_virtual > 1:
            _check(layout.pp > 1, p, "virtual pipeline stages need pipeline parallelism", "pp_virtual",
                   "use `pp_virtual=1`, or `pp=N` with N > 1")
            _check(layout.pp * layout.pp_virtual <= model.num_layers, p,
                   f"pp x pp_virtual = {layout.pp * layout.pp_virtual} model chunks exceed the {model.num_layers} layers",
                   "pp_virtual")
        if layout.world_size == 1:
            _check(layout.strategy == "single", p,
                   f"strategy {layout.strategy!r} needs more than one GPU", "strategy", "use single, or `gpus=N`")
        elif layout.strategy == "single" and layout.dp > 1:
            p.append(Problem("strategy",
                             f"{layout.world_size} GPUs need a data-parallel strategy (ddp, zero1/2/3, fsdp)"))
    if layout.ep != 1:
        _check_ep(model, layout, p)
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
    if layout.ds_reduce_bucket_size:
        _check(layout.strategy in ("zero1", "zero2", "zero3"), p,
               "reduce_bucket_size is a DeepSpeed ZeRO option (strategy zero1, zero2 or zero3)",
               "ds_reduce_bucket_size", "drop `ds_reduce_bucket_size`, or use a ZeRO strategy")
    for name in ("ds_max_live_parameters", "ds_max_reuse_distance", "ds_prefetch_bucket_size"):
        if getattr(layout, name):
            _check(layout.strategy == "zero3", p, f"{name.removeprefix('ds_')} is a DeepSpeed ZeRO-3 option "
                   "(strategy zero3)", name, f"drop `{name}`, or use strategy zero3")
    if layout.fsdp_reduce_dtype != "compute":
        _check(layout.strategy == "fsdp", p, "the reduce dtype is an FSDP mixed-precision option (strategy fsdp)",
               "fsdp_reduce_dtype", "drop `fsdp_reduce_dtype`, or use strategy fsdp")
    if layout.fsdp_wrap in FSDP_WRAPS and layout.fsdp_wrap != "accelerate":  # (an unknown value: its own problem)
        _check(layout.strategy == "fsdp" and layout.fsdp_version == 2, p,
               f"the {layout.fsdp_wrap} wrapping is an FSDP2 option (strategy fsdp, fsdp_version 2)", "fsdp_wrap",
               "drop `fsdp_wrap`, or use strategy fsdp with `fsdp_version=2`")
        _check(layout.tp == 1 and layout.pp == 1 and layout.ep == 1 and not layout.hsdp, p,
               "torchtune's wrapping is planned for plain FSDP2 (its 0.3.x distributed recipes have no HSDP, "
               "tensor, pipeline or expert parallelism)", "fsdp_wrap", "drop `fsdp_wrap`, or `tp`, `pp`, `ep` and "
               "`hsdp`")
        _check(not model.tie_word_embeddings, p,
               f"torchtune's wrapping is planned for an untied output projection ({model.name} ties it to the "
               "input embedding)", "fsdp_wrap", "drop `fsdp_wrap`")
    if not layout.reshard_after_forward:
        _check(layout.strategy == "fsdp", p,
               "keeping gathered layers after forward is an FSDP option (strategy fsdp; ZeRO-3 always re-gathers)",
               "no_reshard")
    if job.base_dtype != "compute":
        _check(job.method == "lora", p, f"base_dtype {job.base_dtype} is the load dtype of a LoRA job's frozen base "
               f"(method {job.method}: {'the trained weights follow the precision' if job.method == 'full' else 'the base is quantized; its other weights follow the QLoRA recipe'})",
               "base_dtype", "drop `base_dtype`, or use `method=lora`")
        _check(job.precision.endswith("-mixed") and job.low_precision is None, p,
               f"base_dtype {job.base_dtype} needs a mixed precision (autocast or FSDP/ZeRO casting the fp32 base "
               f"to the compute dtype); precision is {job.precision_label}", "base_dtype",
               "use `precision=bf16-mixed`, or drop `base_dtype`")
        unsharded = layout.strategy in ("single", "ddp")
        if job.method == "lora" and unsharded and lora_wraps_experts(model, job.lora):
            p.append(Problem("base_dtype", f"base_dtype {job.base_dtype} with LoRA on {model.name}'s fused experts "
                             "(PEFT ParamWrapper) under autocast is not modelled (measured on CPU, it saves more "
                             "than ftplan can account for)", "target the attention/MLP linears only, e.g. "
                             f"`lora_targets={attention_targets(model)}`, or shard with fsdp / zero3"))
        _check(not (job.activation_offloading and unsharded), p,
               f"base_dtype {job.base_dtype} with activation offloading is not modelled", "base_dtype",
               "drop `activation_offloading` or `base_dtype`")
    if job.method == "qlora" and layout.strategy in ("zero3", "fsdp"):
        pass  # supported by accelerate/FSDP-QLoRA with bnb_4bit_quant_storage; modelled as sharded
    if job.torchao_nf4:
        p += _torchao_nf4_problems(model, job, layout)
    if p:
        raise ConfigError(problems=p)
