"""Per-GPU memory of a fine-tuning job: ``estimate_memory(model, job, layout) -> MemoryBreakdown``.

Pure functions, bytes everywhere. The model describes what the reference stack allocates:
transformers 5 modeling code, PEFT LoRA, bitsandbytes 4-bit (QLoRA) and 8-bit optimizers,
PyTorch autocast / fused AdamW as used by HF Trainer, DeepSpeed ZeRO and FSDP sharding rules.
Saved-activation terms are held exactly against autograd's saved tensors on CPU
(``tests/test_memory_vs_torch.py``); peaks on real GPUs are checked by ``ftplan validate``.

Phases. The peak is the larger of
  * forward/backward: weights + master copies + gradients + optimizer states (resident between
    steps) + saved activations + the largest transient of backward (logits/loss buffers, one
    recomputed layer under checkpointing, gathered ZeRO-3/FSDP layers, DDP buckets), and
  * optimizer step: weights + gradients + optimizer states + the step's temporaries.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .catalog.constants import MemoryConstants, memory_constants
from .job import (PRECISIONS, Job, Layout, attention_targets, lora_targets, lora_wraps_experts, planned_attention,
                  validate_job)
from .model import (FAMILIES, LAYER_INPUT_PROJECTIONS, AttentionSpec, GatedDeltaNetSpec, LayerGroup, LinearSpec,
                    MlpSpec, ModelSpec, MoeSpec, ShortConvSpec, layer_group_order, layer_linears, nope_layer_indices,
                    planned_as_note, unmodelled_dropout_note)
from .sharding import (TORCHTUNE_OUTPUT_CHUNKS, ActivationSchedule, MomentPeak, activation_job, casts_whole_module,
                       checkpointed_counts, communicator_groups, engine_compute, fsdp2_moment_peak, layout_memory,
                       quant_state_bytes)
from .torchao_nf4 import nf4_dequant_peak_bytes, nf4_tensor_bytes
from .units import dtype_bytes

__all__ = [
    "MemoryBreakdown",
    "ModelStates",
    "estimate_memory",
    "model_states",
    "saved_activation_bytes",
    "activation_parts",
    "ActivationParts",
    "checkpointed_layer_counts",
    "layer_linears",
    "moe_block_saved_bytes",
    "trainable_params",
    "COMPONENTS",
    "PEAK_PHASE_TEXT",
]

#: component names, in report order
COMPONENTS = (
    "cuda_context",
    "nccl_buffers",
    "frozen_weights",
    "trainable_weights",
    "master_weights",
    "gradients",
    "optimizer_states",
    "comm_buffers",
    "activations",
    "logits_and_loss",
    "transient",
    "stream_pools",
    "allocator_reserve",
)

#: MemoryBreakdown.peak_phase -> how reports name it
PEAK_PHASE_TEXT = {
    "forward_backward": "forward/backward",
    "forward_end": "end of the forward",
    "optimizer_step": "optimizer step",
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory of one job under one layout, in bytes."""

    components: dict[str, int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int  # reserved + CUDA context + NCCL communicators: what nvidia-smi shows
    host_bytes: int  # CPU RAM needed by offload (pinned optimizer states / params)
    params_total: int
    params_trainable: int
    peak_phase: str  # "forward_backward", "forward_end" (autocast's cache, accumulating) or "optimizer_step"
    notes: tuple[str, ...] = field(default=())
    #: every gradient of the step, where fewer are alive at the peak (``components["gradients"]``:
    #: full fine-tuning's loss-side backward moments); None: the component is all of them
    gradients_total_bytes: int | None = None

    @property
    def model_states_bytes(self) -> int:
        c = self.components
        grads = c["gradients"] if self.gradients_total_bytes is None else self.gradients_total_bytes
        return c["frozen_weights"] + c["trainable_weights"] + c["master_weights"] + grads + c["optimizer_states"]

    def fits(self, device_memory_bytes: int, margin: float = 0.0) -> bool:
        return self.device_total_bytes <= device_memory_bytes * (1.0 - margin)

    def headroom_bytes(self, device_memory_bytes: int) -> int:
        return device_memory_bytes - self.device_total_bytes


@dataclass(frozen=True)
class ModelStates:
    """Whole-model (unsharded) state sizes in bytes, before the layout divides them."""

    frozen_weights: int
    trainable_weights: int
    master_weights: int
    gradients: int
    optimizer_states: int
    params_total: int
    params_trainable: int
    n_trainable_tensors: int


# ---------------------------------------------------------------------------------------------
# trainable parameters
# ---------------------------------------------------------------------------------------------
def _lora_linears(model: ModelSpec, job: Job) -> list[LinearSpec]:
    targets = lora_targets(model, job.lora)
    return [lin for lin in model.linears() if lin.is_module and lin.module in targets]


def trainable_params(model: ModelSpec, job: Job) -> tuple[int, int]:
    """(trainable parameter count, number of trainable tensors) as PEFT/transformers build them."""
    if not job.uses_lora:
        n_tensors = _full_tensor_count(model)
        return model.params.total - _frozen_bias_elems(model), n_tensors
    mats = _lora_matrices(model, job)
    return sum(rows * cols * n for rows, cols, n in mats), sum(n for _, _, n in mats)


def _full_tensor_count(model: ModelSpec) -> int:
    n = 1  # embedding
    for lin in model.linears():
        if lin.is_module:
            n += lin.count * (2 if lin.bias else 1)
        else:  # fused experts: one 3-D tensor per layer, not per expert (+ one 2-D bias)
            n += lin.count // _experts_of(model) * (2 if lin.bias else 1)
    n += 2 if model.norm_bias else 1  # final norm (phimoe's LayerNorm: and its bias)
    for g in model.groups:
        if g.linear_attention is not None:  # conv1d weight, dt_bias, A_log, the gated norm
            n += g.count * (g.norms_per_layer + 4 + (1 if g.moe is not None else 0))  # (+ router)
            continue
        if g.short_conv is not None:  # LFM2: the Conv1d weight (and bias) (+ router)
            n += g.count * (g.norms_per_layer + (2 if g.short_conv.bias else 1) + (1 if g.moe is not None else 0))
            continue
        per = g.norms_per_layer * (2 if model.norm_bias else 1) + (2 if g.attention.qk_norm else 0)
        if g.attention.is_mla:
            per += 1 + (1 if g.attention.q_lora_rank else 0)
        if g.attention.sinks:
            per += 1
        if g.moe is not None and g.moe.router_is_module:
            per += 2  # gemma4: the router's scale and per_expert_scale (its Linear: above)
        elif g.moe is not None:
            per += 2 if g.moe.bias else 1  # router weight (and bias)
        n += g.count * per
    return n


def _frozen_bias_elems(model: ModelSpec) -> int:
    """Elements of the routers' frozen fp32 ``e_score_correction_bias`` Parameters
    (``MoeSpec.frozen_bias_param``, ernie4_5_moe): parameters that are never trained."""
    return sum(g.count * g.moe.num_experts for g in model.groups if g.moe is not None and g.moe.frozen_bias_param)


def _experts_of(model: ModelSpec) -> int:
    for g in model.groups:
        if g.moe is not None:
            return g.moe.num_experts
    return 1


# ---------------------------------------------------------------------------------------------
# model states
# ---------------------------------------------------------------------------------------------
def _fp32_router_elems(model: ModelSpec) -> int:
    """Router weight elements the family keeps in fp32 (MoeSpec.router_fp32)."""
    return sum(g.count * g.moe.num_experts * model.hidden_size
               for g in model.groups if g.moe is not None and g.moe.router_fp32)


def _optimizer_bytes(job: Job, n_params: int, n_tensors: int, param_bytes: Fraction,
                     model: ModelSpec, consts: MemoryConstants) -> Fraction:
    opt = job.optimizer
    if opt == "adamw":
        # exp_avg + exp_avg_sq in the parameter dtype, plus a fp32 'step' scalar per tensor
        return 2 * param_bytes * n_params + 4 * n_tensors
    if opt == "sgd":
        return param_bytes * n_params  # momentum buffer
    if opt in ("adamw_8bit", "paged_adamw_8bit"):
        # bitsandbytes: uint8 state1/state2 + one fp32 absmax per 256-block each; tensors smaller
        # than min_8bit_size keep fp32 states.
        block = consts.bnb_8bit_block_size
        small = big = blocks = 0
        for n_elem, count in _trainable_tensor_sizes(model, job):
            if n_elem < consts.bnb_8bit_min_size:
                small += n_elem * count
            else:
                big += n_elem * count
                blocks += -(-n_elem // block) * count
        # two uint8 states, one fp32 absmax per block each, and the two shared 256-entry fp32
        # quantization maps (qmap1/qmap2)
        return 2 * big + 8 * blocks + (2 * 256 * 4 if big else 0) + 8 * small
    if opt == "adafactor":
        # transformers' Adafactor (HF Trainer optim="adafactor"): factored second moment for
        # matrices (row + column vectors), full for vectors, no first moment (beta1=None), and a
        # 0-dim RMS tensor per parameter; all fp32 (it computes on an fp32 copy of the grad)
        return Fraction(4) * _adafactor_elems(model, job) + 4 * n_tensors
    raise AssertionError(opt)


def _trainable_tensor_sizes(model: ModelSpec, job: Job) -> list[tuple[int, int]]:
    """(elements per tensor, how many such tensors) of the trainable parameters."""
    if job.uses_lora:
        return [(rows * cols, n) for rows, cols, n in _lora_matrices(model, job)]
    return [(elems, n) for _, _, elems, n in _full_matrices(model)] + _full_vectors(model)


def _full_matrices(model: ModelSpec) -> list[tuple[int, int, int, int]]:
    """(Adafactor row-vector elements, column-vector elements, tensor elements, tensor count) of
    every weight matrix; fused experts (E, out, in) are one 3-D tensor per layer, factored over
    the last two dims per expert."""
    h = model.hidden_size
    out = [(model.vocab_size, h, model.vocab_size * h, 1)]
    for lin in model.linears():
        if lin.is_module:
            out.append((lin.out_features, lin.in_features, lin.out_features * lin.in_features, lin.count))
        else:
            e = _experts_of(model)
            out.append((e * lin.out_features, e * lin.in_features, e * lin.out_features * lin.in_features,
                        lin.count // e))
            if lin.bias:  # the experts' (E, out) bias: a matrix too
                out.append((e, lin.out_features, e * lin.out_features, lin.count // e))
    for g in model.groups:
        if g.moe is not None and not g.moe.router_is_module:
            out.append((g.moe.num_experts, h, g.moe.num_experts * h, g.count))
        if g.linear_attention is not None:
            # the depthwise conv weight (C, 1, K): Adafactor factors it over (C, 1) and (C, K)
            la = g.linear_attention
            out.append((la.conv_dim, la.conv_dim * la.conv_kernel, la.conv_dim * la.conv_kernel, g.count))
        if g.short_conv is not None:  # LFM2's depthwise conv weight (h, 1, K), as above
            k = g.short_conv.conv_kernel
            out.append((h, h * k, h * k, g.count))
    return out


def _lora_matrices(model: ModelSpec, job: Job) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of every LoRA adapter tensor PEFT creates (A and B per wrapped linear;
    ParamWrapper's flattened per-expert A/B for fused experts and the router)."""
    r = job.lora.r
    out = []
    for lin in _lora_linears(model, job):
        out.append((r, lin.in_features, lin.count))
        out.append((lin.out_features, r, lin.count))
    if lora_wraps_experts(model, job.lora):
        h = model.hidden_size
        for g in model.groups:
            if g.moe is not None:
                e, im = g.moe.num_experts, g.moe.expert_intermediate_size
                out += [(e * 2 * r, h, g.count), (2 * im, e * 2 * r, g.count),  # gate_up A, B
                        (e * r, im, g.count), (h, e * r, g.count),  # down A, B
                        (r, h, g.count), (e, r, g.count)]  # router A, B
    return out


def _full_vectors(model: ModelSpec) -> list[tuple[int, int]]:
    h = model.hidden_size
    nb = 2 if model.norm_bias else 1  # (phimoe's LayerNorms: a bias beside each weight)
    out = [(h, nb)]
    for lin in model.linears():
        if lin.bias and lin.is_module:
            out.append((lin.out_features, lin.count))
    for g in model.groups:
        a = g.attention
        out.append((h, g.count * g.norms_per_layer * nb))
        if g.linear_attention is not None:
            la = g.linear_attention
            out += [(la.num_v_heads, 2 * g.count), (la.v_head_dim, g.count)]  # dt_bias, A_log; norm
            continue
        if g.short_conv is not None:
            if g.short_conv.bias:
                out.append((h, g.count))  # the conv's bias
            continue
        if a.sinks:
            out.append((a.num_heads, g.count))
        if g.moe is not None and g.moe.bias:
            out.append((g.moe.num_experts, g.count))  # router bias
        if g.moe is not None and g.moe.router_is_module:  # gemma4's router scale, per_expert_scale
            out += [(h, g.count), (g.moe.num_experts, g.count)]
        if a.qk_norm:
            out += [(size, g.count) for size in a.qk_norm_sizes]
        if a.is_mla:
            out.append((a.kv_lora_rank, g.count))
            if a.q_lora_rank:
                out.append((a.q_lora_rank, g.count))
    return out


def _adafactor_elems(model: ModelSpec, job: Job) -> int:
    if job.uses_lora:
        mats = [(rows, cols, n) for rows, cols, n in _lora_matrices(model, job)]
        vecs: list[tuple[int, int]] = []
    else:
        mats = [(rows, cols, n) for rows, cols, _, n in _full_matrices(model)]
        vecs = _full_vectors(model)
    return sum((r + c) * n for r, c, n in mats) + sum(e * n for e, n in vecs)


def _qlora_frozen_bytes(model: ModelSpec, job: Job) -> tuple[Fraction, Fraction]:
    """(quantized bytes incl. constants, bytes of the parameters bitsandbytes leaves alone)."""
    skip = set(job.quant.skip_modules)
    quantized = sum(lin.count * lin.in_features * lin.out_features for lin in model.linears()
                    if lin.is_module and lin.module not in skip)
    if job.torchao_nf4:
        # torchtune's QLoRA: every decoder-layer linear an NF4Tensor (codes, int8 block scalers,
        # compute-dtype factors and tables: torchao_nf4.nf4_tensor_bytes), the rest in its dtype
        c = int(dtype_bytes(job.quant.compute_dtype))
        quant_bytes = Fraction(sum(lin.count * nf4_tensor_bytes(lin.in_features * lin.out_features, c)
                                   for lin in model.linears() if lin.is_module and lin.module not in skip))
        return quant_bytes, Fraction(model.params.total - quantized)
    consts = quant_state_bytes(model, job)
    quant_bytes = Fraction(quantized, 2) + consts
    # biases of quantized layers stay in the compute dtype
    unquantized = model.params.total - quantized
    return quant_bytes, Fraction(unquantized)


def _nf4_dequant_bytes(model: ModelSpec, job: Job, compiled: bool) -> int:
    """torchtune's QLoRA (``quant_type="torchao-nf4"``): what torchao's ``linear_nf4`` allocates to
    dequantize its weight, at each call in the forward and again in the backward
    (``torchao_nf4.nf4_dequant_peak_bytes``: 8 n + 3 c n + c n / 64 for an n-element weight, 14 n
    in bf16, against the 2 n of the weight itself); the largest quantized linear of a layer sets
    it. Autograd keeps no activation for it (only the ``NF4Tensor``), so the QLoRA layer saves
    what a LoRA layer on a compute-dtype base saves. In backward it comes on top of the layer's
    recomputed saved tensors (checkpointing) or of everything still saved; held on CPU in
    ``tests/test_torchao_nf4_qlora.py``. Compiled (``compiled``: the job's ``torch_compile``,
    torchtune's ``compile_model``) inductor fuses the dequantize into one kernel that writes only
    the c n weight (measured on CPU, ``benchmarks/torchao_nf4_grid_cpu.py``). 0 for other jobs."""
    if not job.torchao_nf4:
        return 0
    skip = set(job.quant.skip_modules)
    c = int(dtype_bytes(job.quant.compute_dtype))
    return max((c * lin.in_features * lin.out_features if compiled
                else nf4_dequant_peak_bytes(lin.in_features * lin.out_features, c)
                for lin in model.linears() if lin.is_module and lin.module not in skip), default=0)


def _autocast_weight_elems(model: ModelSpec, backend: str = "cuda") -> int:
    """Weights autocast copies to the compute dtype and keeps for backward: every matmul weight
    (nn.Linear weights without biases, MoE routers, the lm_head or the tied embedding). On CUDA the
    grouped_mm experts are autocast too; on CPU they run in fp32."""
    n = 0
    bmm = _bmm_experts(model)
    for lin in model.linears():
        if lin.is_module or backend == "cuda" or bmm:
            n += lin.count * lin.in_features * lin.out_features
    # router weights (autocast casts a router's bias too, but the linear's backward does not keep it)
    n += sum(g.count * g.moe.num_experts * model.hidden_size for g in model.groups
             if g.moe is not None and not g.moe.router_is_module  # (gemma4's router.proj: a linear)
             and g.moe.router_autocast)
    if model.tie_word_embeddings:
        n += model.params.embedding
    return n


def _bmm_experts(model: ModelSpec) -> bool:
    """The routed experts run as ``torch.bmm`` (Llama 4's dense dispatch), which autocast covers
    on CPU too (grouped_mm experts run in their weights' dtype on CPU)."""
    return any(g.moe is not None and g.moe.dense_dispatch for g in model.groups)


def _first_layer_frozen_a(model: ModelSpec, job: Job) -> int:
    """lora_A elements of the first layer's projections that read the (grad-free) layer input."""
    if not job.uses_lora:
        return 0
    targets = lora_targets(model, job.lora)
    return sum(job.lora.r * lin.in_features for lin in layer_linears(model, model.groups[0])
               if lin.module in _layer_input_modules(model) and lin.module in targets)


def _autocast_recompute(job: Job, layout: Layout) -> bool:
    """Autocast copies follow checkpointing (single GPU / DDP under HF Trainer); ZeRO and FSDP
    keep their own compute-dtype working copy of the weights instead."""
    return (job.ac_mode != "none" and job.precision.endswith("-mixed")
            and not (layout.shards_params or layout.shards_optimizer))


def _uncheckpointed_layer_elems(model: ModelSpec, job: Job, per_layer) -> int:
    """Sum of ``per_layer(group)`` over the decoder layers that are not checkpointed."""
    counts = _checkpointed_counts(model, job)
    return sum((g.count - n) * per_layer(g) for g, n in zip(model.groups, counts))


def _layer_matmul_weight_elems(model: ModelSpec, g: LayerGroup) -> int:
    """Matmul weights of one decoder layer autocast copies (projections, router; grouped_mm experts
    on CUDA)."""
    n = sum(lin.in_features * lin.out_features for lin in layer_linears(model, g))
    if g.moe is not None:
        m = g.moe
        # (gemma4: in the linears; ernie4_5_moe's fp32 router runs outside autocast)
        n += (0 if m.router_is_module or not m.router_autocast else m.num_experts * model.hidden_size)
        n += m.num_experts * 3 * model.hidden_size * m.expert_intermediate_size
    return n


def _layer_adapter_elems(model: ModelSpec, job: Job, g: LayerGroup) -> int:
    """LoRA adapter elements of one decoder layer."""
    targets = lora_targets(model, job.lora)
    r = job.lora.r
    n = sum(r * (lin.in_features + lin.out_features) for lin in layer_linears(model, g)
            if lin.is_module and lin.module in targets)
    if g.moe is not None and lora_wraps_experts(model, job.lora):
        h, e, im = model.hidden_size, g.moe.num_experts, g.moe.expert_intermediate_size
        n += e * 2 * r * h + 2 * im * e * 2 * r + e * r * im + h * e * r + r * h + e * r
    return n


def _head_copy_elems(model: ModelSpec, job: Job) -> int:
    """Elements of the lm_head (or tied embedding) weight autocast copies and keeps for backward:
    only transformers' own loss path runs lm_head as an autocast matmul; TRL's fused head and
    Liger cast tile by tile inside their autograd functions and keep nothing."""
    if not job.materialises_logits:
        return 0
    # (phimoe's lm_head bias: autocast casts it too, but the linear's backward does not keep it)
    bias = model.vocab_size if model.lm_head_bias and not model.tie_word_embeddings else 0
    return model.params.lm_head - bias + (model.params.embedding if model.tie_word_embeddings else 0)


def _frozen_layer_copy_elems(model: ModelSpec, g: LayerGroup, backend: str) -> int:
    """Matmul weights of one decoder layer that autocast casts when the LoRA base is loaded in fp32
    (``Job.base_dtype="fp32"``): the projections and the router (frozen, so autocast's cache skips
    them and each matmul saves its own copy for the input's gradient); not the grouped_mm
    experts, which autocast does not cover (no autocast kernel for ``torch._grouped_mm``, CPU or
    CUDA): they run in fp32."""
    n = _layer_matmul_weight_elems(model, g)
    if g.moe is not None and not g.moe.dense_dispatch:
        n -= g.moe.num_experts * 3 * model.hidden_size * g.moe.expert_intermediate_size
    return n


def _frozen_copy_elems(model: ModelSpec, job: Job, g: LayerGroup, backend: str) -> int:
    """Frozen matmul weight elements of one layer that autocast copies and the matmul saves (for
    the input's gradient): every matmul weight of an fp32-loaded LoRA base; under PEFT's QLoRA
    recipe the fp32 router of an MoE layer whose router PEFT does not wrap (gpt_oss: the linears
    are 4-bit, the upcast router is not)."""
    if job.casts_fp32_base:
        return _frozen_layer_copy_elems(model, g, backend)
    if (job.method == "qlora" and job.kbit_upcast and job.precision.endswith("-mixed")
            and PRECISIONS[job.precision]["compute"] != "fp32" and g.moe is not None
            and not g.moe.router_is_module  # (gemma4's router.proj is a 4-bit Linear)
            and g.moe.router_autocast
            and not (job.uses_lora and lora_wraps_experts(model, job.lora))):
        m = g.moe
        # (Llama 4: its 3-D experts are no Linear4bit either; upcast to fp32, their bmm keeps
        # autocast's compute-dtype copies for the input's gradient)
        experts = m.num_experts * 3 * model.hidden_size * m.expert_intermediate_size if m.dense_dispatch else 0
        return m.num_experts * model.hidden_size + experts
    return 0


def _recompute_weight_copy_bytes(model: ModelSpec, job: Job, layout: Layout, backend: str = "cuda") -> int:
    """Under checkpointing with autocast, the compute-dtype weight copies of the one layer being
    recomputed in backward (all matmul weights in full fine-tuning, the adapters with LoRA, and
    the frozen base's matmul weights when it is loaded in fp32)."""
    prec = PRECISIONS[job.precision]
    if not _autocast_recompute(job, layout):
        return 0
    c = int(dtype_bytes(prec["compute"]))
    if job.method == "full":
        return c * largest_layer_params(model) if prec["trainable"] != prec["compute"] else 0
    base = c * max(_frozen_copy_elems(model, job, g, backend) for g in model.groups)
    if job.adapter_dtype == prec["compute"]:
        return base  # adapters already in the compute dtype: autocast makes no copy
    n_train, _ = trainable_params(model, job)
    return base + c * -(-n_train // model.num_layers)


def _lora_recompute_working_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, t: int, tp: int) -> int:
    """What the recompute of a checkpointed dense layer of group ``g`` holds at its peak beyond
    the layer's saved tensors and weight copies: the recompute of the MLP down projection's LoRA
    branch (PEFT ``lora.Linear.forward``) under autocast, with PEFT's fp32 adapters.

    At that moment the layer's forward is still running (non-reentrant checkpointing stops the
    recompute only after the last saved tensor is remade), so beside the saved set there are: the
    down projection's input (the MLP product, which the frozen base linear does not save), PEFT's
    cast of it to the adapter dtype (``x.to(lora_A.weight.dtype)``: fp32) and, with dropout, the
    dropout's output; five hidden-wide compute-dtype tensors (the gradient arriving at the layer,
    the residual after attention, the two norm outputs the layer's locals still reference, the
    base linear's output); and the loss scalar and its gradient (8 bytes).

    Measured on CPU (``measure_loss_peak`` with a vocabulary too small for the loss to set the
    peak: ``benchmarks/measurements/layer_recompute_cpu.json``,
    ``tests/test_loss_peak_vs_torch.py::test_layer_recompute_record``): exact for llama, mistral,
    qwen2, qwen3 and phi3 (bf16 or fp32 base, no dropout; the rank does not enter; phi3's saved v
    keeps its fused qkv output, :func:`_kv_saved`); gemma3 holds up to 2 x tokens x hidden bytes
    more; with dropout the CPU run holds
    8 x tokens x r bytes less. Only LoRA on a dense MLP's down projection under autocast
    (what was measured); MoE layers and pure bf16 are not modelled (0). A frozen down projection
    (attention-only LoRA) leaves the product and the five hidden-wide tensors: read off the H100
    row of llama-3.2-3b with q_proj/v_proj LoRA (``h100-sxm-holdout2.jsonl``, -5.1 % without it).

    QLoRA (PEFT's bitsandbytes layer, no cast under autocast): the product and the dropout's
    output in Linear4bit's output dtype (fp32 after ``prepare_model_for_kbit_training``) and the
    same five hidden-wide tensors. From the CUDA peak anatomy of llama-3.1-8b QLoRA at 4 x 2048
    tokens on an H100 (``benchmarks/measurements/h100-sxm-peak-anatomy.json``: the fp32 MLP
    product and the down projection's fp32 dropout output alive at the peak, in the last layer's
    recompute) and held against the QLoRA rows of the H100 campaigns (``ftplan validate``); not
    exact on CPU, where the down projection's backward (its dequantized weight) sets the peak of
    the tiny models instead."""
    if not (job.uses_lora and dt.autocast and g.mlp is not None and g.moe is None):
        return 0
    i = g.mlp.intermediate_size // tp
    if not _lora_on(model, job, g.mlp.names[2]):
        # a frozen down projection: the product it does not save and the hidden-wide tensors
        return t * i * dt.base_out + 5 * t * model.hidden_size * dt.compute + 8
    if job.method == "qlora":
        # bitsandbytes' LoRA layer (peft/tuners/lora/bnb.py) makes no cast under autocast; the MLP
        # product is in Linear4bit's output dtype (the input's: fp32 after
        # prepare_model_for_kbit_training), and so is the dropout's output
        cast = 0
        dropout = dt.base_out if job.lora.dropout > 0 else 0
    else:
        if job.adapter_dtype != "fp32":
            return 0
        a = int(dtype_bytes(job.adapter_dtype))
        cast = a if a != dt.base_out else 0
        dropout = a if job.lora.dropout > 0 else 0
    return t * i * (dt.base_out + cast + dropout) + 5 * t * model.hidden_size * dt.compute + 8


#: bytes per element of a layer's ``(b, heads, s, s)`` attention scores that eager attention's
#: backward holds beyond the two saved copies of the softmax output (fp32, and its compute-dtype
#: cast) ftplan counts with the layer's saved tensors. CUDA: 10, from the peak anatomy of three
#: llama-3.2-1b runs on an H100 (``benchmarks/measurements/h100-sxm-peak-anatomy2.json``: two fp32
#: and two bf16 score-sized gradients beside the saved fp32 softmax, 16 bytes per element in all);
#: CPU: 6, measured with ``ftplan.measure.loss_peak.measure_loss_peak(attn_impl="eager")``
#: (``tests/test_loss_peak_vs_torch.py::test_eager_attention_backward_on_cpu``).
EAGER_BACKWARD_BYTES_PER_SCORE = {"cuda": 10, "cpu": 6}


def _eager_attention_backward_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int,
                                    backend: str) -> int:
    """What the backward of one layer's eager attention holds beyond the layer's saved tensors:
    score-sized gradients (``EAGER_BACKWARD_BYTES_PER_SCORE`` per element of the ``(b, heads, s,
    s)`` scores), less the MLP's saved tensors, which that layer's backward has freed by then (the
    MLP runs after attention, so its backward runs first). 0 for attention kernels that never
    materialise the scores (sdpa, flash) and for layers without attention."""
    a = g.attention
    if job.attn_impl != "eager" or a is None:
        return 0
    b, s = _batch_shape(job)
    heads = a.num_heads // tp
    per_score = EAGER_BACKWARD_BYTES_PER_SCORE["cpu" if backend == "cpu" else "cuda"]
    if a.sinks:
        # gpt_oss: the constant's gradients are those of llama's fp32 softmax; here they take the
        # joined logits' dtype (bf16 on a bf16 base). The row max subtracted before the softmax
        # adds one: its backward scatters into a zero-filled (b, heads, s, s + 1) gradient.
        # Held on CPU (tests/test_loss_peak_vs_torch.py::test_gpt_oss_eager_backward_on_cpu)
        comb = max(dt.compute, dt.train_w if dt.full else dt.resid)
        scores = b * heads * s * s * per_score * comb // 4 + b * heads * s * (s + 1) * comb
    else:
        scores = b * heads * s * s * per_score
    t = job.micro_batch * job.seq_len
    freed = _mlp_saved(g.mlp, t, model.hidden_size, dt, tp, g.norms_per_layer == 4) if g.mlp is not None else 0
    return max(0, scores - freed)


def _autocast_cache_bytes(model: ModelSpec, job: Job, layout: Layout) -> int:
    """Under checkpointing with autocast, the compute-dtype copies of the checkpointed layers'
    trainable weights that autocast's cache holds from the layer's forward until the forward ends
    (``torch.autocast`` caches the cast of every leaf tensor that requires grad and clears the
    cache when the outermost autocast region exits, after the loss): all matmul weights in full
    fine-tuning, the fp32 adapters with LoRA. Nothing saves them, so backward no longer holds them
    (it remakes one layer's at a time); the layers that are not checkpointed keep theirs for
    backward (counted with the weights). Held on CPU: tests/test_loss_peak_vs_torch.py."""
    if not _autocast_recompute(job, layout):
        return 0
    prec = PRECISIONS[job.precision]
    c = int(dtype_bytes(prec["compute"]))
    ep = max(1, getattr(layout, "ep", 1))
    counts = _checkpointed_counts(model, job)
    if job.method == "full":
        if prec["trainable"] == prec["compute"]:
            return 0

        def per_layer(g: LayerGroup) -> int:
            n = _layer_matmul_weight_elems(model, g)
            if g.moe is not None and ep > 1:  # a rank holds num_experts / ep of them
                m = g.moe
                n -= (m.num_experts - m.num_experts // ep) * 3 * model.hidden_size * m.expert_intermediate_size
            return n
    else:
        if job.adapter_dtype == prec["compute"]:
            return 0

        def per_layer(g: LayerGroup) -> int:
            return _layer_adapter_elems(model, job, g)
    if job.low_precision:
        from . import lowprec

        r = lowprec.get_recipe(job.low_precision)
        if r is None or not r.is_torchao_float8:
            return 0  # the other recipes' linears cast their weights themselves (Transformer Engine, frozen FP8)
        inner = per_layer
        if job.method == "full":
            # torchao float8 casts its converted weights itself: only the unconverted ones are cached
            m = r.min_dim_multiple

            def per_layer(g: LayerGroup) -> int:
                return inner(g) - sum(lin.in_features * lin.out_features for lin in layer_linears(model, g)
                                      if lin.in_features % m == 0 and lin.out_features % m == 0)
        else:
            converted = lowprec.converted_adapter_elems(model, job, lora_targets(model, job.lora))

            def per_layer(g: LayerGroup) -> int:
                return max(0, inner(g) - converted // model.num_layers)
    elems = sum(n * per_layer(g) for g, n in zip(model.groups, counts))
    return c * elems // (layout.tp * layout.pp)


def model_states(model: ModelSpec, job: Job, consts: MemoryConstants | None = None) -> ModelStates:
    consts = consts or memory_constants()
    prec = PRECISIONS[job.precision]
    total = model.params.total
    n_train, n_tensors = trainable_params(model, job)
    if job.method == "full":
        train_dtype = prec["trainable"]
        trainable_w = dtype_bytes(train_dtype) * n_train
        frozen_w = Fraction(0)
        mixed = prec["compute"] != train_dtype
        # autocast keeps a compute-dtype copy of every weight it casts; ZeRO/FSDP keep a bf16
        # working copy next to the fp32 master: same bytes, different owner (see estimate_memory)
        elems = _autocast_weight_elems(model) - (0 if job.materialises_logits else _head_copy_elems(
            model, job.with_(loss="hf")))
        master = dtype_bytes(prec["compute"]) * elems if mixed else Fraction(0)
        grad_b = dtype_bytes(prec["grad"])
        param_b = dtype_bytes(train_dtype)
    else:
        # PEFT keeps adapters in fp32 (autocast_adapter_dtype=True) whatever the base dtype; TRL's
        # QLoRA recipe casts them to the compute dtype (job.adapter_dtype)
        adapter_b = dtype_bytes(job.adapter_dtype)
        trainable_w = adapter_b * n_train
        # autocast's compute-dtype copies of the fp32 adapters, kept for backward (under
        # checkpointing one layer's worth at a time, counted with the recompute transient);
        # lora_A of the first layer's q/k/v reads a grad-free input, so its copy is not kept
        if job.ac_mode == "none":
            copies = n_train - _first_layer_frozen_a(model, job)
        else:  # only the layers that are not checkpointed (every-k) keep theirs
            copies = _uncheckpointed_layer_elems(model, job, lambda g: _layer_adapter_elems(model, job, g))
        master = dtype_bytes(prec["compute"]) * copies if prec["compute"] != job.adapter_dtype and \
            job.precision.endswith("-mixed") else Fraction(0)
        grad_b = adapter_b
        param_b = adapter_b
        if job.method == "lora":
            frozen_w = dtype_bytes(job.frozen_dtype) * total
        else:
            quant_bytes, unq = _qlora_frozen_bytes(model, job)
            # prepare_model_for_kbit_training upcasts every non-quantized weight to fp32 (PEFT's
            # recipe); TRL's leaves them in the load dtype
            frozen_w = quant_bytes + dtype_bytes(job.unquantized_dtype) * unq
    grads = grad_b * n_train
    opt = _optimizer_bytes(job, n_train, n_tensors, param_b, model, consts)
    # an fp32 router weight (transformers >= 5.24, deepseek_v3) in a narrower model: its weight,
    # and when trained its gradient and (AdamW/SGD) states, take 4 bytes per element
    fp32_router = _fp32_router_elems(model)
    if fp32_router:
        if job.method == "full":
            wide = 4 - param_b
            trainable_w += wide * fp32_router
            grads += (4 - grad_b) * fp32_router
            if job.optimizer in ("adamw", "sgd"):
                opt += (2 if job.optimizer == "adamw" else 1) * wide * fp32_router
        elif job.method == "lora":
            frozen_w += (4 - dtype_bytes(job.frozen_dtype)) * fp32_router
        else:  # not a Linear: bitsandbytes leaves it unquantized, in fp32 from 5.24 on
            frozen_w += (4 - dtype_bytes(job.unquantized_dtype)) * fp32_router
    frozen_bias = _frozen_bias_elems(model)
    if frozen_bias:  # (ernie4_5_moe) frozen, fp32 whatever the model's dtype
        if job.method == "full":
            frozen_w += 4 * frozen_bias
        else:
            frozen_w += (4 - dtype_bytes(job.frozen_dtype if job.method == "lora" else job.unquantized_dtype)) \
                * frozen_bias
    if job.low_precision:
        frozen_w, master = _lowprec_states(model, job, frozen_w, master)
    return ModelStates(
        frozen_weights=math.ceil(frozen_w),
        trainable_weights=math.ceil(trainable_w),
        master_weights=math.ceil(master),
        gradients=math.ceil(grads),
        optimizer_states=math.ceil(opt),
        params_total=total,
        params_trainable=n_train,
        n_trainable_tensors=n_tensors,
    )


# ---------------------------------------------------------------------------------------------
# activations
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Dtypes:
    compute: int  # bytes of the matmul dtype (autocast or model dtype)
    resid: int  # bytes of the residual stream (dtype of the embedding output)
    train_w: int  # bytes of trainable weights (0 when the base is frozen)
    norm_out: int  # bytes of a norm's output (weight dtype promoted with the stream dtype)
    full: bool  # base weights trainable
    expert: int  # bytes of routed-expert activations (grouped_mm)
    autocast: bool = False  # mixed precision: matmuls run under torch.autocast
    base_out: int = 2  # bytes of a frozen base linear's output (bitsandbytes 4-bit: the input dtype)
    #: the engine's compute-dtype weights (sharding.engine_compute): "autocast" (FSDP under
    #: accelerate's autocast), "cast" (DeepSpeed's bf16 mode), "" (the job's own weights)
    engine_compute: str = ""
    #: DeepSpeed ZeRO-3 replaces ``F.linear`` with its ``LinearFunctionForZeroStage3``
    #: (``memory_efficient_linear``, on by default), which saves the input of every linear,
    #: frozen ones included (a frozen ``nn.Linear`` otherwise saves only its weight): the lm_head
    #: and routers; ``frozen_linears_save_input`` also the decoder layers' base linears (not
    #: bitsandbytes' 4-bit ones, which do not call ``F.linear``)
    linear_saves_input: bool = False
    frozen_linears_save_input: bool = False
    #: PEFT's wrapped (ParamWrapper) router: bytes of the adapter copies its delta weight saves
    #: per MoE layer (``get_delta_weight`` upcasts bf16 adapters on CPU)
    router_delta_copy: int = 0
    #: FSDP2's ``MixedPrecisionPolicy(cast_forward_inputs=True)`` (accelerate's): every decoder
    #: layer unit casts its floating-point inputs to ``param_dtype`` in its pre-forward hook
    casts_layer_inputs: bool = False


def _act_dtypes(job: Job, backend: str, engine_compute: str = "") -> _Dtypes:
    prec = PRECISIONS[job.precision]
    compute = int(dtype_bytes(prec["compute"]))
    if job.method == "full":
        w = int(dtype_bytes(prec["trainable"]))
        resid = w
        norm_w = w
    elif job.method == "lora":
        resid = norm_w = int(dtype_bytes(job.frozen_dtype))
        w = 0
    else:  # qlora: prepare_model_for_kbit_training upcasts embedding and norms to fp32 (TRL's
        # recipe leaves them in the load dtype)
        resid = norm_w = int(dtype_bytes(job.unquantized_dtype))
        w = 0
        compute = int(dtype_bytes(job.quant.compute_dtype))
    # transformers' grouped_mm experts run in their weights' dtype: ``torch._grouped_mm`` has no
    # autocast kernel, on CPU or CUDA (torch 2.13's dispatcher; pytorch#174763), and transformers
    # casts the input to the weight's dtype (integrations/moe.py ``_grouped_mm``, 5.24). LoRA's
    # frozen experts are in the base's load dtype, QLoRA's unquantized ones in the recipe's
    # (fp32 under PEFT's prepare_model_for_kbit_training), on CUDA as on CPU; full fine-tuning
    # under autocast runs its fp32 master experts in fp32 (torch's non-bf16 grouped_mm fallback,
    # a loop of mm, on CUDA)
    expert = w or resid
    norm_out = max(norm_w, resid)
    # bitsandbytes' Linear4bit casts its output back to its input's dtype (fp32 after
    # prepare_model_for_kbit_training); other linears produce the compute dtype
    base_out = norm_out if job.method == "qlora" else compute
    return _Dtypes(compute=compute, resid=resid, train_w=w, norm_out=norm_out,
                   full=job.method == "full", expert=expert, autocast=job.precision.endswith("-mixed"),
                   base_out=base_out, engine_compute=engine_compute)


def _norm_style(model: ModelSpec) -> str:
    """The family's RMSNorm implementation (``Family.norm_style``): llama, gemma or gpt_oss."""
    return FAMILIES[model.family].norm_style


def _norm_saved(t: int, width: int, in_bytes: int, trainable: bool, *, rows: int | None = None,
                style: str = "llama", weight: int | None = None, weight_bytes: int = 4,
                autocast: bool = False) -> int:
    """Bytes one RMSNorm call saves over ``t`` tokens of ``width`` features (``rows`` rsqrt
    values: ``t``, or ``t`` x heads for per-head q/k norms).

    llama style (``x.float()``, ``x * rsqrt(mean(x^2) + eps)``, cast back, ``weight * x``): the
    fp32 input (a fresh copy unless it already is fp32), the fp32 rsqrt, and, when the weight is
    trainable, the normalised tensor cast back to the input dtype. gemma style computes entirely
    in fp32 and scales by ``1 + weight``: the normalised tensor stays fp32 and the fp32
    ``1 + weight`` vector (``weight`` elements: ``width``, or the head dim) is saved too. gpt_oss
    style is fp32 throughout as well (``(weight * x_normed).to(input_dtype)``) but multiplies by the
    weight itself (type promotion inside the product: no copy of it to save)."""
    rows = t if rows is None else rows
    if style == "layernorm":
        # nn.LayerNorm (phimoe): native_layer_norm keeps its input, the mean and rstd (in the
        # input's dtype on CPU, where autocast leaves layer_norm alone), and the weight and bias it
        # reads. ``autocast``: CUDA's autocast runs layer_norm in fp32 (its fp32 policy): an fp32
        # copy of a narrower input, fp32 mean and rstd, fp32 copies of non-fp32 weight and bias
        # (the frozen bf16 norms of LoRA) -- from the policy, not measured (no CUDA here)
        x = 4 if autocast else in_bytes
        return t * width * x + 2 * rows * (4 if autocast else in_bytes) + (
            2 * width * 4 if autocast and weight_bytes != 4 else 0)
    out = t * width * 4 + rows * 4
    if style == "gemma4":
        # ``x * pow(mean(x^2) + eps, -0.5)``: pow saves its input and the product its result (two
        # fp32 values per row); ``* weight.float()`` saves the fp32 weight (a copy unless the
        # weight is fp32: ``weight_bytes``, see _norm_weight_bytes) and, with a trainable weight,
        # the normalised tensor. ``weight=0``: the weightless v norm (``with_scale=False``)
        out += rows * 4
        if weight != 0:
            out += (t * width * 4 if trainable else 0) + ((width if weight is None else weight) * 4
                                                          if weight_bytes != 4 else 0)
    elif style == "gemma":
        out += (width if weight is None else weight) * 4 + (t * width * 4 if trainable else 0)
    elif style == "gpt_oss":
        out += t * width * 4 if trainable else 0
    elif style == "cohere":
        # Cohere2LayerNorm: ``x - mean`` twice (pow(2) keeps the first, the product the second),
        # the fp32 rsqrt; ``weight.float() * x_normed`` keeps the normalised tensor (trainable
        # weight) and the fp32 weight (a copy where the weight is not fp32: ``weight_bytes``)
        out = 2 * t * width * 4 + rows * 4 + (t * width * 4 if trainable else 0)
        out += (width if weight is None else weight) * 4 if weight_bytes != 4 else 0
    elif trainable:
        out += t * width * in_bytes
    return out


def _norm_weight_bytes(dt: _Dtypes) -> int:
    """Bytes per element of the RMSNorm weights as the norm reads them, for gemma4's fp32 copy of
    a non-fp32 weight: the frozen dtype; a trainable weight gathered by FSDP / ZeRO-3 in the
    compute dtype. A trainable parameter on one device: 4, its copy is a cast of a parameter
    (counted with the weight copies, not as an activation)."""
    if dt.full:
        return dt.compute if dt.engine_compute else 4
    return dt.resid


def _dropout_mask_bytes(in_bytes: int, backend: str) -> int:
    """Bytes per element of the mask a training-mode ``F.dropout`` keeps: a bool mask on CUDA
    (``native_dropout``), a scaled mask in the input's dtype on CPU."""
    return 1 if backend == "cuda" else in_bytes


def _linear_inputs(t: int, width: int, n_consumers: int, in_bytes: int, dt: _Dtypes) -> int:
    """Inputs saved by ``n_consumers`` trainable linears reading one tensor of ``in_bytes``:
    autocast makes one copy per linear when the input is not in the compute dtype."""
    if not dt.full or n_consumers == 0:
        return 0
    return (n_consumers if in_bytes != dt.compute else 1) * t * width * dt.compute


def _layer_saved_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int,
                       backend: str, ep: int = 1, ep_rows: int | None = None) -> int:
    """Bytes autograd saves for one decoder layer of group ``g`` for one micro-batch."""
    if _compiled(g, model, job, dt):
        return _compiled_layer_saved_bytes(g, model, job, dt, tp, backend)
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    a = g.attention
    c = dt.compute
    heads = a.num_heads // tp if a is not None else 0
    style = _norm_style(model)
    ln_fp32 = style == "layernorm" and dt.autocast and backend == "cuda"
    if ln_fp32:  # (phimoe) CUDA autocast's layer_norm returns fp32
        dt = dataclasses.replace(dt, norm_out=4)
    nw = _norm_weight_bytes(dt)  # gemma4's norms save an fp32 copy of a non-fp32 frozen weight
    if FAMILIES[model.family].post_norms:
        # olmo2: no input norm; the post-attention and post-feed-forward norms read o_proj's and
        # down_proj's outputs (compute dtype)
        total = 2 * _norm_saved(t, h, c, dt.full, style=style)
    else:
        total = _norm_saved(t, h, dt.resid, dt.full, style=style, weight_bytes=nw, autocast=ln_fp32)  # input norm
        if g.norms_per_layer >= 4:  # gemma: post-attention norm (on o_proj output) and pre/post feed-forward
            total += (2 * _norm_saved(t, h, c, dt.full, style=style, weight_bytes=nw)
                      + _norm_saved(t, h, dt.resid, dt.full, style=style, weight_bytes=nw))
        elif not FAMILIES[model.family].parallel_block:  # (cohere2: one norm per layer)
            total += _norm_saved(t, h, dt.resid, dt.full, style=style, weight_bytes=nw if style == "layernorm" else 4,
                                 autocast=ln_fp32)  # post-attention norm
    masked = _masked(g, job, s)
    if g.linear_attention is not None:
        total += _gdn_saved(g.linear_attention, b, s, h, dt, job, tp)
    elif g.short_conv is not None:
        total += _short_conv_saved(g.short_conv, b, s, h, dt, tp)
    elif a.is_mla:
        total += _mla_saved(a, t, b, s, h, dt, heads, backend, job.attn_impl, masked=masked)
        if a.query_pos_scale:
            total += _query_pos_scale_saved(b, s, dt, job)
    else:
        q = heads * a.head_dim
        kv_heads = max(1, a.num_kv_heads // tp)
        n_qkv = 1 if a.fused_qkv else (2 if a.k_eq_v else 3)  # gemma4 k_eq_v: no v_proj
        total += _linear_inputs(t, h, n_qkv, dt.norm_out if dt.full else dt.resid, dt)
        total += _llama4_attention_extras(a, b, s, heads, kv_heads)
        if a.rope and FAMILIES[model.family].rope_interleave_tables:
            # ernie4_5: the layer's interleaved copies of the fp32 cos/sin (bf16 where FSDP2 cast the
            # tables at the layer's input), ``(1, 1, s, d)`` each, which the rotary muls save
            # (glm4: the tables in the residual stream's dtype, over the partial rotary's features)
            width = a.head_dim if a.rotary_dim is None else _rope_table_width(a.rotary_dim)
            total += 2 * s * width * (c if dt.casts_layer_inputs else 4 if FAMILIES[model.family].fp32_rope else dt.resid)
        if a.qk_norm and a.qk_norm_whole:  # olmo2: one norm over each whole projection
            total += _norm_saved(t, q, c, dt.full, style=style) + _norm_saved(t, kv_heads * a.head_dim, c, dt.full,
                                                                               style=style)
        elif a.qk_norm:  # per-head norms on the q/k projections (compute dtype)
            # (hunyuan_v1_dense: after the rope, on q/k in its output dtype: the projections'
            # promoted by the residual stream's cos/sin)
            qn = max(dt.base_out, dt.resid) if a.rope and FAMILIES[model.family].qk_norm_after_rope else c
            total += _norm_saved(t, q, qn, dt.full, rows=t * heads, style=style, weight=a.head_dim,
                                 weight_bytes=nw)
            total += _norm_saved(t, kv_heads * a.head_dim, qn, dt.full, rows=t * kv_heads, style=style,
                                 weight=a.head_dim, weight_bytes=nw)
        if a.v_norm:  # gemma4's weightless norm on v
            total += _norm_saved(t, kv_heads * a.head_dim, c, False, rows=t * kv_heads, style=style, weight=0)
            if a.k_eq_v and dt.base_out == 4:
                # v is k_proj's output: fp32 already (bitsandbytes under PEFT's kbit upcast), so
                # k_norm's and v_norm's ``.float()`` are that one storage
                total -= t * kv_heads * a.head_dim * 4
        if job.attn_impl == "eager" and a.sinks:
            total += t * q * c + _kv_saved(a, model, dt, b, s, heads, kv_heads, _kv_kernel(g, job, s))
            # gpt_oss: the scores joined with the sink logits (torch.cat promotes to the sinks'
            # dtype), the row max's int64 indices, the softmax in that dtype over s + 1 columns,
            # and, when it is wider than v, the cast of its first s columns for the matmul
            sink_bytes = dt.train_w if dt.full else dt.resid
            comb = max(c, sink_bytes)
            total += b * heads * s * (s + 1) * comb + b * heads * s * 8
            total += b * heads * s * s * c if comb != c else 0
            total += t * q * c if dt.full else 0  # o_proj input (contiguous copy of the output)
        elif job.attn_impl == "eager":
            total += t * q * c + _kv_saved(a, model, dt, b, s, heads, kv_heads, _kv_kernel(g, job, s))
            if a.dropout:
                # seed_oss: the dropout on the probabilities (``softmax(..).to(query.dtype)``: q's
                # dtype after the rope, fp32 where the rope promoted it to the fp32 residual stream)
                # keeps its mask; the matmul then saves the dropout's output (or autocast's cast of
                # it) in place of the cast: the same bytes
                q_bytes = max(dt.base_out, dt.resid) if a.rope else dt.base_out
                total += b * heads * s * s * _dropout_mask_bytes(q_bytes, backend)
            # fp32 softmax output and (when the compute dtype is narrower) its cast for the matmul;
            # Llama 4's eager softmax runs in the scores' dtype: the compute dtype promoted by the
            # mask's (the residual dtype)
            # (exaone4's NoPE layers: transformers' fp32 softmax as any other layer's)
            sm = max(c, dt.resid) if (a.complex_rope or not a.rope) and FAMILIES[model.family].moe == "llama4" else 4
            total += b * heads * s * s * (sm + (c if c != sm else 0))
            if a.softcap:
                total += b * heads * s * s * c  # tanh output of the soft-capping
            total += t * q * c if dt.full else 0  # o_proj input (contiguous copy of the output)
        else:
            total += t * q * c + _kv_saved(a, model, dt, b, s, heads, kv_heads, _kv_kernel(g, job, s))  # q, k, v
            total += t * heads * a.v_head_dim * c + b * heads * s * 4  # output + logsumexp
            if a.head_major_q and dt.full and backend == "cpu":
                # q sliced from the fused projection is made contiguous head-major (as is a partial
                # rotary's q, torch.cat of its rotated and passed-through halves: glm4_moe), so the
                # CPU kernel's output is too and o_proj's input is a separate contiguous copy
                total += t * heads * a.v_head_dim * c
            if masked:
                total += b * s * s * c  # sdpa's float copy of the sliding-window mask, per layer
        if a.out_dropout:
            # seed_oss: residual dropout on o_proj's output keeps its mask; o_proj reads the
            # attention output (compute dtype), so even bitsandbytes' 4-bit o_proj returns that
            total += t * h * _dropout_mask_bytes(c, backend)
        if a.output_gate:
            # gated attention: ``attn_output * sigmoid(gate)`` saves the sigmoid and the
            # (b, s, heads * d) attention output, a copy of the kernel's where that is head-major
            # (eager; CPU sdpa with a partial rotary's q: counted above only for full fine-tuning);
            # o_proj reads the product
            # o_proj reads the product. The sigmoid is in q_proj's output dtype (fp32 from
            # bitsandbytes under PEFT's kbit upcast), and where that is fp32 already q_norm's
            # ``.float()`` is no copy: it saves a view of the whole [query | gate] projection
            copied = job.attn_impl == "eager" or (a.head_major_q and backend == "cpu" and job.attn_impl != "flash")
            gate = t * heads * a.v_head_dim * c
            total += gate + (gate if dt.full else 0) + (gate if copied and not dt.full else 0)
            total += t * heads * a.head_dim * (dt.base_out - c)
            if dt.base_out == 4 and a.qk_norm:
                total += t * heads * a.head_dim * 4
    if g.mlp is not None:
        total += _mlp_saved(g.mlp, t, h, dt, tp, g.norms_per_layer == 4)
        if FAMILIES[model.family].parallel_block and dt.full and dt.norm_out == dt.compute:
            total -= t * h * dt.compute  # (cohere2) gate/up read the norm output q/k/v saved: one storage
        if g.mlp.out_dropout:  # seed_oss: residual dropout on down_proj's output keeps its mask
            total += t * h * _dropout_mask_bytes(dt.base_out, backend)
    if g.moe is not None and g.moe.router == "gemma4":
        total += _gemma4_moe_saved(g.moe, t, h, dt)
    elif g.moe is not None:
        total += _moe_saved(g.moe, t, h, dt, tp, job.uses_lora and lora_wraps_experts(model, job.lora),
                            ep=ep, ep_rows=ep_rows)
    total += _lora_saved(g, model, job, dt, t, tp, backend)
    return total


# ---------------------------------------------------------------------------------------------
# torch.compile: what AOTAutograd's min-cut partitioner saves of a compiled decoder layer
# ---------------------------------------------------------------------------------------------
def _compiled_layer_reason(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes) -> str:
    """Why the compiled saved set of group ``g`` is not modelled ("" where it is): the rule of
    :func:`_compiled_layer_saved_bytes` is held against PyTorch only for llama-shaped dense layers
    (RMSNorm before attention and MLP, unfused q/k/v, full rotary, optional per-head q/k norms,
    sdpa without a mask, a gated MLP), full fine-tuning or LoRA on a compute-dtype base."""
    a = g.attention
    fam = FAMILIES[model.family]
    if job.method not in ("full", "lora"):
        return f"method {job.method}"
    if job.ac_mode.startswith("selective"):
        return "selective checkpointing"
    if (job.casts_fp32_base or job.low_precision or job.is_padding_free or job.has_padding
            or job.activation_offloading):
        return ("this job's options (fp32 LoRA base, low-precision recipe, padding-free, padded batches or "
                "activation offloading)")
    if job.uses_lora and not dt.autocast and _adapter_compute_bytes(job, dt) != dt.compute:
        return "LoRA adapters in another dtype than the compute dtype without autocast"
    if dt.linear_saves_input or dt.engine_compute == "cast":
        return "DeepSpeed"
    if job.attn_impl != "sdpa":
        return f"attention {job.attn_impl}"
    if g.attention is None or g.mlp is None or g.moe is not None or g.is_linear:
        return "MoE or linear-attention layers"
    b, s = _batch_shape(job)
    if (a.is_mla or a.sinks or a.output_gate or a.v_norm or a.k_eq_v or a.softcap is not None or not a.rope
            or a.complex_rope or a.l2_qk_norm or a.temperature_tuning or a.chunk is not None or a.query_pos_scale
            or a.qk_norm_whole or a.fused_qkv or a.rotary_dim is not None or g.mlp.fused_gate_up
            or fam.norm_style != "llama" or fam.post_norms or g.norms_per_layer != 2 or _masked(g, job, s)):
        return f"{model.family}'s layer shape"
    return ""


def _compiled_layer_saved_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int,
                                backend: str) -> int:
    """Bytes one decoder layer saves for backward when it runs under ``torch.compile`` (each
    decoder layer compiled, as torchtitan and torchtune do; inductor and aot_eager both partition
    with ``min_cut_rematerialization_partition``, which recomputes cheap pointwise ops in backward
    instead of saving them). Kept, per layer of t tokens: the layer input (residual dtype) and
    both norms' fp32 rsqrt (the norms' fp32 upcasts, normalised tensors, SiLU and the rotary are
    recomputed); q, k, v after the rotary, the sdpa output (o_proj's input: the same storage) and
    its logsumexp, as eager sdpa saves them; per-head q/k norms: the projection outputs and their
    rsqrt; the attention residual branch once (o_proj's output or the sum, the narrower of the
    compute and residual dtypes); the gate and up outputs; and the inputs of trainable linears
    in the compute dtype (the norms' outputs, the gated product): all of them in full
    fine-tuning, those of LoRA targets under LoRA without dropout. LoRA: each adapter's r-wide
    ``lora_A`` output; with dropout a bool mask and the compute-dtype dropout output of each
    adapter's input (instead of the shared input); without dropout PEFT's round trip to fp32
    adapters and back (autocast) makes o_proj's adapter input a copy of the sdpa output (not
    with compute-dtype adapters: FSDP's gathered ones). Exact against aot_eager and inductor on CPU
    (tests/test_compile_memory.py)."""
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    a = g.attention
    c = dt.compute
    heads = a.num_heads // tp
    kv_heads = max(1, a.num_kv_heads // tp)
    q = heads * a.head_dim
    i = g.mlp.intermediate_size // tp
    gate, up, down = g.mlp.names
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    drop = job.uses_lora and job.lora.dropout > 0

    def read_by_trainable(*modules: str) -> bool:
        return dt.full or (not drop and any(m in targets for m in modules))

    total = t * h * dt.resid + 2 * t * 4  # the layer input, the two norms' rsqrt
    total += t * h * c if read_by_trainable("q_proj", "k_proj", "v_proj") else 0
    if a.qk_norm:  # per-head q/k norms: the projections' outputs and one rsqrt per token and head
        total += t * (q + kv_heads * a.head_dim) * c + t * (heads + kv_heads) * 4
    total += t * q * c + _kv_saved(a, model, dt, b, s, heads, kv_heads, _kv_kernel(g, job, s))
    total += t * heads * a.v_head_dim * c + b * heads * s * 4  # sdpa output (o_proj's input), logsumexp
    if job.uses_lora and not drop and a.o_name in targets and _adapter_compute_bytes(job, dt) != c:
        total += t * heads * a.v_head_dim * c  # PEFT's cast to the adapters' dtype and autocast's back
    total += t * h * min(c, dt.resid)  # the attention branch, for the post-attention norm's backward
    total += t * h * c if read_by_trainable(gate, up) else 0
    total += 2 * t * i * c + (t * i * c if read_by_trainable(down) else 0)
    for lin in layer_linears(model, g):
        if lin.is_module and lin.module in targets:
            total += t * job.lora.r * c + (t * lin.in_features * (1 + c) if drop else 0)
    return total


def _compiled_first_layer_discount(model: ModelSpec, job: Job, dt: _Dtypes) -> int:
    """LoRA with a frozen embedding, no checkpointing, compiled: the first layer's input does not
    require grad, so the partitioner keeps neither it nor the input norm's rsqrt, nor the
    dropout masks of the adapters reading it."""
    t = job.micro_batch * job.seq_len
    h = model.hidden_size
    out = t * h * dt.resid + t * 4
    if job.lora.dropout > 0:
        targets = lora_targets(model, job.lora)
        out += sum(t * h for lin in layer_linears(model, model.groups[0])
                   if lin.module in _layer_input_modules(model) and lin.module in targets)
    return out


def _compiled(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes) -> bool:
    return job.torch_compile and not _compiled_layer_reason(g, model, job, dt)


def _compile_note(model: ModelSpec, job: Job, dt: _Dtypes, reason: str = "") -> str:
    """What an answer with ``torch_compile`` says about its saved activations (``reason``: why
    none of the layers is modelled, decided by the caller)."""
    reasons = {reason} if reason else {_compiled_layer_reason(g, model, job, dt) for g in model.groups}
    if reasons == {""}:
        return ("torch.compile: decoder layers' saved activations as AOTAutograd's min-cut partitioner keeps them "
                "(each decoder layer compiled, as torchtitan/torchtune do; held against aot_eager and inductor on "
                "CPU; not checked on CUDA); embedding, head and loss eager")
    why = "; ".join(sorted(r for r in reasons if r))
    if "" in reasons:
        return (f"torch.compile: the llama-shaped dense decoder layers' saved activations as AOTAutograd's min-cut "
                f"partitioner keeps them (each layer compiled); the other layers ({why}) planned as eager")
    return (f"torch.compile: saved activations planned as eager, compile changes the runtime only: not modelled "
            f"for {why} (the partitioner's saved set is modelled for llama-shaped dense layers, full or LoRA)")


def _masked(g: LayerGroup, job: Job, s: int) -> bool:
    """The layer's attention takes a materialised mask: a sliding window (Llama 4: an attention
    chunk) shorter than the row, padding-free's block-diagonal mask, or a padded micro-batch's
    (``Job.padded_batches``: transformers' ``sdpa_mask`` keeps ``is_causal`` only for an all-ones
    mask). Flash attention handles all of them without one."""
    a = g.attention
    return job.attn_impl != "flash" and ((g.window is not None and s > g.window) or job.is_padding_free
                                         or job.has_padding
                                         or (a is not None and a.chunk is not None and s > a.chunk))


def _kv_kernel(g: LayerGroup, job: Job, s: int) -> str:
    """How the layer's attention gets k and v (:func:`_kv_saved`): "eager", "flash", "native"
    (sdpa's ``enable_gqa``: transformers 5 passes unrepeated kv heads when there is no mask and
    the head dim is at most 256, ``use_gqa_in_sdpa``), or "sdpa" (after ``repeat_kv``)."""
    if job.attn_impl in ("eager", "flash"):
        return job.attn_impl
    return "native" if not _masked(g, job, s) and g.attention.head_dim <= 256 else "sdpa"


def _kv_saved(a: AttentionSpec, model: ModelSpec, dt: _Dtypes, b: int, s: int, heads: int, kv_heads: int,
              kernel: str) -> int:
    """Bytes of the k and v one layer's attention kernel saves for backward (``heads`` and
    ``kv_heads`` per rank). ``kernel``: "eager" (transformers' ``repeat_kv``, then ``torch.matmul``
    of 4-D tensors), "sdpa" (``repeat_kv``, then sdpa: a mask or a head dim over 256), "native"
    (sdpa's ``enable_gqa``: the kv heads as they are), "flash".

    ``repeat_kv`` (``expand`` then ``reshape``) copies k and v to ``heads`` heads, but with one kv
    head (multi-query attention) the reshape is a view with a 0 stride over the heads, and without
    repetition (``kv_heads == heads``) it returns its input. sdpa saves such a view as it gets it;
    ``torch.matmul`` folds the batch and head dims into one with ``reshape``, a view only at batch
    1 (a 0 head stride, or a head-major tensor of one row), a copy at batch > 1. A saved view keeps
    the storage it views alive: k's after the rope (a fresh tensor of ``kv_heads`` heads), v's
    projection output (phi3's fused qkv projection: the whole ``(heads + 2 kv_heads)``-head
    output). Where k or v is not in the compute dtype (the rope promotes k to the fp32 residual
    stream under HF Trainer's autocast; bitsandbytes' 4-bit linears return fp32 under PEFT's kbit
    recipe), autocast's cast is a new dense tensor: the repeated heads (sdpa's native GQA: the kv
    heads). Measured on CPU (``tests/test_mqa.py``)."""
    t = b * s
    c = dt.compute
    if kernel == "flash":
        return t * kv_heads * (a.head_dim + a.v_head_dim) * c
    n = kv_heads if kernel == "native" else heads
    unrepeated = kv_heads == 1 or kv_heads == heads  # repeat_kv is a view
    view = kernel == "native" or (unrepeated and (kernel == "sdpa" or b == 1))
    fam = FAMILIES[model.family]
    # k's dtype: the projection's output, promoted by the rope's cos/sin (the residual stream's
    # dtype), except where the rope casts back (OLMo's fp32 rope, Llama 4's complex one) or is absent
    k_bytes = dt.base_out if fam.fp32_rope or fam.rope_cast_back or a.complex_rope or not a.rope \
        else max(dt.base_out, dt.resid)
    k = t * (kv_heads if view and k_bytes == c else n) * a.head_dim * c
    if view and dt.base_out == c:
        v = t * ((heads + 2 * kv_heads) * a.head_dim if a.fused_qkv else kv_heads * a.v_head_dim) * c
    else:
        v = t * n * a.v_head_dim * c
    return k + v


def _nope_kv_savings(model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> dict[int, int]:
    """Bytes each NoPE layer (smollm3, by layer index) saves less than the rope layers of its
    group, which :func:`_layer_saved_bytes` counts for every layer: k not promoted by the rope
    (:func:`_kv_saved`) stays a view where the rope layers' k is cast. The recompute peak keeps
    the rope layers' figure (a group whose checkpointed layers are all NoPE is over-counted)."""
    idx = nope_layer_indices(model)
    if not idx:
        return {}
    b, s = _batch_shape(job)
    order = layer_group_order(model)
    out = {}
    for i in idx:
        g = model.groups[order[i]]
        a = g.attention
        if a is None or a.is_mla or not a.rope:
            continue
        heads, kv_heads, kernel = a.num_heads // tp, max(1, a.num_kv_heads // tp), _kv_kernel(g, job, s)
        d = (_kv_saved(a, model, dt, b, s, heads, kv_heads, kernel)
             - _kv_saved(dataclasses.replace(a, rope=False), model, dt, b, s, heads, kv_heads, kernel))
        if d:
            out[i] = d
    return out


def _llama4_attention_extras(a, b: int, s: int, heads: int, kv_heads: int) -> int:
    """Llama 4's per-layer attention terms beyond the generic ones: the weightless L2 q/k norm of a
    rope layer (``Llama4TextL2Norm``: the fp32 q and k, a fresh copy, and their rsqrt per head row;
    no weight) and a NoPE layer's temperature tuning (``query * attn_scales``: the mul keeps the
    ``(1, s, 1, 1)`` fp32 scales, expanded over the batch, for q's gradient). The complex rope
    saves only the shared ``freqs_cis`` table (:func:`_rope_bytes`)."""
    t = b * s
    out = 0
    if a.l2_qk_norm:
        out += 4 * t * (heads * a.head_dim + heads) + 4 * t * (kv_heads * a.head_dim + kv_heads)
    if a.temperature_tuning:
        out += s * 4
    return out


def _gdn_saved(la: GatedDeltaNetSpec, b: int, s: int, h: int, dt: _Dtypes, job: Job, tp: int) -> int:
    """What one Gated DeltaNet layer (``Qwen3_5GatedDeltaNet``) saves through transformers' torch
    path: ``causal_conv1d_fn``'s depthwise ``F.conv1d`` and ``torch_chunk_gated_delta_rule``
    (``l2norm`` on q and k, the sequence padded to a multiple of ``chunk_size`` C, the UT system
    solved with ``solve_triangular``, a scan over the N chunks), then the gated RMSNorm and
    out_proj. Under autocast every matmul of the delta rule casts its fp32 operands to the compute
    dtype and saves the copies; without autocast they run in fp32 on the tensors themselves.

    flash-linear-attention's fused ``chunk_gated_delta_rule`` (the CUDA path once ``fla`` is
    installed) saves only its inputs and per-chunk states instead; this is the CPU/torch path."""
    c = dt.compute
    hv, hk = la.num_v_heads // tp, max(1, la.num_k_heads // tp)
    dk, dv, k = la.k_head_dim, la.v_head_dim, la.conv_kernel
    cd = 2 * hk * dk + hv * dv  # conv channels
    t = b * s
    e = b * hv  # batch x value heads: the delta rule's rows
    C = la.chunk_size
    n = -(-s // C)
    p = n * C  # padded length
    # HF Trainer's autocast, or accelerate's around FSDP's compute-dtype weights (engine "autocast")
    ac = dt.autocast or dt.engine_compute == "autocast"
    mm = c if ac else 4  # the delta rule's matmul operands: compute-dtype copies, or fp32 themselves
    fp32_w = ac and (dt.train_w == 4 or (not dt.full and dt.norm_out == 4))  # fp32 weights under autocast
    out = 0
    # projections reading the normed input (q/k/v, z, b, a; qwen3_next's fused qkvz and ba), as
    # the attention's q/k/v
    out += _linear_inputs(t, h, 2 if la.fused_proj else 4, dt.norm_out if dt.full else dt.resid, dt)
    # causal conv: its input, (autocast over fp32 weights) the weight's cast, the silu's input
    # (the conv output over s + K - 1 positions, sliced to s)
    out += t * cd * c + (cd * k * c if fp32_w else 0) + b * cd * (s + k - 1) * c
    out += t * hv * dt.base_out  # beta = sigmoid(b), in in_proj_b's output dtype
    # g = -exp(A_log) * softplus(a + dt_bias) in fp32: softplus's input, -exp(A_log) (and, with
    # trainable A_log, exp's output and softplus's output)
    out += t * hv * 4 + hv * 4 + ((hv * 4 + t * hv * 4) if dt.full else 0)
    # l2norm of q and k (repeated to the value heads): x and the rsqrt
    out += 2 * (e * s * dk * 4 + e * s * 4)
    # v * beta, k * beta: padded v, k, beta; the causal mask; exp of the pairwise decays
    out += e * p * (dv + dk + 1) * 4 + C * C + e * n * C * C * 4
    # k_beta @ k^T and q @ k^T (each scaled by the pairwise decays: their outputs saved)
    out += (4 * e * p * dk * c if ac else 0) + 2 * e * n * C * C * mm
    # k_beta * exp(cum_decay): exp's output, k_beta; the UT system and the two solutions
    out += e * p * 4 + e * p * dk * 4 + e * n * C * C * 4 + e * p * (dv + dk) * 4
    # q * exp(cum_decay): exp's output, the padded q
    out += e * p * 4 + e * p * dk * 4
    state = e * dk * dv
    if n > 1:
        # k * exp(last - cum_decay) and the chunk decays feed the state updates
        out += e * p * 4 + e * n * 4
    # the scan: chunk i reads the state S_i (S_0 = zeros, no grad) through k_cumdecay[i] @ S_i
    # and q[i] @ S_i, then intra[i] @ v_new; every chunk but the last updates
    # S_{i+1} = S_i * decay_i + k[i]^T @ v_new
    if ac:
        out += n * (2 * state * c + e * C * C * c + e * C * dv * c)
        out += (n - 1) * 2 * e * C * dk * c  # k_cumdecay[i], q[i] copies for i >= 1
        out += (n - 1) * (state * 4 + e * C * dk * c + e * C * dv * c)  # S_i (fp32), k[i], v_new copies
    else:
        out += n * state * 4 + n * e * C * dv * 4  # S_i (zeros first), v_new
        out += e * n * C * C * 4  # intra (the fp32 product of q @ k^T and the decays)
        if n > 1:
            out += 2 * e * p * dk * 4  # the decayed q and k
    # gated RMSNorm over (t * hv, dv): fp32 input and rsqrt, the normalised tensor cast back
    # (trainable weight), weight * x (the weight's dtype), silu's fp32 input and output
    vd = hv * dv
    out += t * vd * 4 + t * hv * 4 + (t * vd * c if dt.full else 0) + t * vd * dt.norm_out + 2 * t * vd * 4
    out += t * vd * c if dt.full else 0  # out_proj's input
    return out


def _short_conv_saved(sc: ShortConvSpec, b: int, s: int, h: int, dt: _Dtypes, tp: int = 1) -> int:
    """What one LFM2 short-convolution layer (``Lfm2ShortConv``) saves through transformers'
    torch path (``causal_conv1d_fn``: ``F.conv1d`` over ``s + K - 1`` padded positions, sliced to
    ``s``): in_proj's input (full fine-tuning), its ``(b, s, 3h)`` output (``B * x`` saves the
    B and x chunks, ``C * conv`` the C chunk: one storage), the conv's input (``B * x`` cast to the
    conv weight's dtype, then by autocast to the compute dtype: one compute-dtype tensor), the
    weight's compute-dtype cast when the weight is fp32 under autocast (a view of the parameter:
    autocast's cache skips it), the conv output (compute dtype, ``s + K - 1`` positions; cast back
    to in_proj's output dtype when that differs, e.g. bitsandbytes' fp32, and then that cast is
    what ``C *`` keeps) and out_proj's input (full fine-tuning).

    causal-conv1d's CUDA kernel (``causal_conv1d_fn`` from the ``causal_conv1d`` package, which
    transformers picks up once it is installed) saves the conv's input and weight only, and
    writes an ``s``-long output: this is the CPU / torch path."""
    c = dt.compute
    t = b * s
    k = sc.conv_kernel
    o = dt.base_out  # in_proj's output dtype
    fp32_w = dt.autocast and (dt.train_w == 4 or (not dt.full and dt.norm_out == 4))
    out = _linear_inputs(t, h, 1, dt.norm_out if dt.full else dt.resid, dt)  # in_proj's input
    out += t * 3 * h * o  # in_proj's output: B, C, x
    out += t * h * c + (h * k * c if fp32_w else 0)  # the conv's input (and its weight's cast)
    out += t * h * o if o != c else b * h * (s + k - 1) * c  # what C * conv keeps
    out += t * h * c if dt.full else 0  # out_proj's input
    return out


def short_conv_kernel_saved_bytes(sc: ShortConvSpec, b: int, s: int, h: int, in_bytes: int = 2) -> int:
    """The conv terms of :func:`_short_conv_saved` with causal-conv1d's CUDA kernel
    (``CausalConv1dFn`` saves its input, weight and bias and writes an ``s``-long output in the
    input's dtype: not measured, read from Dao-AILab/causal-conv1d
    ``causal_conv1d/causal_conv1d_interface.py``): ``B * x`` itself (``in_bytes``: in_proj's
    output dtype; no cast to the weight's dtype, no autocast inside the autograd Function) and
    the ``s``-long output that ``C *`` keeps. Compare :func:`_short_conv_torch_conv_bytes`."""
    t = b * s
    return 2 * t * h * in_bytes


def _short_conv_torch_conv_bytes(sc: ShortConvSpec, b: int, s: int, h: int, dt: _Dtypes) -> int:
    """The conv terms of :func:`_short_conv_saved` on the torch path (what
    :func:`short_conv_kernel_saved_bytes` replaces): input, weight cast, the padded output."""
    t = b * s
    c, o, k = dt.compute, dt.base_out, sc.conv_kernel
    fp32_w = dt.autocast and (dt.train_w == 4 or (not dt.full and dt.norm_out == 4))
    return t * h * c + (h * k * c if fp32_w else 0) + (t * h * o if o != c else b * h * (s + k - 1) * c)


def gdn_kernel_saved_bytes(la: GatedDeltaNetSpec, b: int, s: int, compute_bytes: int = 2, tp: int = 1) -> int:
    """What the Gated DeltaNet's conv and delta rule save with the CUDA kernels transformers picks
    up once ``causal-conv1d`` and ``flash-linear-attention`` are installed (not measured: read off
    fla's ``ChunkGatedDeltaRuleFunction.forward``, fla-org/flash-linear-attention
    fla/ops/gated_delta_rule/chunk.py, and causal-conv1d's ``CausalConv1dFn``): the conv's input
    (its silu is fused), then ``save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, A)``: the
    l2-normed q and k (compute dtype, key heads) with their fp32 rstd, v, the fp32 chunk-cumsum of
    g, beta, and the solved (b, s, value heads, 64) UT matrix in the compute dtype. It recomputes
    the chunk states in backward instead of keeping them. Compare ``_gdn_saved``'s conv and delta
    rule terms (the torch path ftplan plans)."""
    c = compute_bytes
    hv, hk = la.num_v_heads // tp, max(1, la.num_k_heads // tp)
    t = b * s
    conv_in = t * (2 * hk * la.k_head_dim + hv * la.v_head_dim) * c
    qk = 2 * (t * hk * la.k_head_dim * c + t * hk * 4)
    return conv_in + qk + t * hv * la.v_head_dim * c + t * hv * 4 + t * hv * c + t * hv * la.chunk_size * c


def _gdn_torch_core_bytes(la: GatedDeltaNetSpec, b: int, s: int, dt: _Dtypes, job: Job, tp: int) -> int:
    """``_gdn_saved``'s conv and delta-rule terms (what ``gdn_kernel_saved_bytes`` replaces): the
    layer's bytes less its projections' inputs, the gating terms and the gated norm."""
    t = b * s
    hv = la.num_v_heads // tp
    vd = hv * la.v_head_dim
    full = _gdn_saved(la, b, s, 0, dt, job, tp)  # hidden 0: without the projections' inputs
    gating = t * hv * dt.base_out + t * hv * 4 + hv * 4 + ((hv * 4 + t * hv * 4) if dt.full else 0)
    norm = t * vd * 4 + t * hv * 4 + (t * vd * dt.compute if dt.full else 0) + t * vd * dt.norm_out + 2 * t * vd * 4
    norm += t * vd * dt.compute if dt.full else 0
    return full - gating - norm


def _lora_on(model: ModelSpec, job: Job, module: str) -> bool:
    return job.uses_lora and module in lora_targets(model, job.lora)


def _mlp_saved(m: MlpSpec, t: int, h: int, dt: _Dtypes, tp: int, gemma: bool) -> int:
    i = m.intermediate_size // tp
    c = dt.compute
    in_bytes = dt.norm_out if dt.full else dt.resid
    out = _linear_inputs(t, h, 1 if m.fused_gate_up else 2, in_bytes, dt)
    # act saves its input (gate out); the product saves act out and up out; (full) down's input
    o = dt.base_out
    if m.fused_gate_up:
        out += t * 2 * i * o + t * i * o  # gate_up output storage, act output
    else:
        out += 3 * t * i * o
    if dt.full:
        out += t * i * c
    return out


def _moe_saved(m: MoeSpec, t: int, h: int, dt: _Dtypes, tp: int, wrapped: bool = False, *, ep: int = 1,
               ep_rows: int | None = None) -> int:
    """One MoE layer. ``wrapped``: PEFT ParamWrapper LoRA on the experts and the router, which
    materialise ``W + BA`` (compute dtype) for every expert and the router in each forward; a
    frozen router does not save its input. ``ep`` > 1: the experts run expert-parallel on the
    ``ep_rows`` (token, expert) rows this rank receives (see :mod:`ftplan.expert_parallel`)."""
    routed = t * m.top_k
    e = dt.expert
    c = dt.compute
    i = m.expert_intermediate_size
    # router: its input copy in the compute dtype, the expert probabilities, top-k ids, the
    # normaliser and the normalised top-k weights; then the per-row weights the experts multiply
    if m.router == "gpt_oss":
        # a biased linear gives the logits (compute dtype); top-k keeps the int64 ids and the
        # softmax runs over the k chosen logits only, in their dtype: its output is the weights
        router_in = t * h * c
        out = routed * 8 + routed * c
        per_row = routed * c
        w_bytes = c
    elif m.router == "granitemoe":
        # logits in the compute dtype, upcast to fp32 (``.float()``: saved by none); top-k keeps the
        # int64 ids, the softmax over the k chosen logits its fp32 output; the weights cast back
        router_in = t * h * c
        out = routed * 8 + routed * 4
        per_row = routed * e  # (the experts' dtype: fp32 experts on CPU under autocast cast them)
        w_bytes = c
    elif m.router in ("mistral4", "lfm2_moe"):
        # DeepSeek-V2's softmax router (mistral4): a plain linear of the compute dtype, the
        # softmax probabilities in it, the top-k ids the gather keeps and, renormalised, the sum
        # and the quotient (in-place ``/=`` on the gathered weights keeps a clone). LFM2-MoE's
        # sigmoid router saves the same: the sigmoid's output, the top-k ids (topk over the
        # scores plus the fp32 expert bias and the gather of the unbiased scores share them), the
        # gathered weights and their sum + 1e-6 for the division
        router_in = t * h * c
        out = t * m.num_experts * c + routed * 8 + ((t * c + routed * c) if m.renormalize else 0)
        per_row = routed * c  # scaled by routed_scaling_factor: a new tensor
        w_bytes = c
    elif m.router == "deepseek_v3":
        # an fp32 linear (autocast turns it back to the compute dtype: HF Trainer's, or accelerate's
        # around FSDP's compute-dtype weights); the sigmoid scores and the top-k weights stay in
        # the logits' dtype
        r = c if dt.autocast or dt.engine_compute == "autocast" else 4
        router_in = t * h * r
        # (norm_topk_prob: the top-k sum and the quotient; without it neither is kept)
        out = t * m.num_experts * r + routed * 8 + ((t * r + routed * r) if m.renormalize else 0)
        per_row = routed * r  # scaled by routed_scaling_factor: a new tensor
        w_bytes = r
        if dt.engine_compute and c != 4 and not wrapped:
            # the engine's router weight is a compute-dtype tensor (FSDP's param_dtype gather,
            # DeepSpeed's module cast), not transformers' fp32 one: `weight.type(torch.float32)`
            # makes a copy each forward, which the linear saves for its input's gradient (in
            # fp32; under autocast its compute-dtype recast). PEFT's wrapped router: the merged
            # weight below
            out += m.num_experts * h * r
    elif m.router == "phimoe":
        # sparsemixer, two rounds (top-1, then top-1 of the rest): each keeps the masked_fill's bool
        # mask, the softmax output (the logits' dtype: the compute dtype; autocast on CPU leaves
        # softmax alone), the sampled expert's id (gather, then scatter: one int64 storage) and
        # the gathered probability PhimoeMultiplier keeps; the multipliers (the logits' dtype)
        # weight the experts' rows
        router_in = t * h * c
        out = 2 * t * m.num_experts * (1 + c) + routed * 8 + routed * c
        per_row = routed * c
        w_bytes = c
        if m.input_jitter:
            # ``hidden *= uniform`` in the block and again in the router (in place on the norm's
            # output): each keeps its uniform tensor, in the norm output's dtype
            out += 2 * t * h * dt.norm_out
    elif m.router == "deepseek_v2":
        # DeepSeek-V3's fp32 linear (the logits in the compute dtype under autocast), then an fp32
        # softmax (its output kept), top-k of it (the ids kept; group_limited_greedy's masked_fill
        # keeps its bool mask of the experts left), never renormalised; the top-k probabilities
        # times routed_scaling_factor, fp32, gathered per row by the experts
        r = c if dt.autocast or dt.engine_compute == "autocast" else 4
        router_in = t * h * r
        out = t * m.num_experts * 4 + routed * 8 + (t * m.num_experts if m.group_limited else 0)
        per_row = routed * 4
        w_bytes = 4
        if dt.engine_compute and c != 4 and not wrapped:
            out += m.num_experts * h * r  # the engine's compute-dtype weight's fp32 copy (as deepseek_v3)
    elif m.router == "ernie4_5_moe":
        # autocast off: ``x.float()`` (an fp32 copy unless x is fp32 already, the norm's output
        # then) through the fp32 weight; the fp32 softmax, the top-k ids (top-k over the
        # probabilities plus the frozen correction bias; the gather shares them), the gathered
        # probabilities, their sum (clamped to moe_norm_min) and the clamp's output, both kept by
        # the division; the weights cast to the input's dtype, which the experts gather per row
        router_in = t * h * 4
        out = t * m.num_experts * 4 + routed * 8 + routed * 4 + 2 * t * 4
        per_row = routed * dt.norm_out
        w_bytes = dt.norm_out
        if dt.engine_compute and c != 4 and not wrapped:
            # the engine's compute-dtype router weight (FSDP's param_dtype gather, DeepSpeed's module
            # cast): ``weight.float()`` makes an fp32 copy each forward, which the linear saves for
            # its input's gradient (no autocast turns it back here)
            out += m.num_experts * h * 4
    else:  # softmax in fp32
        router_in = t * h * c
        # (the top-k probabilities divided by their sum: the sum and the quotient; qwen3_moe's and
        # qwen3_next's router without norm_topk_prob keeps neither)
        out = t * m.num_experts * 4 + routed * 8 + ((t * 4 + routed * 4) if m.renormalize else 0)
        if m.router == "qwen3_moe":  # cast back to the logits' dtype (a no-op in fp32)
            per_row = routed * c if c != 4 else 0
            w_bytes = c
        else:
            per_row = routed * 4
            w_bytes = 4
    if (m.shared_gate or (m.router == "mistral4" and m.shared is not None)) and dt.full and dt.norm_out == c:
        # (qwen3_5_moe; mistral4's compute-dtype router) the router reads the same compute-dtype
        # tensor as the shared expert's linears, whose input _mlp_saved counts: one storage
        router_in = 0
    if dt.full or wrapped or dt.linear_saves_input:  # (a frozen router under ZeRO-3's linear too)
        out += router_in
    if wrapped:  # the merged router and expert weights
        # (DeepSpeed's cast deepseek_v3 router: the linear saves the fp32 copy of the bf16 merged
        # weight, ``weight.float()``, which no autocast turns back)
        # (ernie4_5_moe: the merged router weight is fp32, autocast off)
        router_w = 4 if (m.router in ("deepseek_v3", "deepseek_v2") and dt.engine_compute == "cast") \
            or m.router == "ernie4_5_moe" \
            else c
        # the merged experts ``W + BA`` take the base weight's dtype (type promotion over the
        # compute-dtype delta) and grouped_mm runs in it and saves the merged weight itself: fp32
        # under PEFT's QLoRA recipe (prepare_model_for_kbit_training upcasts the unquantized
        # fused experts)
        out += m.num_experts * h * router_w + _merged_experts_bytes(m, h, e) + dt.router_delta_copy
    if m.dense_dispatch:
        return _llama4_moe_saved(m, t, h, dt, tp)
    if ep > 1:
        from .expert_parallel import ep_experts_saved

        out += ep_experts_saved(m, t, routed if ep_rows is None else ep_rows, h, dt, ep, w_bytes,
                                train=dt.full or wrapped)
    elif m.router == "gpt_oss":
        # experts (grouped_mm, biased): three index vectors and, with trainable biases, the sorted
        # expert ids their gathers keep; offsets; the gate_up output (both clamps keep it), the
        # clamped gate, its sigmoid, up + 1 and the gated product (the clamped SwiGLU); the down
        # output (the per-row weighting keeps it); with trainable experts (full fine-tuning) also
        # the gathered inputs and down's input. Frozen experts (PEFT's all-linear adapts only the
        # attention here) keep neither: a grouped_mm saves its input only for its weight gradient
        train = dt.full or wrapped
        out += (4 if dt.full else 3) * routed * 8 + m.num_experts * 4 + per_row
        out += routed * e * (2 * i + 4 * i + h + ((h + i) if train else 0))
    else:
        # experts (grouped_mm): three index vectors, gathered inputs, gate_up output, act output,
        # product, per-row weights, down output; offsets per expert. Frozen experts (PEFT's
        # all-linear leaves qwen3_5_moe's alone) keep neither the gathered inputs nor down's input
        # (the product): a grouped_mm saves its input only for its weight gradient
        out += 3 * routed * 8 + m.num_experts * 4 + per_row
        train = dt.full or wrapped
        out += routed * e * ((h + 2 * i + i + i + h) if train else (2 * i + i + h))
    if m.shared is not None:
        out += _mlp_saved(m.shared, t, h, dt, tp, False)
    if m.shared_gate:
        # sigmoid(shared_expert_gate(x)) * shared_expert(x): the gate's input (full fine-tuning: an
        # autocast copy of its own where x is not in the compute dtype), the sigmoid's (t, 1)
        # output and the shared expert's output, both kept by the product
        out += _linear_inputs(t, h, 1, dt.norm_out, dt) if dt.norm_out != c else 0
        # (the gate's output comes in the base linears' output dtype: fp32 from bitsandbytes'
        # 4-bit gate under PEFT's QLoRA recipe)
        out += t * dt.base_out + t * h * dt.base_out
    return out // max(1, tp) if tp > 1 else out


def _llama4_moe_saved(m: MoeSpec, t: int, h: int, dt: _Dtypes, tp: int) -> int:
    """One Llama 4 MoE layer (``Llama4TextMoe``; PEFT wraps neither its experts nor its router).
    The router (an ``nn.Linear`` subclass) keeps its input (a trainable router: an autocast copy
    where the normed input is not in the compute dtype, else the shared expert's storage), the
    top-k ids and the fp32 sigmoid of the top-k-filled logits; the scores cast back to the logits'
    dtype and laid out per (expert, token) row scale ``hidden.repeat(E, 1)``, both kept by the mul;
    the experts' two ``bmm`` run on every (expert, token) row in the compute dtype (autocast covers
    ``bmm`` on CPU too): the gate_up output (silu and the gated product keep it), the silu output
    and, for trainable experts, their input and down's input (the product). The routed outputs are
    summed into the shared expert's output in place (nothing kept)."""
    e, i, c = m.num_experts, m.expert_intermediate_size, dt.compute
    x_bytes = dt.norm_out if dt.full else dt.resid
    rows = e * t
    out = t * h * c if dt.full and x_bytes != c else 0  # the router's input copy
    out += t * m.top_k * 8 + t * e * 4 + rows * c  # top-k ids, sigmoid, per-row scores
    out += rows * h * x_bytes  # hidden.repeat(E, 1)
    out += rows * 3 * i * c  # gate_up output, silu output
    if dt.full:
        out += rows * (h + i) * c  # the experts' input and down's input
    if m.shared is not None:
        out += _mlp_saved(m.shared, t, h, dt, tp, False)
    return out // max(1, tp) if tp > 1 else out


def _gemma4_moe_saved(m: MoeSpec, t: int, h: int, dt: _Dtypes) -> int:
    """gemma4's MoE block beside the dense MLP (``Gemma4TextDecoderLayer`` with
    ``enable_moe_block``; the MLP and the pre/post feed-forward norms are counted with the layer):

    * ``post_feedforward_layernorm_1`` on the MLP's output;
    * the router (``Gemma4TextRouter``) on the un-normed residual: a weightless RMSNorm (its fp32
      input: the residual itself when that is fp32, else a copy; two fp32 values per row), its
      output cast back to the residual dtype times the learned ``scale`` (a trainable scale keeps
      that output), ``proj`` (full fine-tuning: its compute-dtype input; LoRA on it: with the
      layer's other adapters), the fp32 softmax, the top-k ids, the in-place renormalisation
      (the row sum and a clone of the top-k values) and ``* per_expert_scale[ids]`` (the gathered
      scales; a trainable scale keeps the renormalised weights too);
    * ``pre_feedforward_layernorm_2`` on the residual (fp32 input shared with the router's norm
      when the residual is fp32);
    * the experts (grouped_mm, in ``dt.expert``): three index vectors, the offsets, the
      gate_up output, the activation output, the down output and the fp32 per-row weights; trainable
      experts (full fine-tuning: PEFT's all-linear leaves them alone) also the gathered inputs and
      down's input;
    * ``post_feedforward_layernorm_2`` on the experts' output."""
    c, r, e = dt.compute, dt.resid, dt.expert
    full = dt.full
    nw = _norm_weight_bytes(dt)
    k, n_e, i = m.top_k, m.num_experts, m.expert_intermediate_size
    routed = t * k
    out = _norm_saved(t, h, c, full, style="gemma4", weight_bytes=nw)  # post_feedforward_layernorm_1
    out += (t * h * 4 if r != 4 else 0) + 2 * t * 4  # router.norm (no weight)
    if full:
        out += t * h * r + t * h * c  # the normed router input kept by `* scale`; proj's input
    out += t * n_e * 4 + routed * 8 + t * 4 + routed * 4  # softmax, top-k ids, row sum, top-k clone
    pb = (dt.compute if dt.engine_compute else dt.train_w) if full else dt.resid  # per_expert_scale's dtype
    out += routed * pb + (routed * 4 if full else 0)  # the gathered scales; the weights they scale
    # pre_feedforward_layernorm_2 (its fp32 input is the residual's storage when that is fp32)
    out += _norm_saved(t, h, r, full, style="gemma4", weight_bytes=nw) - (t * h * 4 if r == 4 else 0)
    out += 3 * routed * 8 + n_e * 4 + routed * 4  # index vectors, offsets, per-row weights
    out += routed * e * ((h + 2 * i + i + i + h) if full else (2 * i + i + h))
    out += _norm_saved(t, h, e, full, style="gemma4", weight_bytes=nw)  # post_feedforward_layernorm_2
    return out


def _query_pos_scale_saved(b: int, s: int, dt: _Dtypes, job: Job) -> int:
    """mistral4's llama-4 query scaling: ``query * scale.to(query.dtype)`` keeps the scale, one
    value per position row of ``position_ids`` (``(1, s)`` when the trainer passes none;
    padding-free batches pass one row per sequence), in the query's dtype: ``torch.cat`` of
    q_b_proj's output (compute dtype) and the rotated part (RoPE's cos/sin come in the residual
    stream's dtype), the wider of the two."""
    rows = b if job.is_padding_free else 1
    return rows * s * max(dt.compute, dt.resid)


def _mla_saved(a, t: int, b: int, s: int, h: int, dt: _Dtypes, heads: int, backend: str,
               attn_impl: str = "sdpa", *, masked: bool = False) -> int:
    """``masked``: sdpa gets a materialised mask (a padded micro-batch): the flash / memory-
    efficient kernels keep its compute-dtype copy per layer; the CPU math kernel adds it (nothing
    kept)."""
    c = dt.compute
    out = 0
    n_in = 2  # q_a (or q without a q LoRA rank) and kv_a read the normed input
    out += _linear_inputs(t, h, n_in, dt.norm_out, dt)
    if a.q_lora_rank:
        out += _norm_saved(t, a.q_lora_rank, c, dt.full) + (t * a.q_lora_rank * c if dt.full else 0)
    out += _norm_saved(t, a.kv_lora_rank, c, dt.full) + (t * a.kv_lora_rank * c if dt.full else 0)
    # bitsandbytes' 4-bit projections return fp32 under PEFT's QLoRA recipe (``dt.base_out``):
    # kv_a_layernorm then reads a view of kv_a's fp32 output, whose whole storage (the rope part
    # too) it keeps instead of an fp32 copy of the kv_lora_rank part; and autocast hands sdpa
    # compute-dtype copies of q, k and v (v no longer a view of kv_b_proj's output)
    fp32_proj = not dt.full and dt.base_out == 4 and c != 4
    if fp32_proj:
        out += t * a.qk_rope_head_dim * 4
    qk = heads * a.head_dim
    v = heads * a.v_head_dim
    if attn_impl == "eager":
        # the matmuls keep q and k (compute dtype), a contiguous copy of v (a view of kv_b_proj's
        # output), the fp32 softmax and its cast to the compute dtype; o_proj reads a contiguous
        # copy of the output
        out += 2 * t * qk * c + t * v * c + b * heads * s * s * (4 + (c if c != 4 else 0))
        out += t * v * c if dt.full else 0
    elif backend == "cpu" and _mla_cpu_flash(a):
        # qk and v head dims equal (GLM-4.7-Flash: 192 + 64 = 256): CPU's flash kernel keeps q, k,
        # v (a view of kv_b_proj's output, whose whole storage, k_nope and v, stays), its output
        # and the logsumexp; o_proj reads a separate contiguous copy of the output
        kv_b = v if fp32_proj else heads * (a.head_dim - a.qk_rope_head_dim + a.v_head_dim)
        out += 2 * t * qk * c + t * kv_b * c + t * v * c + b * heads * s * 4 + (t * v * c if dt.full else 0)
        out += b * s * s * c if masked else 0  # sdpa's float copy of the mask
    elif backend == "cpu":
        # qk and v head dims differ: sdpa falls back to the math kernel, which on CPU upcasts to
        # fp32 and keeps q, k^T, the softmax and v; its output comes back as a separate tensor
        out += 2 * t * qk * 4 + b * heads * s * s * 4 + t * v * 4 + (t * v * c if dt.full else 0)
    else:  # memory-efficient kernel: q, k, v, output, logsumexp (and the float copy of a mask)
        out += 2 * t * qk * c + t * v * c + t * v * c + b * heads * s * 4 + (b * s * s * c if masked else 0)
    return out


def _mla_cpu_flash(a) -> bool:
    """CPU sdpa runs its flash kernel on an MLA layer when the q/k and v head dims are equal
    (glm4_moe_lite's 256 / 256), the math kernel when they differ (DeepSeek-V3's 192 / 128)."""
    return a.head_dim == a.v_head_dim


def _adapter_compute_bytes(job: Job, dt: _Dtypes) -> int:
    """Bytes per element of the LoRA adapter weights as the forward sees them, which PEFT's
    ``lora.Linear.forward`` casts its input to (``x.to(lora_A.weight.dtype)``): the stored adapter
    dtype (PEFT's fp32, TRL's QLoRA bf16), or, under a sharding engine
    (``sharding.engine_compute``), the compute dtype: FSDP2 gathers the fp32 adapters in
    ``param_dtype``; FSDP1's adapter units are views of the ``param_dtype`` flat parameter from
    the first unshard on (use_orig_params=False: before it, in the first step only, the views are
    still of the fp32 flat parameter, so that step casts as one GPU does); DeepSpeed's bf16 mode
    casts the whole module. PEFT's bitsandbytes layer (``lora/bnb.py``) skips the cast under
    autocast and casts to the same dtype without it."""
    if dt.engine_compute:
        return dt.compute
    return int(dtype_bytes(job.adapter_dtype))


def _lora_saved(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, t: int, tp: int,
                backend: str) -> int:
    """Per decoder layer: PEFT casts the input to the adapter dtype (fp32, or TRL's QLoRA bf16), applies dropout
    (CUDA saves a bool mask, CPU a mask in the input dtype), autocast copies the dropout output
    for ``lora_A`` and ``lora_B`` saves its r-wide input."""
    if not job.uses_lora:
        return 0
    targets = lora_targets(model, job.lora)
    r = job.lora.r
    c = dt.compute
    a_bytes = _adapter_compute_bytes(job, dt)
    # PEFT casts the input to the adapter dtype first: the CPU mask has that dtype
    mask = 0 if job.lora.dropout == 0 else (1 if backend == "cuda" else a_bytes)
    # without dropout (nn.Identity) and with adapters in the dtype of their input (TRL's QLoRA
    # recipe: bf16 residual stream, bf16 adapters; FSDP's and DeepSpeed's compute-dtype adapters
    # on their compute-dtype base) no cast happens: lora_A saves the layer's own
    # tensor, one storage per distinct input (q/k/v share the norm output, gate/up theirs, o_proj
    # reads the attention output the kernel already keeps)
    # (MoE layers too: TRL's QLoRA recipe on one GPU, held on CPU in tests/test_moe_qlora_activations.py)
    shared = job.lora.dropout == 0 and a_bytes == c == dt.resid
    seen: set[str] = {"mlp_input"} if shared and _router_keeps_mlp_input(g, model, job, dt) else set()
    out = 0
    for lin in layer_linears(model, g):
        if not (lin.is_module and lin.module in targets):
            continue
        width = lin.in_features
        out += t * r * c  # lora_B's r-wide input
        if shared:
            src = _linear_source(lin.module, model)
            if src in seen:
                continue
            seen.add(src)
            if _is_o_proj(g, lin.module) and _kernel_keeps_o_proj_input(g, job, backend):
                continue  # the attention kernel's saved output
        out += t * width * (mask + c)
    return out + _zero3_base_inputs(g, model, job, dt, t, backend, seen if shared else set())[0]


def _linear_source(module: str, model: ModelSpec | None = None) -> str:
    """The tensor a decoder-layer linear reads (one storage however many linears read it): qwen2_moe's
    ``shared_expert_gate`` reads the MoE block's input, as the shared expert's gate/up do (lfm2's
    w1 / w3 are its gate / up); cohere2's gate / up read the layer's normed input."""
    return ("layer_input" if module in (_READS_LAYER_INPUT if model is None else _layer_input_modules(model))
            else "mlp_input" if module in ("gate_proj", "up_proj", "gate_up_proj", "shared_expert_gate", "w1", "w3")
            else module)


def _is_o_proj(g: LayerGroup, module: str) -> bool:
    """``module`` is the attention's output projection (o_proj; lfm2's attention ``out_proj``, not
    the short convolution's)."""
    return g.attention is not None and module == g.attention.o_name


def _router_keeps_mlp_input(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes) -> bool:
    """A softmax router that saves the MoE block's compute-dtype input itself (PEFT's wrapped
    router, ZeRO-3's linear; ``_moe_saved`` counts it): LoRA adapters and ZeRO-3's frozen linears
    reading that same storage add nothing (qwen3_next's shared_expert_gate, its shared expert)."""
    m = g.moe
    if m is None or m.router not in ("mixtral", "qwen3_moe") or dt.resid != dt.compute:
        return False
    return dt.linear_saves_input or (job.uses_lora and lora_wraps_experts(model, job.lora))


def _kernel_keeps_o_proj_input(g: LayerGroup, job: Job, backend: str) -> bool:
    """o_proj reads the attention output the kernel already saves (not eager, MLA, or the CPU
    kernel's head-major output, which comes back as a separate contiguous copy)."""
    a = g.attention
    if a is None:  # a linear-attention (Gated DeltaNet) layer: its out_proj reads the gated norm's output
        return False
    return job.attn_impl != "eager" and not a.is_mla and not (a.head_major_q and backend == "cpu")


def _zero3_base_inputs(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, t: int, backend: str,
                       seen: set[str]) -> tuple[int, int]:
    """(bytes, of which the layer input) ZeRO-3's ``F.linear`` replacement saves for one decoder
    layer's frozen base linears of a LoRA job (``LinearFunctionForZeroStage3`` keeps the input of
    every linear, frozen or not): each distinct input once, unless ``lora_A`` already keeps it
    (``seen``: no dropout) or the attention kernel does (o_proj)."""
    if not (dt.frozen_linears_save_input and job.uses_lora):
        return 0, 0
    out = layer_in = 0
    seen = set(seen) | ({"mlp_input"} if _router_keeps_mlp_input(g, model, job, dt) else set())
    for lin in layer_linears(model, g):
        if not lin.is_module:
            continue
        src = _linear_source(lin.module, model)
        if src in seen or (_is_o_proj(g, lin.module) and _kernel_keeps_o_proj_input(g, job, backend)):
            continue
        seen.add(src)
        b = dt.resid if src in ("layer_input", "mlp_input") else dt.compute  # a norm's output, or a product
        out += t * lin.in_features * b
        layer_in += t * lin.in_features * b if src == "layer_input" else 0
    return out, layer_in



def _logits_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int, backend: str = "cuda",
                  consts: MemoryConstants | None = None, *, fsdp_head_unit: bool = False) -> tuple[int, int, int]:
    """(saved, forward transient, backward transient) bytes of the final norm, the LM head and the
    loss, per ``job.loss`` (the fused heads, ``trl`` and ``liger``, give one transient for both).

    ``hf`` (transformers' ``ForCausalLMLoss`` behind ``model(labels=...)``): the logits are
    upcast to fp32 and cross-entropy's log-softmax saves its fp32 output; the shifted labels
    (int64) are saved too. Transient: in the forward the compute-dtype logits and their fp32
    copy, the final norm's output (the decoder's output holds it until the model returns) and the
    padded labels; in backward the fp32 gradients of the log-softmax's output and input, next to
    the compute-dtype logits when the loop keeps the model output (``job.keep_output``; HF Trainer
    drops it before backward).

    ``hf-legacy`` (transformers < 4.46): the model upcasts the logits itself (``logits.float()``,
    the fp32 logits are its output) and copies the shifted ``logits[..., :-1, :]`` before
    ``CrossEntropyLoss``: log-softmax saves an fp32 ``b x (s - 1)`` output, the shifted int64
    labels are a ``b x (s - 1)`` copy. Transient: in the forward the fp32 logits and the shifted
    copy; in backward the two fp32 gradients, next to the fp32 logits when the loop keeps the
    output. Both held on CPU against transformers 4.44.2 and 5.x (tests/test_loss_peak_vs_torch.py).

    ``trl`` (TRL SFTTrainer's fused LM head, ``loss_type="nll"``): :func:`_trl_head_bytes`.
    ``liger`` (Liger-Kernel fused linear cross-entropy, HF Trainer ``use_liger_kernel=True``):
    :func:`_liger_head_bytes` (modelled from the algorithm, not checked on CPU: it needs Triton).
    """
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    v = model.vocab_size // tp
    c = dt.compute
    saved = _norm_saved(t, h, dt.resid, dt.full, style=_norm_style(model), weight_bytes=_norm_weight_bytes(dt),
                        autocast=dt.autocast and backend == "cuda")
    if job.loss == "trl":
        head_saved, transient = _trl_head_bytes(model, job, dt, tp, backend, consts or memory_constants())
        return saved + head_saved, transient, transient
    if job.loss == "liger":
        head_saved, transient = _liger_head_bytes(model, job, dt, tp)
        return saved + head_saved, transient, transient
    if job.loss == "torchtune":
        return _torchtune_loss_bytes(model, job, dt, tp, saved, fsdp_head_unit)
    saved += _linear_inputs(t, h, 1, dt.norm_out, dt)
    if job.uses_lora and "lm_head" in job.lora.target_modules:
        saved += t * h * (c + 1) + t * job.lora.r * c
    elif dt.linear_saves_input:
        # ZeRO-3's linear keeps the frozen lm_head's input (the final norm's output)
        saved += t * h * (dt.norm_out if job.method != "lora" else dt.resid)
    if job.loss == "hf-legacy":
        # fp32 log-softmax of the b x (s - 1) shifted logits, the shifted int64 labels (a
        # contiguous copy; with one row the slice is already contiguous: a view of the batch's
        # labels), the fp32 total weight
        ts = b * (s - 1)
        targets = 8 * ts if b > 1 else 0
        saved += ts * v * 4 + targets + 4
    else:
        # fp32 log-softmax, the shifted int64 targets (with one row the slice of the padded labels
        # is already contiguous, so the whole (1, s + 1) storage stays), the fp32 total weight
        ts = t
        targets = 8 * (t if b > 1 else s + 1)
        saved += t * v * 4 + targets + 4
    if job.kbit_upcast and dt.autocast and c != 4:
        # prepare_model_for_kbit_training keeps lm_head in fp32: autocast's compute-dtype copy of
        # the (frozen) weight is saved for the input gradient
        saved += model.vocab_size // tp * h * c
    if model.final_logit_softcap:
        saved += t * v * c  # tanh output
    # the final norm's output lives in the decoder's output until the model's forward returns; it
    # is the saved lm_head input only when the head trains and reads it without an autocast copy
    norm_out = 0 if dt.full and dt.norm_out == c else t * h * dt.norm_out
    if job.loss == "hf-legacy":
        # forward: the fp32 logits (bf16 ones freed by the upcast), the shifted copy (none with
        # one row) and the final norm's output; backward: the log-softmax's output and input
        # gradients (+ the output's fp32 logits)
        forward = t * v * 4 + (ts * v * 4 if b > 1 else 0) + norm_out
        backward = 2 * ts * v * 4 + (t * v * 4 if job.keep_output else 0)
    else:
        # forward: the compute-dtype logits (the output), their fp32 upcast, the final norm's
        # output and the padded int64 labels (with several rows the shifted targets are a copy of
        # them); backward: the two fp32 gradients (+ the output's compute-dtype logits)
        forward = t * v * (c + 4) + norm_out + (8 * b * (s + 1) if b > 1 else 0)
        backward = 2 * t * v * 4 + (t * v * c if job.keep_output else 0)
    # + the fp32 loss (forward) or its gradient (backward); by the log-softmax's backward the
    # nll's backward has already freed the saved targets
    return saved, forward + 4, backward + 4 - targets


#: torchtune's ``CEWithChunkedOutputLoss`` chunks: ``sharding.TORCHTUNE_OUTPUT_CHUNKS`` (8)


def _torchtune_loss_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int, norm_saved: int,
                          fsdp_head_unit: bool = False, *, split: bool = False) -> tuple:
    """(saved, forward transient, backward transient) of torchtune's tail: the final norm, the
    output projection applied per chunk of the sequence (``TransformerDecoder.chunked_output``:
    ``h.chunk(8, dim=1)``) and ``CEWithChunkedOutputLoss``, as the recipes' train step runs it
    (shifted labels ``hstack``-ed and held by the loop, ``del logits`` before backward). Measured
    on CPU (``ftplan.measure.torchtune_loss``, benchmarks/torchtune_loss_cpu.py).

    Saved: the norm's tensors; with a trained head each chunk's input (a contiguous copy when
    b > 1, else a view of the norm output: t h bytes either way); eager (``compile: False``) each
    chunk's fp32 log-softmax (t V 4), compiled (inductor, ``training.compile_loss``) the
    compute-dtype logits chunks and two fp32 values per row (t V c + 8 t); the int64 targets (the
    loop's shifted labels, and with b > 1 the loss's reshaped copies of their chunks) and the
    scalars (loss, token count; eager: a total weight per chunk).

    Forward peak: eager, the last chunk's fp32 upcast beside every chunk's logits (the list lives
    until the loss returns); compiled, the logits beside the norm output when the projections end.
    Backward: the compiled (or eager) cross-entropy of every chunk runs before any chunk's
    projection backward (autograd runs the later-created nodes first), so the logits gradients of
    all chunks coexist; a frozen head's peak is the first chunk's (compute-dtype gradient + 4 bytes
    per row compiled, two fp32 gradients eager). A trained head's per-chunk weight gradients meet in
    autograd's input buffer: the second chunk's adds out of place (the first one's, the second
    one's and their sum), so at the second chunk's projection backward two head-sized gradients
    are live beside the one ftplan counts as the gradient. ``fsdp_head_unit``: the trained head is
    an FSDP2 unit of its own (torchtune's wrapping, ``Layout.fsdp_wrap``): those weight gradients
    are the unit's, in ``sharding.fsdp2_transient_bytes`` (with its per-chunk gathers), not here."""
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    v = model.vocab_size // tp
    c = dt.compute
    size = -(-s // TORCHTUNE_OUTPUT_CHUNKS)  # torch.chunk: ceil(s / n) per chunk, the last one shorter
    n = -(-s // size)
    r_last = b * (s - (n - 1) * size)  # rows of the last chunk (backward starts there)
    r_prev = b * size if n > 1 else 0
    compiled = job.torch_compile
    inputs = t * h * c if dt.full else 0  # the head's input per chunk (trained head)
    loss_saved = t * v * c + 8 * t if compiled else t * v * 4
    targets = 8 * t + (8 * t if b > 1 else 0)
    scalars = 12 + (0 if compiled else 4 * n)
    saved = norm_saved + inputs + loss_saved + targets + scalars
    if compiled:
        # the projections' end: the norm output (t h c) beside every chunk's logits; the inputs
        # with one row are views of it
        forward_peak = max(norm_saved + (inputs if b > 1 else 0) + t * h * c + t * v * c, saved)
        # the last chunk's backward first (its gradient and 4 bytes per row), then the one before
        # it, longer when the sequence is not a multiple of the chunks, after the last one's
        # per-row values and targets are freed
        backward_peak = saved + max(r_last * (v * c + 4),
                                    r_prev * (v * c + 4) - r_last * (8 + (8 if b > 1 else 0)))
    else:
        forward_peak = saved + t * v * c + r_last * v * 4 + 4
        # two fp32 gradients of a chunk (the last one's log-probabilities already replaced by its
        # compute-dtype gradient when the one before runs)
        backward_peak = saved + max(2 * r_last * v * 4, 2 * r_prev * v * 4 - r_last * v * (4 - c))
    ce_backward = backward_peak
    second = None
    if dt.full and n > 1:
        # the second chunk's projection backward: the loss's tensors gone (the token count stays),
        # every chunk's logits gradient but the last one's, the two chunks' input gradients, two
        # head-sized weight gradients; the last chunk's saved input copy (b > 1) already freed
        w = v * h * int(dtype_bytes(PRECISIONS[job.precision]["grad"]))
        second = (norm_saved + inputs + 8 * t + 8 + t * v * c - r_last * v * c + (0 if fsdp_head_unit else 2 * w)
                  + (r_last + r_prev) * h * c - (r_last * h * c if b > 1 else 0))
        backward_peak = max(backward_peak, second)
    if split:
        # (saved, forward, the cross-entropies' backward, what the tail holds at each chunk's
        # projection backward, chunk 0 first, or None with a frozen head or one chunk): the logits
        # gradients of the chunks not yet through their projection, the input gradients of those
        # that are (chunk's backward waits for all of them), the input copies (b > 1) of those
        # freed; at chunk n - 2 it is ``second`` above
        per_chunk = None
        if second is not None:
            rows = [b * size] * (n - 1) + [r_last]
            fixed = norm_saved + inputs + 8 * t + 8 + (0 if fsdp_head_unit else 2 * w)
            per_chunk = tuple(fixed + sum(rows[:k + 1]) * v * c + sum(rows[k:]) * h * c
                              - (sum(rows[k + 1:]) * h * c if b > 1 else 0) for k in range(n))
            assert per_chunk[n - 2] == second
        return saved, forward_peak - saved, ce_backward - saved, per_chunk
    return saved, forward_peak - saved, backward_peak - saved


def _lm_head_weight_bytes(job: Job, dt: _Dtypes) -> int:
    """Bytes per element of the lm_head weight as the trainer holds it."""
    if job.method == "full":
        return dt.train_w
    if job.method == "qlora":
        return int(dtype_bytes(job.unquantized_dtype))  # fp32 after prepare_model_for_kbit_training
    return dt.resid  # the frozen base dtype


def _trl_head_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int, backend: str,
                    consts: MemoryConstants) -> tuple[int, int]:
    """TRL >= 1.x SFTTrainer: ``add_fused_lm_head`` scores the next-token log-probabilities in
    tiles of ``trl_logprob_token_chunk`` tokens x ``trl_logprob_vocab_chunk`` vocabulary entries
    (``ChunkedLogProbFunction``) without ever materialising the logits; the backward recomputes
    each tile. Saved: the hidden states it projects, the int64 targets, the fp32 log-normaliser
    and entropy per token, the label mask of the masked_fill/masked_scatter that puts the
    per-token values back, and the int64 token count the loss is divided by. On CUDA (Triton)
    only positions with a label are projected (``hidden_states[mask]``: a compact copy); on CPU
    every position is, from a view of the last hidden state (a copy when b > 1).
    Transient: one compute-dtype tile, the compute-dtype casts of a hidden chunk and a weight
    chunk, and in backward the fp32 gradient of the hidden states (and its cast)."""
    b, s = _batch_shape(job)
    h = model.hidden_size
    c = dt.compute
    hb = dt.norm_out if job.method != "lora" else dt.resid  # the final norm's output dtype
    n = b * (s - 1)  # scored positions (every shifted label is valid in a dense batch)
    if job.is_padding_free:
        n = job.micro_batch * (job.seq_len - 1)  # the first label of each sequence is -100
    rows = b * (s - 1)
    if backend == "cuda":
        hidden = n * h * hb  # compact copy of the positions with a label
        targets = n * 8
    else:
        hidden = (s * h if b == 1 else rows * h) * hb
        targets = rows * 8
    per_token = 2 * n * 4 if backend == "cuda" else 2 * rows * 4  # log_z, entropy (fp32)
    mask = rows  # bool (b, s-1): ~mask (CPU masked_fill) or mask (CUDA index/masked_scatter)
    saved = hidden + targets + per_token + mask + 8
    # transient
    m = n if backend == "cuda" else rows
    tile_rows = min(m, consts.trl_logprob_token_chunk)
    w = _lm_head_weight_bytes(job, dt)
    vocab = model.vocab_size // tp
    tile = tile_rows * consts.trl_logprob_vocab_chunk * c
    casts = (tile_rows * h * c if hb != c else 0) + (min(vocab, consts.trl_logprob_vocab_chunk) * h * c
                                                     if w != c else 0)
    fwd = tile + casts + 7 * m * 4
    bwd = tile + casts + m * h * 4 + (m * h * hb if hb != 4 else 0) + m * 4
    return saved, max(fwd, bwd)


def _liger_head_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> tuple[int, int]:
    """Liger-Kernel ``LigerFusedLinearCrossEntropyFunction`` (ops/fused_linear_cross_entropy.py):
    the forward walks the tokens in chunks of ``next_pow2(ceil(BT / ceil(V / H)))`` (so a chunk's
    logits are about BT x H elements), computes each chunk's loss and its logits gradient in
    place, and accumulates the input gradient (BT x H, the input's dtype) and, for a trainable
    lm_head, the weight gradient right away; those gradients are what it saves for backward.
    Transient: one chunk of logits (compute dtype) and the fp32 per-token loss."""
    b, s = _batch_shape(job)
    bt = b * s
    h = model.hidden_size
    v = model.vocab_size // tp
    hb = dt.norm_out if job.method != "lora" else dt.resid
    inc = -(-v // h)
    chunk = min(1 << max(0, (-(-bt // inc) - 1).bit_length()), bt)
    saved = bt * h * hb + 8 * bt  # grad_input; the shifted int64 targets
    transient = chunk * v * dt.compute + chunk * h * hb + bt * 4
    return saved, transient


#: attention projections that read the (normed) decoder-layer input
#: the projections that read a decoder layer's input (one set with sharding's ZeRO-3 release rule)
_READS_LAYER_INPUT = LAYER_INPUT_PROJECTIONS


def _layer_input_modules(model: ModelSpec) -> frozenset[str]:
    """The linears that read a decoder layer's (normed) input: the attention's input projections,
    and in a parallel block (cohere2) the MLP's gate / up too."""
    if FAMILIES[model.family].parallel_block:
        return _READS_LAYER_INPUT | {"gate_proj", "up_proj"}
    return _READS_LAYER_INPUT


def _first_layer_discount(model: ModelSpec, job: Job, dt: _Dtypes, backend: str) -> int:
    """With a frozen embedding (LoRA/QLoRA, no checkpointing) the first layer's input does not
    require grad: its input norm saves nothing and the LoRA dropouts reading it keep no mask."""
    t = job.micro_batch * job.seq_len
    h = model.hidden_size
    # (post-norm families, olmo2: the first layer has no input norm)
    out = 0 if FAMILIES[model.family].post_norms else _norm_saved(t, h, dt.resid, False, style=_norm_style(model),
                                                                   weight_bytes=_norm_weight_bytes(dt),
                                                                   autocast=dt.autocast and backend == "cuda")
    if job.casts_fp32_base:
        # nor do the projections reading it save their weight copies (nothing needs a gradient)
        out += dt.compute * sum(lin.in_features * lin.out_features for lin in layer_linears(model, model.groups[0])
                                if lin.module in _layer_input_modules(model))
    if job.uses_lora and job.lora.dropout > 0:
        mask = 1 if backend == "cuda" else _adapter_compute_bytes(job, dt)
        targets = lora_targets(model, job.lora)
        first = layer_linears(model, model.groups[0])
        for lin in first:
            if lin.module in _layer_input_modules(model) and lin.module in targets:
                out += t * h * mask
    if dt.frozen_linears_save_input and job.uses_lora:
        # nor do ZeRO-3's linears reading it save it (no input needs a gradient: the autograd
        # Function is not recorded); a lora_A reading it directly still does (its weight's gradient)
        g0 = model.groups[0]
        targets = lora_targets(model, job.lora)
        shared = job.lora.dropout == 0 and _adapter_compute_bytes(job, dt) == dt.compute == dt.resid and (
            g0.moe is None or bool(dt.engine_compute))
        seen = {"layer_input"} if shared and any(lin.module in _layer_input_modules(model) and lin.module in targets
                                                  for lin in layer_linears(model, g0) if lin.is_module) else set()
        out += _zero3_base_inputs(g0, model, job, dt, t, backend, seen)[1]
    return out


def _embedding_leaf_bytes(model: ModelSpec, job: Job, dt: _Dtypes) -> int:
    """The embedding output the autograd graph holds beside the saved tensors. With a frozen
    embedding under checkpointing, transformers' ``enable_input_require_grads`` hook makes the
    embedding module's output a leaf that requires grad, which the graph's ``AccumulateGrad`` keeps,
    ``(b, s, h)`` in the embedding's dtype, until backward ends. It is the first layer's checkpoint
    input (counted with the layers) except where the model transforms it first: Granite
    (``Family.embedding_scaled_outside``) multiplies it by ``embedding_multiplier`` outside the
    module, so the leaf is a storage of its own. With TRL's activation offloading the checkpoint
    input's host copy does not free it: the leaf stays on the device for every family. Measured
    on CPU (the harness finds the graph's leaves: ``accounting.graph_leaf_bytes``;
    tests/test_granite.py, test_checkpointing_vs_torch's offloading cases)."""
    if dt.full or job.ac_mode == "none":
        return 0
    if not (job.activation_offloading or FAMILIES[model.family].embedding_scaled_outside):
        return 0
    b, s = _batch_shape(job)
    return b * s * model.hidden_size * dt.resid


def _router_aux_loss_saved(model: ModelSpec, job: Job, dt: _Dtypes, backend: str) -> int:
    """``output_router_logits`` (:data:`ftplan.model.ROUTER_AUX_LOSS_FAMILIES`): the forward's
    ``load_balancing_loss_func`` concatenates every MoE layer's router logits and saves their softmax
    until backward, ``moe_layers x t x E`` in the logits' dtype (fp32 for an fp32 router: granitemoe's
    ``.float()``, ernie4_5_moe's autocast-off router; else the compute dtype; CUDA autocast runs
    softmax in fp32, CPU autocast does not), + the fp32 tokens-per-expert vector the final product
    keeps (4 E B). Exact on CPU for the 11 families (fp32, autocast, pure bf16; E = 4 and 8:
    tests/test_router_aux_loss.py); held outside the layers, so checkpointing does not remove it."""
    if not model.router_aux_loss:
        return 0
    b, s = _batch_shape(job)
    out = 0
    for g in model.groups:
        m = g.moe
        if m is None:
            continue
        out = max(out, 4 * m.num_experts)
        logits = 4 if (m.router == "granitemoe" or not m.router_autocast) else dt.compute
        if dt.autocast and backend == "cuda":
            logits = 4
        out += g.count * b * s * m.num_experts * logits
    return out


def _kv_store_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int = 1) -> int:
    """Gemma 4 under checkpointing: the last layer of each attention kind (sliding, full) stores
    its keys and values in ``shared_kv_states`` (``kv_sharing_modes`` "store", even where no layer
    reuses them), a ``KVSharingDict`` every layer receives as a keyword argument. The recompute
    closures of the checkpointed layers hold that dict, so the forward's last K and V of each kind
    stay alive until backward, outside the saved tensors (without checkpointing nothing holds the
    dict once the forward returns). K is the rotated ``k_norm`` output (the projection's dtype
    promoted by the RoPE tables'), V the ``v_norm`` output (the projection's dtype). Measured on
    CPU through the closures' containers (``accounting.SavedTensorTracker``; before 2026-11-25 the
    harness walked only plain dicts and neither side counted them)."""
    if not FAMILIES[model.family].gemma4:
        return 0
    b, s = _batch_shape(job)
    t = b * s
    k_bytes = max(dt.base_out, dt.compute if dt.casts_layer_inputs else dt.resid)
    last: dict[bool, int] = {}  # the last layer of each kind: its index
    order = layer_group_order(model)
    for i, gi in enumerate(order):
        if model.groups[gi].attention is not None:
            last[model.groups[gi].window is not None] = i
    out = 0
    for i in last.values():
        a = model.groups[order[i]].attention
        kv = t * max(1, a.num_kv_heads // tp) * a.head_dim
        if job.ac_mode != "every-k" or i % job.checkpoint_every == 0:
            out += kv * (k_bytes + dt.base_out)
        else:
            # a layer every-k leaves alone: its attention kernel saves K and V themselves, or
            # autocast's compute-dtype copies of them where they are wider (then the dict's are extra)
            out += kv * ((k_bytes if k_bytes != dt.compute else 0) + (dt.base_out if dt.base_out != dt.compute else 0))
    return out


def _model_level_saved(model: ModelSpec, job: Job, dt: _Dtypes, tp: int = 1) -> int:
    """Tensors saved once per model: token ids, the shared RoPE tables and, under (non-reentrant)
    checkpointing, what the layers' recompute closures capture: position ids and any
    materialised attention mask (eager: ``(b, 1, s, s)`` in the residual dtype per distinct layer
    type; sdpa: a ``(1, 1, s, s)`` bool per sliding window shorter than the sequence).

    Padding-free (one row of T tokens): the RoPE tables cover T positions; the closures hold the
    collator's ``position_ids`` (int64), ``seq_idx`` (int32) and ``cu_seq_lens`` (int32, one per
    sequence + 1); sdpa and eager attend through a block-diagonal ``(1, 1, T, T)`` mask (flash
    attention runs varlen without one)."""
    b, s = _batch_shape(job)
    t = b * s
    a = model.attention
    out = t * 8 if dt.full else 0  # embedding backward keeps the token ids
    if dt.full and dt.engine_compute and (FAMILIES[model.family].gemma4
                                          or model.family in ("gemma", "gemma2", "gemma3_text")):
        # the embedding's 0-dim scale in the gathered weight's dtype (Gemma*TextScaledWordEmbedding:
        # ``embed_scale.to(weight.dtype)``, a copy of the fp32 buffer once FSDP2 / ZeRO-3 gather bf16;
        # gemma2 / gemma3_text were 2 B under on the gloo ranks before, 2026-11-25)
        out += dt.compute
    if not a.is_mla or a.complex_rope:  # (deepseek_v2's complex table: _rope_bytes)
        out += _rope_bytes(model, job, dt)  # RoPE cos, sin: (1, s, d), shared
    else:
        out += 2 * s * a.qk_rope_head_dim * dt.resid
    if job.has_padding and any(g.short_conv is not None or g.linear_attention is not None for g in model.groups):
        # a padded micro-batch: the short-conv / linear-attention layers zero the padding rows
        # (``apply_mask_to_padding_states``: ``hidden_states * attention_mask[:, :, None]``); the
        # mul keeps the collator's int64 (b, s) mask, one storage for every such layer (the
        # recompute closures hold the same one)
        out += b * s * 8
    if job.ac_mode != "none":
        out += s * 8  # position_ids
        out += _kv_store_bytes(model, job, dt, tp)
        if job.is_padding_free:
            out += s * 4 + (job.micro_batch + 1) * 4  # seq_idx, cu_seq_lens (q and k: one tensor)
        packed = job.is_padding_free and job.attn_impl != "flash"
        # the masks of the attention kinds the checkpointed layers use
        # (a hybrid model's linear-attention layers get no materialised mask without padding)
        kinds = {g.window if g.window is not None and s > g.window else None
                 for g, n in zip(model.groups, _checkpointed_counts(model, job)) if n and g.attention is not None}
        # eager materialises a mask per layer kind the model has, sliding or full, even where
        # the window covers the whole row (transformers builds each kind's mask every forward);
        # so does sdpa for a padded micro-batch, as (b, 1, s, s) bools
        eager_kinds = {(g.window is not None, g.attention.chunk is not None)
                       for g, n in zip(model.groups, _checkpointed_counts(model, job))
                       if n and g.attention is not None}
        if job.attn_impl == "eager":
            out += len(eager_kinds) * b * s * s * dt.resid
        elif job.attn_impl == "sdpa" and job.has_padding:
            out += len(eager_kinds) * b * s * s
        elif job.attn_impl == "sdpa":
            out += sum(s * s for w in kinds if w is not None or packed)
            # Llama 4's chunked attention: create_chunked_causal_mask gives sdpa a (b, 1, s, s)
            # bool mask once the sequence is longer than the chunk
            chunks = {g.attention.chunk for g, n in zip(model.groups, _checkpointed_counts(model, job))
                      if n and g.attention is not None and g.attention.chunk is not None and s > g.attention.chunk}
            out += len(chunks) * b * s * s
    return out


# ---------------------------------------------------------------------------------------------
# activation checkpointing variants
# ---------------------------------------------------------------------------------------------
def checkpointed_layer_counts(model: ModelSpec, job: Job) -> list[int]:
    """Checkpointed decoder layers per group of ``model.groups`` under ``job.ac_mode``."""
    return _checkpointed_counts(model, job)



def _checkpointed_counts(model: ModelSpec, job: Job) -> list[int]:
    """Checkpointed decoder layers per group (``sharding.checkpointed_counts``: DeepSpeed's
    view-held experts need them too, and this module imports that one)."""
    return checkpointed_counts(model, job)


def _attention_kernel_outputs(g: LayerGroup, job: Job, dt: _Dtypes, tp: int, backend: str) -> int:
    """Bytes of the outputs of the fused attention kernel of one layer (output and logsumexp), what
    a selective-checkpointing policy that saves the attention op keeps; 0 where attention is not
    one op (eager; MLA on CPU, where different q/v head dims send sdpa to the math kernel; a Gated
    DeltaNet layer, whose torch delta rule is many small ops)."""
    a = g.attention
    if a is None or job.attn_impl == "eager" or (a.is_mla and backend == "cpu" and not _mla_cpu_flash(a)):
        return 0
    b, s = _batch_shape(job)
    heads = a.num_heads // tp
    return b * s * heads * a.v_head_dim * dt.compute + b * heads * s * 4


def _layer_matmul_outputs(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> list[int]:
    """Bytes of the output of every ``aten.mm`` a decoder layer runs, in execution order: bias-free
    projections (a bias makes it ``addmm``), each LoRA ``lora_A``/``lora_B`` right after its base
    layer, the MoE router (routed experts run ``grouped_mm``), shared experts after the routed."""
    t = job.micro_batch * job.seq_len
    c = dt.compute
    r = job.lora.r
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    out: list[int] = []

    def proj(lin: LinearSpec, width: int) -> None:
        if not lin.bias:
            out.append(t * width * c)
        if lin.module in targets:
            out.extend((t * r * c, t * width * c))

    lins = {lin.module: lin for lin in layer_linears(model, g)}
    a = g.attention
    col = {"q_proj", "k_proj", "v_proj", "qkv_proj", "q_b_proj", "kv_b_proj", "gate_proj", "up_proj",
           "gate_up_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba"}
    if g.short_conv is not None:  # LFM2's short convolution: in_proj and out_proj (the conv is no mm)
        order = ["in_proj", "out_proj"]
        col = col | {"in_proj"}
    elif a is None:  # Gated DeltaNet: its delta rule's matmuls are bmm, not mm
        order = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba", "out_proj"]
    elif a.is_mla:
        order = ["q_a_proj", "q_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    else:
        order = ["qkv_proj", "q_proj", "k_proj", "v_proj", a.o_name]
    for name in order:
        if name in lins:
            lin = lins[name]
            proj(lin, lin.out_features // tp if name in col else lin.out_features)
    from .model import mlp_linears

    def mlp_proj(mlp: MlpSpec) -> None:
        for lin in mlp_linears(mlp, model.hidden_size, 1, "mlp"):
            if lin.module in ("gate_up_proj", *mlp.names):
                proj(lin, lin.out_features // tp if lin.module in col or lin.module in mlp.names[:2]
                     else lin.out_features)

    mlp = g.mlp if g.mlp is not None else None
    if g.moe is not None and g.moe.router_is_module:
        mlp = None  # gemma4: the dense MLP, then the router's Linear (and its adapters)
        for lin in layer_linears(model, g):
            if lin.module in ("gate_proj", "up_proj", "down_proj", "proj"):
                proj(lin, lin.out_features // tp if lin.module in col else lin.out_features)
    elif g.moe is not None:
        shared_first = g.moe.shared_gate or not g.moe.router_autocast
        if shared_first and g.moe.shared is not None:
            # qwen2_moe's block (qwen3_5_moe, qwen3_next) and ernie4_5_moe's: the shared expert
            # runs before the router
            mlp_proj(g.moe.shared)
        if job.uses_lora and lora_wraps_experts(model, job.lora):
            out.append(g.moe.num_experts * model.hidden_size * c)  # ParamWrapper's B @ A for the router
        if not g.moe.bias:  # a biased router (gpt_oss) runs addmm
            # router logits (ernie4_5_moe's router runs in fp32, autocast off)
            out.append(t * g.moe.num_experts * (c if g.moe.router_autocast else 4))
        if g.moe.shared_gate:  # then sigmoid(shared_expert_gate(x)), after the routed experts
            proj(lins["shared_expert_gate"], 1)
            mlp = None
        elif shared_first:
            mlp = None
        else:
            mlp = g.moe.shared
    if mlp is not None:
        mlp_proj(mlp)
    return out


def _sac_cache_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int, backend: str) -> int:
    """Per checkpointed layer, what selective activation checkpointing caches for backward.

    ``selective-attention`` (TRL ``gradient_checkpointing_kwargs={"selective": True}``): the
    attention kernel's outputs. ``selective`` (torchtitan's op policy): those plus every other
    ``mm`` output (the 1st, 3rd, ... of the layer)."""
    mode = job.ac_mode
    if mode not in ("selective", "selective-attention"):
        return 0
    out = _attention_kernel_outputs(g, job, dt, tp, backend)
    if mode == "selective":
        out += sum(x for i, x in enumerate(_layer_matmul_outputs(g, model, job, dt, tp)) if i % 2 == 0)
    return out


# ---------------------------------------------------------------------------------------------
# activation offloading (TRL activation_offloading=True)
# ---------------------------------------------------------------------------------------------
def _offload_split(model: ModelSpec, job: Job, dt: _Dtypes, tp: int, backend: str,
                   consts: MemoryConstants) -> tuple[int, int, int, int]:
    """(host bytes, pinned host bytes, bytes kept on the device before the loss, kept of the
    final norm and loss) under TRL's ``OffloadActivations`` (trl/models/activation_offloading.py).

    Its pack hook receives every tensor autograd saves outside the output head (TRL enters a
    no-op hook around ``lm_head``) and copies it to pinned host memory, except: parameters,
    tensors under ``trl_offload_min_bytes`` and repeats of a storage whose first copy is still
    tracked (those stay on the device as they are: the storage is held by the hook's table). The
    last ``trl_offload_stash_tensors`` saves keep their device original until the backward starts
    (the copy stream's stash). Tensors that never pass a saved-tensor hook stay where they are:
    checkpoint recompute closures (RoPE tables, masks, position ids) and the SAC cache.

    The saves are replayed in forward order (:func:`_offload_events`) through the same rules.
    Exact where every decoder layer is checkpointed; without checkpointing (and for the layers
    every-k leaves alone) a layer's saved tensors are taken as one block that goes to the host, a
    lower bound on what stays (repeats inside a layer stay on the device)."""
    events, before_loss = _offload_events(model, job, dt, tp, backend)
    window = consts.trl_offload_stash_tensors
    stash: dict[int, tuple[str, int]] = {}
    key_of: dict[int, str] = {}
    tracked: dict[str, int] = {}
    held: dict[str, int] = {}  # repeats kept on the device
    host = pinned = 0
    small: dict[str, int] = {}
    for i, (host_b, dev_b, key) in enumerate(events, 1):
        if key is None:  # a parameter: takes an id, stays
            continue
        if host_b == 0:  # repeats inside a block (not checkpointed layers): stay
            held[key] = dev_b
            continue
        if key in tracked:
            tracked[key] = i
            key_of[i] = key
            held[key] = dev_b
            continue
        if host_b < consts.trl_offload_min_bytes:
            small[key] = dev_b
            continue
        for j in list(stash):
            if j > i - window:
                break
            del stash[j]
            k = key_of.pop(j, None)
            if k is not None and tracked.get(k) == j:
                del tracked[k]
        host += host_b
        pinned += 1 << max(0, (host_b - 1).bit_length())  # CachingHostAllocator: PowerOf2Ceil(size)
        stash[i] = (key, dev_b)
        tracked[key] = i
        key_of[i] = key
    device = {**small, **held, **{k: d for k, d in stash.values()}}
    loss_keys = {k for _, _, k in events[before_loss:] if k is not None}
    kept_loss = sum(v for k, v in device.items() if k in loss_keys)
    kept_layers = sum(v for k, v in device.items() if k not in loss_keys)
    # what never passes a saved-tensor hook: closures (and, without checkpointing, the RoPE
    # tables the first layer saves and every later layer repeats), and the output head's saves
    b, s = _batch_shape(job)
    t = b * s
    kept_layers += (_model_level_saved(model, job, dt, tp) - (t * 8 if dt.full else 0)
                    + _router_aux_loss_saved(model, job, dt, backend))
    kept_loss += _head_noop_saved(model, job, dt, tp)
    return host, pinned, kept_layers, kept_loss


def _head_noop_saved(model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> int:
    """What the output head saves inside TRL's no-op hook (kept on the device): with
    transformers' loss path, lm_head's input (a compute-dtype copy when the norm output is not in
    it) and QLoRA's autocast copy of the fp32 lm_head weight."""
    if not job.materialises_logits:
        return 0
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    out = _linear_inputs(t, h, 1, dt.norm_out, dt)
    if job.kbit_upcast and dt.autocast and dt.compute != 4:
        out += model.vocab_size // tp * h * dt.compute
    return out


def _offload_events(model: ModelSpec, job: Job, dt: _Dtypes, tp: int,
                    backend: str) -> tuple[list[tuple[int, int, str | None]], int]:
    """Every tensor the forward saves through a saved-tensor hook, in order: (bytes of the host
    copy, bytes kept if it stays on the device, storage key; None for a parameter), and the index
    where the final norm starts."""
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    ev: list[tuple[int, int, str | None]] = []
    if dt.full:
        ev.append((t * 8, t * 8, "ids"))  # the embedding keeps the token ids
    per_group = {id(g): _layer_saved_bytes(g, model, job, dt, tp, backend) for g in model.groups}
    ck = job.ac_mode != "none"
    every = job.checkpoint_every if job.ac_mode == "every-k" else 1
    rope_done = False
    for i, gi in enumerate(layer_group_order(model)):
        g = model.groups[gi]
        if ck and i % every == 0:
            x = t * h * dt.resid  # the checkpoint input
            ev.append((x, x, f"layer{i}"))
        else:
            first_frozen = i == 0 and not ck and not dt.full
            x = per_group[id(g)] - (_first_layer_discount(model, job, dt, backend) if first_frozen else 0)
            # a layer that is not checkpointed saves many tensors; taken as one block that goes to
            # the host, plus what it saves twice in a row, which stays (see _layer_repeats)
            ev.append((x, 0, f"layer{i}"))
            rep = _layer_repeats(g, model, job, dt, tp, first_frozen, backend)
            if rep:
                ev.append((0, rep, f"layer{i}_repeats"))
            # autocast's compute-dtype weight copies this layer saves go to the host too (on the
            # device the autocast cache holds them until the forward ends: counted as weights)
            copies = _layer_copy_bytes(g, model, job, dt, backend, first_frozen)
            if copies:
                ev.append((copies, 0, f"layer{i}_copies"))
            if not rope_done:  # the first layer not checkpointed saves the shared RoPE tables
                rope_done = True
                rope = _rope_bytes(model, job, dt)
                ev.append((rope, 0, "rope"))
    start = len(ev)
    # the final norm: x.float() (or x itself), rsqrt; the product saves both again; llama style
    # then saves the normalised tensor cast back (trainable weight) and the weight
    style = _norm_style(model)
    ev += [(t * h * 4, t * h * 4, "norm_x"), (t * 4, t * 4, "norm_r"), (t * 4, t * 4, "norm_r"),
           (t * h * 4, t * h * 4, "norm_x")]
    if style == "gemma":
        ev.append((h * 4, h * 4, "norm_1pw"))
        if dt.full:
            ev.append((t * h * 4, t * h * 4, "norm_y"))
    elif style == "gpt_oss":  # fp32 normalised tensor (trainable weight); no weight copy
        if dt.full:
            ev.append((t * h * 4, t * h * 4, "norm_y"))
        ev.append((0, 0, None))
    else:
        if dt.full:
            ev.append((t * h * dt.resid, t * h * dt.resid, "norm_y"))
        ev.append((0, 0, None))
    ev += _loss_events(model, job, dt, tp, backend)
    return ev, start


def _rope_table_width(dim: int) -> int:
    """Width of transformers' RoPE cos/sin tables over ``dim`` rotary features: the inverse
    frequencies are ``arange(0, dim, 2)`` (``ceil(dim / 2)`` of them), doubled by ``cat((freqs,
    freqs))``; an odd partial rotary width rotates ``dim + 1`` features (``q[..., :cos.shape[-1]]``)."""
    return dim + dim % 2


def _rope_bytes(model: ModelSpec, job: Job, dt: _Dtypes) -> int:
    """The RoPE cos and sin tables, shared by every layer: ``(1, s, d)`` each (mrope: ``(b, s, d)``)."""
    b, s = _batch_shape(job)
    a = model.attention
    if FAMILIES[model.family].rope_interleave_tables and job.ac_mode == "none":
        return 0  # ernie4_5: the layers save their own interleaved copies; only the closures keep these
    if a.is_mla and a.complex_rope:
        return s * a.qk_rope_head_dim * 4  # deepseek_v2: one complex64 freqs_cis (1, s, d / 2)
    if a.is_mla:
        return 2 * s * a.qk_rope_head_dim * dt.resid
    # gemma3 keeps a second pair for its local layers; gpt_oss's tables are half-width (the
    # rotation pairs the two halves of a head: ``(1, s, d / 2)``); a partial rotary (glm4_moe)
    # builds them over its rotary features only (``(1, s, int(d * partial_rotary_factor))``)
    if a.rotary_dim is not None:
        width = _rope_table_width(a.rotary_dim)
    else:
        width = a.head_dim // 2 if model.family == "gpt_oss" else a.head_dim
    fam = FAMILIES[model.family]
    rows = b if fam.mrope else 1
    if any(g.attention is not None and g.attention.complex_rope for g in model.groups):
        # Llama 4: one complex64 ``freqs_cis`` table (1, s, d / 2), which the rope's complex muls
        # keep (NoPE layers use none)
        return s * a.head_dim * 4
    if FAMILIES[model.family].moe == "llama4":
        return 0  # every layer NoPE
    if not any(g.attention.rope for g in model.attention_groups):
        return 0  # (exaone4 with a window but no sliding layer: every layer NoPE)
    if fam.gemma4:
        # one (1, s, d) pair per layer type, each over its own head_dim (proportional rope: the
        # full-attention tables are global_head_dim wide, zero frequencies past the rotary share)
        widths = {g.window is None: g.attention.head_dim for g in model.groups if g.attention is not None}
        return sum(2 * s * w * dt.resid for w in widths.values())
    if fam.fp32_rope and dt.casts_layer_inputs:
        # FSDP2 casts OLMo's fp32 tables to bf16 at every decoder layer's pre-forward: each layer
        # saves its own copy, the fp32 tables themselves are not saved
        n = sum(g.count for g in model.attention_groups)
        return n * 2 * rows * s * width * dt.compute
    pairs = 2 if model.family == "gemma3_text" else 1
    if model.family == "olmo3":  # one pair per layer type the model has (sliding, full)
        pairs = len({g.window is not None for g in model.attention_groups})
    # OLMo's rotary embedding keeps its tables fp32 (no cast to the input dtype)
    return pairs * 2 * rows * s * width * (4 if fam.fp32_rope else dt.resid)


def _layer_copy_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, backend: str,
                      first_frozen: bool) -> int:
    """Autocast's compute-dtype copies of one layer's trainable weights that autograd saves."""
    prec = PRECISIONS[job.precision]
    if not job.precision.endswith("-mixed") or prec["compute"] == "fp32":
        return 0
    c = dt.compute
    if job.method == "full":
        n = _layer_matmul_weight_elems(model, g)
        if g.moe is not None:  # grouped_mm experts: no autocast kernel (CPU or CUDA), they run in fp32
            n -= g.moe.num_experts * 3 * model.hidden_size * g.moe.expert_intermediate_size
        return n * c
    if job.adapter_dtype == prec["compute"]:
        return 0  # adapters already in the compute dtype: nothing to copy
    n = _layer_adapter_elems(model, job, g) - (_first_layer_frozen_a(model, job) if first_frozen else 0)
    return n * c


def _layer_repeats(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int, first_frozen: bool,
                   backend: str) -> int:
    """Storages a decoder layer that is not checkpointed saves twice within TRL's window, which
    stay on the device: each norm's fp32 input and its rsqrt (saved by pow/rsqrt and again by the
    product), and in full fine-tuning the attention kernel's output (saved by the kernel and as
    o_proj's input)."""
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    post = FAMILIES[model.family].post_norms  # (olmo2: no input norm, so none the first layer skips)
    norms = g.norms_per_layer - (1 if first_frozen and not post else 0)
    out = norms * (t * h * 4 + t * 4)
    a = g.attention
    if a.qk_norm:  # per-head q/k norms: the same pattern per head row (whole-projection: per token)
        heads, kv = a.num_heads // tp, max(1, a.num_kv_heads // tp)
        rq, rk = (t, t) if a.qk_norm_whole else (t * heads, t * kv)
        out += t * heads * a.head_dim * 4 + rq * 4 + t * kv * a.head_dim * 4 + rk * 4
    # (on CPU a fused qkv or a partial rotary makes o_proj's input a separate copy: no repeat)
    if dt.full and job.attn_impl != "eager" and not a.is_mla and not (a.head_major_q and backend == "cpu"):
        out += t * (a.num_heads // tp) * a.v_head_dim * dt.compute
    return out


def _loss_events(model: ModelSpec, job: Job, dt: _Dtypes, tp: int,
                 backend: str) -> list[tuple[int, int, str | None]]:
    b, s = _batch_shape(job)
    t = b * s
    h = model.hidden_size
    v = model.vocab_size // tp
    c = dt.compute
    if job.materialises_logits:
        ev: list[tuple[int, int, str | None]] = []
        if model.final_logit_softcap:
            ev.append((t * v * c, t * v * c, "softcap"))
        ts = b * (s - 1) if job.loss == "hf-legacy" else t  # legacy: the shifted copy's rows
        tgt = 0 if job.loss == "hf-legacy" and b == 1 else ts * 8
        ev += [(ts * v * 4, ts * v * 4, "logsoftmax"), (ts * v * 4, ts * v * 4, "logsoftmax"),
               (tgt, tgt, "targets"), (4, 4, "total_weight")]
        return ev
    if job.loss == "liger":
        return [(t * h * dt.norm_out, t * h * dt.norm_out, "grad_input"), (t * 8, t * 8, "targets")]
    hb = dt.norm_out
    rows = b * (s - 1)
    n = job.micro_batch * (job.seq_len - 1) if job.is_padding_free else rows
    if backend == "cuda":  # only the positions with a label: index saves the mask, then a copy
        return [(rows, rows, "mask"), (n * h * hb, n * h * hb, "hidden"), (0, 0, None),
                (n * 8, n * 8, "targets"), (n * 4, n * 4, "log_z"), (n * 4, n * 4, "entropy"),
                (rows, rows, "mask"), (rows, rows, "mask"), (8, 8, "n_model"), (8, 8, "n_trainer")]
    # CPU: every position, from a view of the last hidden state (a copy when b > 1)
    hidden_dev = (s * h if b == 1 else rows * h) * hb
    return [(rows * h * hb, hidden_dev, "hidden"), (0, 0, None), (rows * 8, rows * 8, "targets"),
            (rows * 4, rows * 4, "log_z"), (rows * 4, rows * 4, "entropy"), (rows, rows, "not_mask1"),
            (rows, rows, "not_mask2"), (8, 8, "n_model"), (8, 8, "n_trainer")]


def _batch_shape(job: Job) -> tuple[int, int]:
    """(rows, tokens per row) the model sees: padding-free flattens the micro-batch into one row."""
    if job.is_padding_free:
        return 1, job.micro_batch * job.seq_len
    return job.micro_batch, job.seq_len


def saved_activation_bytes(model: ModelSpec, job: Job, layout: Layout | None = None,
                           *, backend: str = "cuda", engine_compute: str = "", quantized_base: bool = False) -> int:
    """Bytes autograd holds between forward and backward for one micro-batch on one GPU:
    activations plus the final norm, lm_head and loss tensors. Excludes weight copies (autocast
    casts are counted with the weights). ``engine_compute``: ``sharding.engine_compute`` of the job
    ``activation_job`` made this one from."""
    saved, logits_saved, _ = _activations(model, job, layout or Layout(), backend, engine_compute, quantized_base)
    return saved + logits_saved


def _activations(model: ModelSpec, job: Job, layout: Layout, backend: str = "cuda",
                 engine_compute: str = "", quantized_base: bool = False) -> tuple[int, int, int]:
    """(saved activations, logits+loss saved, backward transient) per GPU, on the device."""
    a = activation_parts(model, job, layout, backend=backend, engine_compute=engine_compute,
                         quantized_base=quantized_base)
    return a.device_saved_bytes, a.loss_saved_bytes, a.transient_bytes


@dataclass(frozen=True)
class ActivationParts:
    """What one micro-batch keeps for backward on one GPU, split the ways the variants need.

    ``layers_saved_bytes``: what autograd keeps of the decoder layers (checkpoint inputs of the
    checkpointed ones, everything of the others); ``sac_cache_bytes``: outputs that selective
    checkpointing caches (kept on the device by the SAC dispatch mode, never offloaded);
    ``model_level_bytes``: token ids, RoPE tables and the recompute closures; ``loss_saved_bytes``:
    final norm, lm_head and loss. With activation offloading, ``offloaded_bytes`` of them live in
    pinned host memory (``host_pinned_bytes`` after the host allocator's rounding) and
    ``device_saved_bytes`` is what stays on the GPU (activations component, loss part excluded).
    ``transient_bytes`` is the larger of the forward's and the backward's transients;
    ``forward_peak_bytes`` is everything live at the forward's peak (saved tensors, the loss's
    forward transient and ``autocast_cache_bytes``, the weight copies autocast's cache holds until
    the forward ends): the peak of a step that starts without gradients is the larger of it and
    ``device_saved_bytes + loss_saved_bytes + transient_bytes``.
    """

    layers_saved_bytes: int
    sac_cache_bytes: int
    model_level_bytes: int
    loss_saved_bytes: int
    transient_bytes: int
    recompute_bytes: int
    loss_transient_bytes: int
    checkpointed_layers: int
    offloaded_bytes: int = 0
    host_pinned_bytes: int = 0
    device_saved_bytes: int = 0
    autocast_cache_bytes: int = 0
    forward_peak_bytes: int = 0
    #: the loss's backward transient before the head's backward where it differs from
    #: ``loss_backward_bytes`` (torchtune's: the cross-entropies of every chunk first; None: the same)
    loss_ce_backward_bytes: int | None = None
    #: the larger of a checkpointed layer's recompute and a layer's eager-attention backward: what
    #: one layer's backward holds on top of the saved tensors
    layer_backward_bytes: int = 0
    #: what the first decoder layer keeps for backward (its checkpoint input when checkpointed)
    first_layer_saved_bytes: int = 0
    #: with ``job.torch_compile``: what the answer assumes about the compiled layers' saved set
    compile_note: str = ""
    #: the loss's forward and backward transients apart (``loss_transient_bytes`` is the larger)
    loss_forward_bytes: int = 0
    loss_backward_bytes: int = 0
    #: per layer group (``model.groups``), what its layers keep for backward together (checkpoint
    #: inputs and SAC caches of the checkpointed ones, everything of the others), before the first
    #: layer's discount and pipeline stages; ``layers_saved_bytes + sac_cache_bytes`` is the total
    group_saved_bytes: tuple[int, ...] = ()
    #: torchao NF4: one layer's dequantized weights (in ``recompute_bytes`` when checkpointing)
    nf4_dequant_bytes: int = 0
    #: what the loss side holds during the head's own backward, per call of the head (transformers'
    #: loss: the saved tensors but the cross-entropy's, which its backward has freed, and the
    #: logits' gradient in the compute dtype; torchtune's trained head: per chunk, see
    #: ``_torchtune_loss_bytes``); None where not planned apart (the loss's saved + backward bytes hold)
    head_backward_bytes: tuple[int, ...] | None = None


def activation_parts(model: ModelSpec, job: Job, layout: Layout | None = None, *,
                     backend: str = "cuda", consts: MemoryConstants | None = None,
                     engine_compute: str = "", quantized_base: bool = False) -> ActivationParts:
    """The activation side of the breakdown for one micro-batch on one GPU (see ActivationParts).
    ``engine_compute``: how a sharding engine runs ``job``, the compute-dtype job ``activation_job`` made
    (``sharding.engine_compute``: FSDP's autocast or DeepSpeed's cast); "" for the job itself.
    ``quantized_base``: the job ``activation_job`` made this one from is QLoRA (its decoder-layer
    linears are bitsandbytes 4-bit layers, which ZeRO-3's ``F.linear`` replacement does not see)."""
    layout = layout or Layout()
    consts = consts or memory_constants()
    compile_note = ""
    # (torchao NF4: the dequantize under torch.compile is fused, whatever the saved set is planned as)
    nf4_dequant = _nf4_dequant_bytes(model, job, job.torch_compile)
    if quantized_base and job.torch_compile:
        # sharded QLoRA runs as LoRA on compute-dtype weights (activation_job), but its linears are
        # bitsandbytes' 4-bit layers: the compiled saved set is not modelled there
        compile_note = _compile_note(model, job, _act_dtypes(job, backend, engine_compute), "method qlora")
        job = job.with_(torch_compile=False)
    dt = _act_dtypes(job, backend, engine_compute)
    if dt.engine_compute == "autocast" and layout.engine == "fsdp2":
        dt = dataclasses.replace(dt, casts_layer_inputs=True)
    if layout.strategy == "zero3" and not dt.full:
        dt = dataclasses.replace(dt, linear_saves_input=True, frozen_linears_save_input=not quantized_base)
    if (backend == "cpu" and job.uses_lora and model.is_moe and lora_wraps_experts(model, job.lora)
            and (dt.engine_compute or _adapter_compute_bytes(job, dt) != 4)):
        # PEFT's wrapped router builds its delta weight with lora.Linear.get_delta_weight, which on
        # CPU upcasts bf16 adapters (``weight.float()``: FSDP's / DeepSpeed's compute-dtype ones,
        # TRL's QLoRA recipe's bf16 ones): the matmul saves the fp32 copies of A (r x hidden) and
        # B (experts x r), under autocast (FSDP's, HF Trainer's) recast to bf16. On CUDA (and
        # with PEFT's fp32 adapters, whose autocast copies count with the weights) no copy
        moe = next(g.moe for g in model.groups if g.moe is not None)
        r_b = dt.compute if dt.engine_compute == "autocast" or (not dt.engine_compute and dt.autocast) else 4
        dt = dataclasses.replace(dt, router_delta_copy=r_b * job.lora.r * (model.hidden_size + moe.num_experts))
    tp, pp = layout.tp, layout.pp
    t = job.micro_batch * job.seq_len
    mode = job.ac_mode
    ep = getattr(layout, "ep", 1)
    per_layer = [(g, _layer_saved_bytes(g, model, job, dt, tp, backend, ep, _ep_rows(g, job, ep))
                  + _lowprec_layer_saved(g, model, job, dt, tp, backend)) for g in model.groups]
    ck_counts = _checkpointed_counts(model, job)
    saved = sac = 0
    recompute = 0
    group_saved: list[int] = []
    # an fp32-loaded LoRA base (or QLoRA's fp32 router) under autocast: each frozen matmul saves
    # its compute-dtype weight copy (for the input's gradient) where the layer is not checkpointed
    base_copy = [int(dtype_bytes(PRECISIONS[job.precision]["compute"])) * _frozen_copy_elems(model, job, g, backend)
                 for g in model.groups]
    # smollm3's NoPE layers share their group with the rope layers but can save k unrepeated
    nope = _nope_kv_savings(model, job, dt, tp)
    if mode == "none":
        group_saved = [g.count * (x + bc) for (g, x), bc in zip(per_layer, base_copy)]
        saved = sum(group_saved) - sum(nope.values())
        if not dt.full:
            saved -= (_compiled_first_layer_discount(model, job, dt) if _compiled(model.groups[0], model, job, dt)
                      else _first_layer_discount(model, job, dt, backend)) + _lowprec_first_layer(model, job, dt,
                                                                                                  backend)
    else:
        # HF non-reentrant (or reentrant) checkpointing keeps each checkpointed layer's
        # hidden-state input; selective checkpointing also caches the policy's op outputs; one
        # layer is recomputed at a time in backward (the cached outputs are reused, not remade)
        for (g, x), n_ck, bc in zip(per_layer, ck_counts, base_copy):
            cache = _sac_cache_bytes(g, model, job, dt, tp, backend)
            saved += n_ck * t * model.hidden_size * dt.resid + (g.count - n_ck) * (x + bc)
            sac += n_ck * cache
            group_saved.append(n_ck * (t * model.hidden_size * dt.resid + cache) + (g.count - n_ck) * (x + bc))
            if n_ck:
                recompute = max(recompute, x - cache + _lora_recompute_working_bytes(g, model, job, dt, t, tp),
                                x - cache + _eager_attention_backward_bytes(g, model, job, dt, tp, backend))
        if mode == "every-k":  # the NoPE layers that are not checkpointed
            saved -= sum(d for i, d in nope.items() if i % job.checkpoint_every)
        recompute += (_recompute_weight_copy_bytes(model, job, layout, backend)
                      + _lowprec_recompute_copies(model, job, layout))
        if recompute:
            recompute += nf4_dequant
    x0, bc0 = per_layer[0][1], base_copy[0]
    first_saved = t * model.hidden_size * dt.resid if ck_counts[0] else x0 + bc0
    # pipeline 1F1B: a stage holds layers/pp, for up to pp micro-batches in flight
    if pp > 1:
        inflight = min(pp, max(1, job.grad_accum))
        saved = saved * inflight // pp
        sac = sac * inflight // pp
    level = _model_level_saved(model, job, dt, tp) + _router_aux_loss_saved(model, job, dt, backend)
    # tensor parallelism as transformers runs it (the model's TP plan, lm_head "colwise_gather_output"):
    # the lm_head weight is split but its logits are gathered, so every rank holds all of them
    # (checked on CPU: tests/test_tp_memory.py)
    # torchtune's wrapping makes a trained output projection an FSDP2 unit: its weight gradients
    # are the engine's (sharding.fsdp2_transient_bytes)
    head_unit = (layout is not None and layout.engine == "fsdp2" and layout.fsdp_wrap == "torchtune"
                 and job.method == "full")
    logits_saved, loss_forward, loss_backward = _logits_bytes(model, job, dt, 1, backend, consts,
                                                              fsdp_head_unit=head_unit)
    if job.casts_fp32_base:
        # transformers' lm_head matmul saves its compute-dtype copy of the fp32 head (or tied
        # embedding) until the head's backward
        logits_saved += int(dtype_bytes(PRECISIONS[job.precision]["compute"])) * _head_copy_elems(model, job)
    logits_transient = max(loss_forward, loss_backward)
    head_backward = ce_backward = None
    if job.loss == "torchtune":
        _s, _f, ce_backward, head_backward = _torchtune_loss_bytes(
            model, job, dt, 1, _norm_saved(t, model.hidden_size, dt.resid, dt.full, style=_norm_style(model),
                                           weight_bytes=_norm_weight_bytes(dt), autocast=dt.autocast and backend == "cuda"),
            head_unit, split=True)
    elif job.loss == "hf" and not model.final_logit_softcap:
        # (the log-softmax's fp32 output, the int64 targets and the fp32 total weight are freed by
        # the cross-entropy's backward; see _logits_bytes)
        b, s = _batch_shape(job)
        v = model.vocab_size
        head_backward = (logits_saved - (t * v * 4 + 8 * (t if b > 1 else s + 1) + 4) + t * v * dt.compute
                         + (t * v * dt.compute if job.keep_output else 0),)
    # eager attention's backward in a layer that was not checkpointed (the checkpointed ones have
    # it in their recompute): score-sized gradients on top of everything saved
    attention_backward = max((_eager_attention_backward_bytes(g, model, job, dt, tp, backend)
                              for (g, _x), n_ck in zip(per_layer, ck_counts) if n_ck < g.count), default=0)
    offloaded = pinned = 0
    device = saved + sac + level
    loss_device = logits_saved
    if job.activation_offloading:
        offloaded, pinned, kept_layers, kept_loss = _offload_split(model, job, dt, tp, backend, consts)
        device = sac + kept_layers
        loss_device = kept_loss
        # in backward each checkpointed layer's input comes back before its recompute
        if mode != "none":
            recompute += t * model.hidden_size * dt.resid
    # the embedding-output leaf the graph holds outside the saved tensors (no hook sees it, so it
    # stays on the device with offloading)
    device += _embedding_leaf_bytes(model, job, dt)
    # the forward's peak: at the loss, with every checkpointed layer's autocast weight copies still
    # in autocast's cache (a layer's own forward transients are below its recompute in backward)
    cache = _autocast_cache_bytes(model, job, layout)
    forward_peak = device + loss_device + loss_forward + cache
    return ActivationParts(
        layers_saved_bytes=saved, sac_cache_bytes=sac, model_level_bytes=level,
        loss_saved_bytes=loss_device,
        transient_bytes=max(recompute, logits_transient, attention_backward, nf4_dequant),
        recompute_bytes=recompute,
        loss_transient_bytes=logits_transient, checkpointed_layers=sum(ck_counts),
        offloaded_bytes=offloaded, host_pinned_bytes=pinned, device_saved_bytes=device,
        autocast_cache_bytes=cache, forward_peak_bytes=forward_peak,
        layer_backward_bytes=max(recompute, attention_backward),
        first_layer_saved_bytes=first_saved,
        compile_note=_compile_note(model, job, dt) if job.torch_compile else compile_note,
        loss_forward_bytes=loss_forward, loss_backward_bytes=loss_backward, group_saved_bytes=tuple(group_saved),
        nf4_dequant_bytes=nf4_dequant, head_backward_bytes=head_backward, loss_ce_backward_bytes=ce_backward)


def moe_block_saved_bytes(model: ModelSpec, job: Job, *, ep: int = 1, ep_rows: int | None = None,
                          backend: str = "cuda") -> int:
    """Bytes one MoE block (router, experts, shared experts) of ``model``'s first MoE layer group
    saves for backward for one micro-batch; with ``ep`` > 1 on a rank that receives ``ep_rows``
    (token, expert) rows (default: the busiest rank's, see ftplan.expert_parallel)."""
    g = next(g for g in model.groups if g.moe is not None)
    wrapped = job.uses_lora and lora_wraps_experts(model, job.lora)
    rows = ep_rows if ep_rows is not None else _ep_rows(g, job, ep)
    return _moe_saved(g.moe, job.micro_batch * job.seq_len, model.hidden_size, _act_dtypes(job, backend), 1,
                      wrapped, ep=ep, ep_rows=rows)


def _ep_rows(g: LayerGroup, job: Job, ep: int) -> int | None:
    if ep <= 1 or g.moe is None:
        return None
    from .expert_parallel import ep_rows_per_rank

    return ep_rows_per_rank(job.micro_batch * job.seq_len, g.moe)


# ---------------------------------------------------------------------------------------------
# the whole breakdown
# ---------------------------------------------------------------------------------------------
def _llama4_note(model: ModelSpec, job: Job) -> str:
    """What a Llama 4 answer says: the text model planned, its all-linear targets, and
    transformers' dense expert dispatch."""
    m = next(g.moe for g in model.groups if g.moe is not None)
    out = ("Llama 4: planned as Llama4ForCausalLM, the text model AutoModelForCausalLM builds from text_config "
           "(transformers 5.24; the vision tower is not loaded); transformers' Llama4TextMoe runs every token "
           f"through all {m.num_experts} experts (router scores scale the experts' input, 0 outside the top-"
           f"{m.top_k}): expert activations and FLOPs are {m.num_experts // m.top_k}x a top-{m.top_k} dispatch's")
    cfg = model.config.get("text_config", model.config) if isinstance(model.config, Mapping) else {}
    att = cfg.get("attn_temperature_tuning") if isinstance(cfg, Mapping) else None
    if isinstance(att, int) and not isinstance(att, bool):
        out += (f"; config.json's attn_temperature_tuning {att} (as Meta published Scout's) is refused by "
                "transformers 5.24's strict Llama4TextConfig (a bool field): set it to true before loading")
    if job.uses_lora and "all-linear" in job.lora.target_modules:
        out += ("; LoRA all-linear is planned and exported as q/k/v/o and gate/up/down (PEFT 0.21's all-linear "
                "wraps Llama4Router, an nn.Linear returning a tuple, and its forward fails)")
    return out


def _gdn_kernel_note(model: ModelSpec, job: Job, layout: Layout) -> str:
    """How much less a Gated DeltaNet layer saves with the CUDA kernels (fla, causal-conv1d) than
    on transformers' torch path, which the plan counts, per layer and for the layers that keep
    theirs (all without checkpointing, one in the recompute with it)."""
    b, s = _batch_shape(job)
    dt = _act_dtypes(job, "cuda")
    tp = layout.tp
    diffs = [(g, _gdn_torch_core_bytes(g.linear_attention, b, s, dt, job, tp)
              - gdn_kernel_saved_bytes(g.linear_attention, b, s, dt.compute, tp))
             for g in model.groups if g.linear_attention is not None]
    per_layer = max(d for _, d in diffs)
    n = sum(g.count for g, _ in diffs)
    kept = sum((g.count - k) * d for (g, d), k in zip(diffs, [
        c for g2, c in zip(model.groups, _checkpointed_counts(model, job)) if g2.linear_attention is not None]))
    scope = (f"{kept / 2**30:,.2f} GiB over the {n} such layers" if kept else
             f"{per_layer / 2**30:,.2f} GiB in the one layer being recomputed (checkpointing)")
    return (f"Gated DeltaNet layers ({n}) planned on transformers' torch path (torch_chunk_gated_delta_rule, "
            f"causal_conv1d_fn): with flash-linear-attention and causal-conv1d installed each saves about "
            f"{per_layer / 2**20:,.0f} MiB less (fla keeps q, k, v, g, beta and the UT matrix, recomputes "
            f"the rest); the estimate is high by up to {scope}")


def _short_conv_kernel_note(model: ModelSpec, job: Job) -> str:
    """Which conv path LFM2's short-convolution layers are planned on, and what causal-conv1d's
    CUDA kernel would change (per layer: the conv output's K - 1 padded positions and an fp32
    weight's cast; the kernel writes an ``s``-long output)."""
    b, s = _batch_shape(job)
    dt = _act_dtypes(job, "cuda")
    h = model.hidden_size
    groups = [g for g in model.groups if g.short_conv is not None]
    n = sum(g.count for g in groups)
    diff = max(_short_conv_torch_conv_bytes(g.short_conv, b, s, h, dt)
               - short_conv_kernel_saved_bytes(g.short_conv, b, s, h, dt.base_out) for g in groups)
    return (f"short-convolution layers ({n}) planned on transformers' torch path (causal_conv1d_fn's F.conv1d); "
            f"with causal-conv1d installed (its CUDA kernel, which transformers then uses) each saves about "
            f"{abs(diff) / 2**10:,.0f} KiB {'less' if diff >= 0 else 'more'} (no padded conv output, no casts "
            "around the conv); not measured")


def _merged_experts_bytes(m: MoeSpec, h: int, e: int) -> int:
    """PEFT's ParamWrapper ``W + BA`` of every expert of one MoE layer (gate, up, down), in the
    experts' dtype ``e``: what grouped_mm saves for backward (see :func:`_moe_saved`)."""
    return m.num_experts * 3 * h * m.expert_intermediate_size * e


def _merged_experts_note(model: ModelSpec, job: Job, backend: str) -> str:
    """Without checkpointing, PEFT's ParamWrapper adapters on the fused experts keep each MoE
    layer's merged ``W + BA`` alive for backward (:func:`_merged_experts_bytes`, counted in the
    activations): say how much, and the two ways out. Empty when it is under 1 GiB."""
    e = _act_dtypes(job, backend).expert
    moe = [(g.count, _merged_experts_bytes(g.moe, model.hidden_size, e)) for g in model.groups
           if g.moe is not None and not g.moe.dense_dispatch]
    total = sum(n * b for n, b in moe)
    if total < 2**30:
        return ""
    return (f"LoRA on the experts (all-linear on a transformers-5 MoE): PEFT's ParamWrapper builds the merged "
            f"expert weights W + BA in every forward and grouped_mm saves them for backward, "
            f"{max(b for _, b in moe) / 2**30:,.2f} GiB per MoE layer, {total / 2**30:,.1f} GiB over "
            f"{sum(n for n, _ in moe)} layers without checkpointing (under ZeRO-3 / FSDP too: they are built from "
            "the gathered weights); `gradient_checkpointing` keeps one layer's at a time, "
            f"`lora_targets={attention_targets(model)}` leaves the experts frozen")


def _engine_qlora_recipe(job: Job, layout: Layout, notes: list[str]) -> Job:
    """Under FSDP and DeepSpeed both QLoRA recipes hold the same bytes: neither upcasts the
    non-quantized weights (they must share the 4-bit storage dtype to shard), accelerate upcasts
    FSDP's trainable parameters to fp32 for mixed precision and DeepSpeed keeps fp32 masters, so
    TRL's bf16 adapter cast does not survive. ``sharding.py`` models that one path."""
    if job.method != "qlora" or job.quant.recipe == "peft" or layout.engine not in ("deepspeed", "fsdp1", "fsdp2"):
        return job
    notes.append(f"qlora recipe trl under {layout.engine}: the engine holds what PEFT's recipe holds (no kbit "
                 "upcast, fp32 trainable parameters)")
    return job.with_(quant=dataclasses.replace(job.quant, recipe="peft"))


def _one_device_full_backward(job: Job, layout: Layout) -> bool:
    """Full fine-tuning on one unsharded device: the case whose backward ordering (saved tensors
    freed as gradients are made) ftplan models."""
    return (job.method == "full" and layout.world_size == 1 and layout.tp == 1
            and layout.pp == 1 and getattr(layout, "ep", 1) == 1 and not layout.offload_params
            and not layout.offload_optimizer and not job.activation_offloading and not job.low_precision)


def _fsdp2_moments(job: Job, layout: Layout, lm, act: ActivationParts) -> bool:
    """FSDP2 on a plain data-parallel layout: the case whose step ``sharding.fsdp2_moment_peak``
    walks moment by moment. FSDP1, ZeRO-3, tensor / pipeline / expert parallelism, activation
    offloading keep the sum of the separate peaks (saved activations + the largest activation
    transient + the engine's transient peak). The low-precision recipes' change of the transient
    (their casts, FP8 all-gathered layers) is added to the moment."""
    return (layout.engine == "fsdp2" and bool(lm.fsdp2_walk) and layout.tp == 1 and layout.pp == 1
            and getattr(layout, "ep", 1) == 1 and not job.activation_offloading
            and bool(act.group_saved_bytes))


def _fsdp2_moment(model: ModelSpec, job: Job, lm, act: ActivationParts) -> MomentPeak:
    """The FSDP2 step's largest moment (``sharding.fsdp2_moment_peak``) with ``act``'s activations
    placed on it: each decoder layer's saved bytes (its group's share; the first layer takes the
    difference to the total: its input needs no gradient under LoRA, NoPE layers), the model-level
    and embedding bytes from start to end, the loss's around the head, a layer's recompute / eager
    attention backward / NF4 dequantization at each layer's backward."""
    groups = model.groups
    per = [Fraction(act.group_saved_bytes[gi], groups[gi].count) for gi in layer_group_order(model)]
    layers = act.layers_saved_bytes + act.sac_cache_bytes
    per[0] += layers - sum(per)
    units, n, kw, grad_scale = lm.fsdp2_walk
    acts = ActivationSchedule(
        start_bytes=Fraction(act.device_saved_bytes - layers), layer_saved_bytes=tuple(per),
        layer_backward_bytes=Fraction(max(act.layer_backward_bytes, act.nf4_dequant_bytes)),
        loss_saved_bytes=Fraction(act.loss_saved_bytes), loss_forward_bytes=Fraction(act.loss_forward_bytes),
        loss_backward_bytes=Fraction(act.loss_backward_bytes if act.loss_ce_backward_bytes is None
                                     else act.loss_ce_backward_bytes), loss_in_forward=job.loss != "torchtune",
        head_backward_bytes=None if act.head_backward_bytes is None else tuple(map(Fraction, act.head_backward_bytes)),
        grad_scale=grad_scale if job.grad_accum == 1 else Fraction(0),
        grads_at_start=lm.gradients if job.grad_accum > 1 else Fraction(0), held_bytes=lm.autograd_held)
    return fsdp2_moment_peak(list(units), n, acts, **kw)


def _fsdp2_stream_pools(fm: MomentPeak, resident_default, other_default, peak_alloc: int, consts: MemoryConstants,
                        notes: list[str]) -> tuple[int, int]:
    """FSDP2 on CUDA: (``stream_pools``, ``allocator_reserve``), the reserved bytes beyond the
    allocated peak that FSDP2's side streams keep, and the fragmentation reserve of the default pool.

    The CUDA caching allocator gives a freed block only to an allocation on the stream that
    allocated it (c10/cuda/CUDACachingAllocator.cpp: blocks ordered by (stream, size),
    ``get_free_block``), and returns cached blocks to the driver only when an allocation fails or
    on ``empty_cache``. FSDP2 allocates from three streams (``sharding.fsdp2_moment_peak``'s
    ``pool_peaks``, read in torch 2.13's ``_fsdp_collectives.py``): its all-gather buffers under
    the copy-in stream (``foreach_all_gather``), its reduce-scatter outputs and the kept gradient
    shards under the reduce-scatter stream (``foreach_reduce``; HSDP's cast shards under the
    all-reduce stream), the rest (parameter shards, optimizer states, unsharded parameters and
    gradients, the reduce-scatter input, activations) on the default stream. From the second step on
    each side pool holds blocks as large as its own peak (``zero_grad(set_to_none=True)`` frees the
    gradient shards into the reduce-scatter pool), so reserved ~ the default pool's peak + each side
    pool's peak + the reserve (``allocator_reserve_fraction`` of the default pool's peak: the pool
    whose mixed sizes fragment). ``stream_pools`` is that sum less the allocated peak. The default
    pool's peak: the largest of the walk's with the resident states but the gradient shards
    (``resident_default``) and the other phases' default-pool bytes (``other_default``: the
    optimizer step, the forward's end)."""
    side = {p: int(fm.pool_peak(p)) for p in ("all_gather", "reduce_scatter", "all_reduce")}
    default = int(max(resident_default + fm.pool_peak("default"), other_default)) + consts.cublas_workspace_bytes
    reserve = max(int(default * consts.allocator_reserve_fraction), consts.allocator_reserve_min_bytes)
    extra = max(0, default + sum(side.values()) - peak_alloc)
    gib = 2**30
    notes.append(f"fsdp2 on CUDA: its all-gather stream keeps {side['all_gather'] / gib:,.2f} GiB and its reduce-scatter "
                 f"stream {side['reduce_scatter'] / gib:,.2f} GiB of cached blocks"
                 + (f" (the all-reduce stream {side['all_reduce'] / gib:,.2f} GiB)" if side["all_reduce"] else "")
                 + f" the compute stream cannot reuse (its own pool peaks at {default / gib:,.2f} GiB): "
                 f"+{extra / gib:,.2f} GiB reserved over the allocated peak (component stream_pools; CUDA caching "
                 "allocator, per-stream pools; read from torch 2.13's source, not measured on a GPU)")
    return extra, reserve


def _head_grad_bytes(model: ModelSpec, job: Job) -> int:
    """The gradients the loss's backward makes before any layer's: the output projection's (the
    tied embedding's when tied) and the final norm's weight."""
    g = int(dtype_bytes(PRECISIONS[job.precision]["grad"]))
    return g * (model.vocab_size * model.hidden_size + model.hidden_size)


def estimate_memory(
    model: ModelSpec,
    job: Job,
    layout: Layout | None = None,
    *,
    gpu_vendor: str | None = "nvidia",
    consts: MemoryConstants | None = None,
    backend: str = "cuda",
) -> MemoryBreakdown:
    """Per-GPU memory of ``job`` on ``model`` under ``layout``.

    ``backend="cpu"`` gives the CPU form of the kernel-dependent terms (what the CPU tests measure);
    predictions use ``"cuda"``.

    The forward/backward peak: full fine-tuning on one device and FSDP2 (``_fsdp2_moments``) take
    the largest of the step's moments, each with what is alive then (FSDP2: ``sharding.
    fsdp2_moment_peak``, the components and a note describing that moment); the other layouts
    (FSDP1, ZeRO, DDP, tensor / pipeline / expert parallelism) add the resident states, every saved
    activation, the largest activation transient and the engine's transient peak."""
    layout = layout or Layout()
    validate_job(model, job, layout)
    consts = consts or memory_constants()
    notes: list[str] = []
    job, attn_note = planned_attention(model, job)
    if attn_note:
        notes.append(attn_note)
    arch_note = planned_as_note(model.config)
    if arch_note:
        notes.append(arch_note)
    dropout_note = unmodelled_dropout_note(model.family, model.config)
    if dropout_note:
        notes.append(dropout_note)
    if _bmm_experts(model):
        notes.append(_llama4_note(model, job))
    qc = model.config.get("quantization_config") if isinstance(model.config, Mapping) else None
    if isinstance(qc, Mapping) and qc.get("quant_method") == "mxfp4":
        notes.append("checkpoint in MXFP4 (gpt-oss experts): planned on the bf16 weights transformers makes of it "
                     "with Mxfp4Config(dequantize=True), as training needs (the MXFP4 kernels are inference-only)"
                     + ("; QLoRA starts from a bf16 copy of the checkpoint (transformers refuses a "
                        "BitsAndBytesConfig for an MXFP4 one)" if job.method == "qlora" else ""))
    elif isinstance(qc, Mapping) and qc.get("quant_method") == "fp8":
        kind = "block-scaled FP8 (DeepSeek-V3 style)" if qc.get("weight_block_size") else "FP8"
        inner = model.config.get("text_config") if isinstance(model.config, Mapping) else None
        wrapped = isinstance(inner, Mapping) and inner.get("model_type") == "mistral4"
        notes.append(f"checkpoint in {kind}: planned on the bf16 weights transformers makes of it with "
                     "FineGrainedFP8Config(dequantize=True), "
                     + ("the text model only (the exported train.py refuses this Mistral3ForConditionalGeneration "
                        "checkpoint: it loads a Mistral4ForCausalLM copy of the text weights)" if wrapped
                        else "as the exported train.py loads it")
                     + ("; QLoRA starts from a bf16 copy of the checkpoint (transformers refuses a "
                        "BitsAndBytesConfig for an FP8 one)" if job.method == "qlora" else ""))
    job = _engine_qlora_recipe(job, layout, notes)
    st = model_states(model, job, consts)
    tp, pp = layout.tp, layout.pp
    mp = tp * pp  # model-parallel split of every weight

    lm = layout_memory(model, job, layout, st, consts, backend)
    frozen, trainable, master = lm.frozen_weights, lm.trainable_weights, lm.master_weights
    grads, opt, buffers, host = lm.gradients, lm.optimizer_states, lm.comm_buffers, lm.host
    if _autocast_recompute(job, layout) and job.method == "full":
        # HF Trainer's autocast under checkpointing: the layers' weight copies are dropped after
        # the forward and remade one layer at a time in backward (see the recompute transient);
        # only the lm_head (or tied embedding) copy stays, and those of layers not checkpointed
        outside = _head_copy_elems(model, job) + _uncheckpointed_layer_elems(
            model, job, lambda g: _layer_matmul_weight_elems(model, g))
        master = min(st.master_weights, dtype_bytes(PRECISIONS[job.precision]["compute"]) * outside) / mp
    notes.extend(lm.notes)

    if getattr(layout, "ep", 1) > 1:
        from .expert_parallel import ep_rank_states

        frozen, trainable, master, grads, opt = ep_rank_states(
            model, job, layout, st, frozen, trainable, master, grads, opt,
            master_outside_only=_autocast_recompute(job, layout) and job.method == "full")
        if layout.engine == "ddp" and buffers:
            buffers = grads  # DDP's buckets hold a copy of the (EP-split) gradients

    # FSDP's mixed precision and DeepSpeed's bf16 mode run the model on compute-dtype weights:
    # activations are those of pure compute-dtype training, but for an fp32 path transformers
    # keeps (FSDP runs under accelerate's autocast, DeepSpeed does not: sharding.engine_compute)
    if getattr(layout, "ep", 1) > 1 and job.uses_lora:
        # expert parallelism runs as transformers' load-time sharding: PEFT's adapters are plain
        # fp32 tensors outside FSDP, under HF Trainer's autocast, as on one GPU
        # (expert_parallel.ep_rank_states; measured on gloo, tests/test_ep_lora.py)
        act = activation_parts(model, job, layout, backend=backend, consts=consts)
    else:
        # (torchtune's QLoRA trains in one dtype already: its own activations, bf16 adapters included)
        act = activation_parts(model, job if job.torchao_nf4 else activation_job(job, lm), layout, backend=backend,
                               consts=consts,
                               engine_compute=engine_compute(job, layout), quantized_base=job.method == "qlora")
    saved, logits_saved, transient = act.device_saved_bytes, act.loss_saved_bytes, act.transient_bytes
    if act.compile_note:
        notes.append(act.compile_note)
    if act.host_pinned_bytes:
        # TRL activation offloading: pinned host copies (power-of-two blocks, cached across steps)
        host += act.host_pinned_bytes
        notes.append(f"activation offloading: {act.offloaded_bytes / 2**30:,.2f} GiB of saved tensors in "
                     f"pinned host memory ({act.host_pinned_bytes / 2**30:,.2f} GiB of pinned blocks)")
    # the engine's transients (gathered units, unsharded gradients, reduce buffers: sharding.py)
    transient += lm.transient + lm.autograd_held
    if job.optimizer == "paged_adamw_8bit":
        notes.append("paged optimizer: states can be evicted to host under pressure")
    c_act = int(dtype_bytes(PRECISIONS[job.precision]["compute"]))
    if job.keep_output and job.loss == "hf" and job.precision.endswith("-mixed") and c_act < 4:
        # accelerate's prepare() wraps the forward in convert_outputs_to_fp32 (measured on CPU:
        # tests/test_loss_peak_vs_torch.py); a plain torch.autocast loop keeps compute-dtype logits
        b, s = _batch_shape(job)
        extra = b * s * model.vocab_size * (4 - c_act)
        notes.append(f"kept model output: counted as {PRECISIONS[job.precision]['compute']} logits (a torch.autocast "
                     "loop); a model prepared by accelerate returns them in fp32 (convert_outputs_to_fp32), "
                     f"+{extra / 2**30:,.2f} GiB through backward")
    if getattr(layout, "ep", 1) > 1:
        from .expert_parallel import ep_dispatch_transient_bytes

        transient += ep_dispatch_transient_bytes(model, job, layout)
        notes.append(f"expert parallel ep={layout.ep}: {_experts_of(model) // layout.ep} experts per rank and MoE "
                     "layer; all-to-all buffers and the busiest rank's tokens included"
                     + ("; the LoRA adapters whole on every rank (PEFT adds them after transformers' expert-"
                        "parallel load: plain tensors neither FSDP nor EP shards)" if job.uses_lora else ""))

    lowprec_delta = 0
    if job.low_precision:
        before = transient
        master, transient = _lowprec_layout_terms(model, job, layout, master, transient, notes)
        # (the recipe's change of the transient: its casts' peak, FP8 all-gathered layers; applied
        # to FSDP2's moment as well)
        lowprec_delta = transient - before
    resident = frozen + trainable + master + grads + opt + buffers
    fwd_bwd = resident + saved + logits_saved + transient
    backward_moment = None
    # FSDP2: the step walked moment by moment (the engine's buffers, the activations alive then,
    # the gradient shards made so far), not the sum of the separate peaks
    fsdp2_moment = _fsdp2_moment(model, job, lm, act) if _fsdp2_moments(job, layout, lm, act) else None
    if fsdp2_moment is not None:
        # (on the default stream's pool too: the recipe's casts run there; its FP8 all-gather's
        # smaller all-gather pool is not planned)
        fsdp2_moment = dataclasses.replace(fsdp2_moment, total=fsdp2_moment.total + lowprec_delta,
                                           engine=fsdp2_moment.engine + lowprec_delta,
                                           pool_peaks=tuple((p, b + lowprec_delta if p == "default" else b)
                                                            for p, b in fsdp2_moment.pool_peaks))
        fwd_bwd = resident - grads + fsdp2_moment.total
    if _one_device_full_backward(job, layout):
        # full fine-tuning on one device: backward frees the saved tensors as it
        # makes the gradients (HF Trainer zeroes them with set_to_none after each step), so the
        # whole gradient set and the whole saved set never coexist. The step's peak is the largest
        # of the loss's backward (only the head's gradient exists), the last layer's backward
        # (everything saved but the loss's), the first layer's (every gradient, one layer's saved
        # tensors) and, with a tied embedding, the embedding's; between the layers' moments the
        # live bytes change linearly. Measured on an H100:
        # benchmarks/measurements/h100-sxm-peak-anatomy.json (the peak at TRL's loss backward
        # with the head's fp32 gradient alone; at the first layer's backward under checkpointing).
        # With accumulation every gradient is already there from the earlier micro-batches.
        head_grad = _head_grad_bytes(model, job) if job.grad_accum == 1 else int(grads)
        no_grads = resident - grads + head_grad
        # TRL's chunked log-prob backward accumulates the head's gradient in fp32 and casts it to
        # a narrower weight dtype at the end (trl/kernels/chunked_logprob.py)
        acc = (4 * model.vocab_size * model.hidden_size
               if job.loss == "trl" and dtype_bytes(PRECISIONS[job.precision]["grad"]) != 4 else 0)
        engine = transient - act.transient_bytes
        # a layer's MLP backward: the gradients of its two intermediate-wide branches (gate and up,
        # compute dtype) beside the saved tensors; from the H100 rows at 16 x 2048 tokens, where it
        # is what separates the first layer's moment from the measured peak (4 bytes per token per
        # intermediate unit on llama-3.2-1b and qwen2.5-0.5b)
        mlp_grads = 2 * job.micro_batch * job.seq_len * c_act * max(
            (g.mlp.intermediate_size for g in model.groups if g.mlp is not None), default=0)
        layer_bwd = act.layer_backward_bytes + mlp_grads
        moments = {
            "loss": (no_grads + saved + logits_saved + act.loss_transient_bytes + acc + engine,
                     head_grad, saved, logits_saved, act.loss_transient_bytes + acc + engine),
            "last layer": (no_grads + saved + layer_bwd + engine, head_grad, saved, 0, layer_bwd + engine),
            "first layer": (resident + act.model_level_bytes + act.first_layer_saved_bytes + layer_bwd + engine,
                            grads, act.model_level_bytes + act.first_layer_saved_bytes, 0, layer_bwd + engine),
        }
        if model.tie_word_embeddings:
            # the embedding's backward makes a dense vocabulary x hidden gradient and adds it to
            # the tied weight's, which the head's backward made: every gradient plus that one
            emb = int(dtype_bytes(PRECISIONS[job.precision]["grad"])) * model.vocab_size * model.hidden_size
            moments["embedding"] = (resident + act.model_level_bytes + emb + engine,
                                    grads, act.model_level_bytes, 0, emb + engine)
        name = max(moments, key=lambda k: moments[k][0])
        backward_moment = (name, *moments[name])
        fwd_bwd = backward_moment[1]
    # the forward's end: autocast's cache still holds every checkpointed layer's weight copies
    # (act.autocast_cache_bytes); the gradients are there only while accumulating (HF Trainer
    # zeroes them with set_to_none after each optimizer step)
    cache = act.autocast_cache_bytes
    engine_transient = transient - act.transient_bytes  # the engine's, EP's, the low-precision recipe's
    fwd_end = (resident - (grads if job.grad_accum == 1 else 0) + act.forward_peak_bytes
               + engine_transient) if cache else 0
    if fwd_end > fwd_bwd:
        notes.append(f"autocast cache: {cache / 2**30:,.2f} GiB of compute-dtype weight copies held until the "
                     "forward ends; with gradient accumulation the peak is at the end of the forward")
    # torchtune's FSDP2 wrapping: the engine's forward peak where it happens, beside what the
    # forward has saved by then (sharding.LayoutMemory.forward_transient; LoRA: at the first
    # layer, with the root's embedding, norm and output gathered and their all-gather output)
    fsdp_forward = 0
    if lm.forward_transient is not None and fsdp2_moment is None:
        done = lm.forward_layers_done
        first = act.model_level_bytes + act.first_layer_saved_bytes
        at_saved = saved if done >= 1 else min(saved, first + (saved - first) * done)
        at_logits = logits_saved if done >= 1 else 0
        fsdp_forward = int(resident - (grads if job.grad_accum == 1 else 0) + at_saved + at_logits
                           + lm.forward_transient)
    # optimizer step: fused AdamW has no whole-model temporaries; activations are freed
    shard = layout.shard_degree if layout.shards_params else 1
    step = resident + lm.step_transient + (_largest_layer_bytes(model, job, getattr(layout, "ep", 1)) / mp / shard
                                           if job.method == "full" else 0)
    if fsdp_forward > max(fwd_bwd, step, fwd_end):
        fwd_bwd = fsdp_forward
        if job.grad_accum == 1:
            grads = 0
        saved, logits_saved, transient = at_saved, at_logits, lm.forward_transient
        notes.append(f"fsdp2 (`fsdp_wrap` torchtune): the peak is in the forward, with "
                     f"{float(lm.forward_transient) / 2**30:,.2f} GiB of gathered units and all-gather outputs"
                     + (" at the first decoder layer (the root's embedding, norm and output gathered)"
                        if done == 0 else ""))
    peak_phase = ("forward_end" if fwd_end > max(fwd_bwd, step) else
                  "forward_backward" if fwd_bwd >= step else "optimizer_step")
    if peak_phase == "forward_end":
        # the components of that moment: the transient is the loss's forward transient and the
        # cached weight copies (the model states stay those of the step)
        transient = act.forward_peak_bytes - saved - logits_saved + engine_transient
    grads_total = None
    if peak_phase != "forward_end" and fsdp2_moment is not None:
        # (at an optimizer-step peak too: the components are those of the forward/backward's peak)
        fm = fsdp2_moment
        grads_total = int(grads)
        grads, saved, logits_saved, transient = fm.grads, fm.saved, fm.loss_saved, fm.engine + fm.act_transient
        notes.append(f"fsdp2: the forward/backward peak is at {fm.moment}: "
                     f"{float(fm.engine) / 2**30:,.2f} GiB of the engine's buffers (gathered units, unsharded "
                     f"gradients, reduce-scatter buffers), {float(fm.saved + fm.loss_saved) / 2**30:,.2f} GiB of "
                     f"saved activations, {float(fm.act_transient) / 2**30:,.2f} GiB of "
                     + ("the loss's transients" if "loss" in fm.moment else "the layer's backward transients"
                        if "layer" in fm.moment and "backward" in fm.moment else "activation transients")
                     + (f", {float(fm.grads) / 2**30:,.2f} of {float(grads_total) / 2**30:,.2f} GiB of "
                        "gradient shards made" if grads_total and job.grad_accum == 1 else ""))
    if peak_phase == "forward_backward" and backward_moment is not None:
        grads_total = int(grads)
        name, _total, grads, saved, logits_saved, transient = backward_moment
        notes.append(f"full fine-tuning: the peak is at the {name}'s backward, with "
                     + (("only the head's gradient made yet" if job.grad_accum == 1 else
                         "the earlier micro-batches' gradients") if name in ("loss", "last layer") else
                        "every gradient made and one layer's saved tensors left" if name == "first layer" else
                        "every gradient made and the embedding's own, added to the tied head's"))
    peak_alloc = int(max(fwd_bwd, step, fwd_end)) + consts.cublas_workspace_bytes
    reserve = max(int(peak_alloc * consts.allocator_reserve_fraction), consts.allocator_reserve_min_bytes)
    stream_pools = 0
    if fsdp2_moment is not None and backend == "cuda":
        all_grads = grads_total if grads_total is not None else grads
        # the default pool at the optimizer step and at the forward's end: the gradient shards
        # (in the reduce-scatter pool) left out
        other = max(step - all_grads, fwd_end - (all_grads if job.grad_accum > 1 else 0))
        stream_pools, reserve = _fsdp2_stream_pools(fsdp2_moment, resident - all_grads, other, peak_alloc, consts,
                                                    notes)
    peak_reserved = peak_alloc + stream_pools + reserve
    ctx = consts.context_bytes(gpu_vendor)
    # NCCL/RCCL communicators: device buffers outside the caching allocator, one set per process
    # group the rank runs collectives on
    groups = communicator_groups(layout)
    nccl = sum(consts.communicator_bytes(n) for _, n in groups)
    if groups:
        notes.append("NCCL communicators: " + ", ".join(f"{name} ({n} ranks)" for name, n in groups)
                     + f", {nccl / 2**30:,.2f} GiB of device buffers outside the caching allocator")
    components = {
        "cuda_context": ctx,
        "nccl_buffers": nccl,
        "frozen_weights": int(frozen),
        "trainable_weights": int(trainable),
        "master_weights": int(master),
        "gradients": int(grads),
        "optimizer_states": int(opt),
        "comm_buffers": int(buffers),
        "activations": int(saved),
        "logits_and_loss": int(logits_saved),
        "transient": int(transient) + consts.cublas_workspace_bytes,
        "stream_pools": stream_pools,
        "allocator_reserve": reserve,
    }
    if model.has_gated_deltanet and backend == "cuda":
        notes.append(_gdn_kernel_note(model, job, layout))
    if any(g.short_conv is not None for g in model.groups) and backend == "cuda":
        notes.append(_short_conv_kernel_note(model, job))
    drop = [g.attention for g in model.attention_groups if g.attention.dropout or g.attention.out_dropout]
    if drop:
        a0 = drop[0]
        kernel = ("eager attention keeps the probabilities' mask too" if job.attn_impl == "eager" else
                  "the attention kernel (flash / memory-efficient) keeps only its RNG state for the "
                  "probabilities' dropout (CPU sdpa instead runs its fp32 math kernel: not planned)")
        notes.append(f"dropout in training (config attention_dropout {a0.dropout:g}, residual_dropout "
                     f"{a0.out_dropout:g}): the residual dropouts keep a mask each (bool on CUDA); {kernel}; "
                     "set them to 0 in config.json to train without")
    n_router32 = _fp32_router_elems(model)
    if n_router32 and not casts_whole_module(job, layout.engine):
        notes.append(f"router weights in fp32 ({n_router32 * 4 / 2**20:,.0f} MiB whole; transformers >= 5.24 keeps "
                     "this family's mlp.gate.weight in fp32 whatever the model's dtype)")
    if job.method == "qlora" and model.is_moe:
        n_exp = model.params.experts
        u = float(dtype_bytes(job.unquantized_dtype))
        note = (f"qlora: the routed experts ({n_exp / 1e9:,.1f}B parameters, {n_exp / model.params.total:.0%} of the "
                "model) are 3-D parameters in transformers 5: bitsandbytes leaves them unquantized")
        if u > 2:
            note += (f", and prepare_model_for_kbit_training upcasts them to {job.unquantized_dtype} "
                     f"({n_exp * u / 2**30:,.1f} GiB against {n_exp * 2 / 2**30:,.1f} GiB in bf16 for LoRA)")
        notes.append(note)
    if job.ac_mode == "none" and job.uses_lora and lora_wraps_experts(model, job.lora):
        merged_note = _merged_experts_note(model, job, backend)
        if merged_note:
            notes.append(merged_note)
    return MemoryBreakdown(
        components=components,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_reserved,
        device_total_bytes=peak_reserved + ctx + nccl,
        host_bytes=int(host),
        params_total=st.params_total,
        params_trainable=st.params_trainable,
        peak_phase=peak_phase,
        notes=tuple(notes),
        gradients_total_bytes=grads_total,
    )


def largest_layer_params(model: ModelSpec, ep: int = 1) -> int:
    """Weights of the largest decoder layer (what ZeRO-3/FSDP gather at once); with expert
    parallelism a rank gathers only its ``num_experts / ep`` experts."""
    best = 0
    for g in model.groups:
        n = sum(lin.params for lin in layer_linears(model, g))
        if g.moe is not None:
            m = g.moe
            n += m.num_experts // max(1, ep) * 3 * model.hidden_size * m.expert_intermediate_size
        best = max(best, n)
    return best


def _largest_layer_bytes(model: ModelSpec, job: Job, ep: int = 1) -> int:
    c = int(dtype_bytes(PRECISIONS[job.precision]["compute"]))
    return largest_layer_params(model, ep) * c


# ---------------------------------------------------------------------------------------------
# low-precision recipes (FP8 / MXFP8 / NVFP4): the terms live in lowprec.py; these hooks apply
# them on top of the base precision's breakdown (Job.low_precision is None: all return 0/as is)
# ---------------------------------------------------------------------------------------------
def _lowprec_states(model: ModelSpec, job: Job, frozen_w: Fraction, master: Fraction) -> tuple[Fraction, Fraction]:
    """Quantized frozen base (weight-only recipes); compute-dtype weight copies kept for backward
    (torchao float8: none for converted weights; TE: FP8 workspaces; fp8-weight-only: dequantized
    copies) plus TE's amax histories, counted with the weight copies."""
    from . import lowprec

    r = lowprec.get_recipe(job.low_precision)
    if r is not None and r.kind == "weight_only":
        frozen_w = lowprec.quantized_weight_bytes(model, job, dtype_bytes(PRECISIONS[job.precision]["frozen"]))
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    master = master + lowprec.weight_copy_delta_bytes(model, job, targets=targets) \
        + lowprec.amax_history_bytes(model, job)
    return frozen_w, max(Fraction(0), master)


def _lowprec_layer_saved(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int, backend: str) -> int:
    if not job.low_precision:
        return 0
    from . import lowprec

    t = job.micro_batch * job.seq_len
    stream = dt.norm_out if dt.full else dt.resid
    return (lowprec.lora_extra_saved_bytes(g, model, job, t=t, compute=dt.compute, stream=stream, tp=tp,
                                           backend=backend)
            + lowprec.te_activation_delta_bytes(g, model, job, t=t, compute=dt.compute, stream=stream, tp=tp))


def _lowprec_first_layer(model: ModelSpec, job: Job, dt: _Dtypes, backend: str) -> int:
    if not job.low_precision:
        return 0
    from . import lowprec

    return lowprec.lora_first_layer_extra_bytes(model, job, t=job.micro_batch * job.seq_len,
                                                compute=dt.compute, stream=dt.resid, backend=backend)


def _lowprec_recompute_copies(model: ModelSpec, job: Job, layout: Layout) -> int:
    """Under checkpointing, the weight copies of the one recomputed layer: torchao float8 makes
    none for its converted weights; fp8-weight-only dequantizes the layer's base weights."""
    if not job.low_precision:
        return 0
    from . import lowprec

    r = lowprec.get_recipe(job.low_precision)
    if r is None:
        return 0
    c = int(dtype_bytes(PRECISIONS[job.precision]["compute"]))
    best = 0
    for g in model.groups:
        lins = layer_linears(model, g)
        if r.is_torchao_float8 and job.method == "full" and _autocast_recompute(job, layout):
            m = r.min_dim_multiple
            conv = sum(lin.in_features * lin.out_features for lin in lins
                       if lin.in_features % m == 0 and lin.out_features % m == 0)
            best = min(best, -c * conv)
        elif r.name == "fp8-weight-only":
            best = max(best, c * sum(lin.in_features * lin.out_features for lin in lins))
    if r.is_torchao_float8 and job.uses_lora and _autocast_recompute(job, layout):
        # converted (rank % 16 == 0) adapters make no compute-dtype copies when recomputed
        adapters = lowprec.converted_adapter_elems(model, job, lora_targets(model, job.lora))
        best = min(best, -(c * adapters // model.num_layers))
    return best


def _lowprec_layout_terms(model: ModelSpec, job: Job, layout: Layout, master: float, transient: float,
                          notes: list[str]) -> tuple[float, float]:
    from . import lowprec

    r = lowprec.get_recipe(job.low_precision)
    if r is None:
        return master, transient
    transient = max(transient, lowprec.fp8_transient_bytes(model, job))
    notes.append(f"{r.name}: {r.display} ({r.library}{', prototype' if r.status == 'prototype' else ''})")
    if r.is_te:
        notes.append(f"{r.name}: Transformer Engine terms are read from its source, not checked on CPU")
    if r.fsdp_float8_all_gather and layout.shards_params and layout.dp > 1:
        # ZeRO-3/FSDP gather one layer plus one prefetched: with FSDP2 float8 all-gather the
        # converted weights arrive (and stay unsharded) in FP8
        c = int(dtype_bytes(PRECISIONS[job.precision]["compute"]))
        bf16_layer = largest_layer_params(model) * c
        fp8_layer = lowprec.gathered_layer_bytes(model, job, largest_layer_params(model), c)
        transient -= 2 * (bf16_layer - fp8_layer) / (layout.tp * layout.pp)
        notes.append(f"{r.name}: FSDP2 float8 all-gather: converted weights are gathered in FP8")
    return master, transient
