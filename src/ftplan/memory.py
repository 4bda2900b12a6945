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

import math
from dataclasses import dataclass, field
from fractions import Fraction

from .catalog.constants import MemoryConstants, memory_constants
from .job import PRECISIONS, Job, Layout, lora_targets, lora_wraps_experts, validate_job
from .model import FAMILIES, LayerGroup, LinearSpec, MlpSpec, ModelSpec, MoeSpec
from .sharding import activation_job, layout_memory, quant_state_bytes
from .units import dtype_bytes

__all__ = [
    "MemoryBreakdown",
    "ModelStates",
    "estimate_memory",
    "model_states",
    "saved_activation_bytes",
    "trainable_params",
    "COMPONENTS",
]

#: component names, in report order
COMPONENTS = (
    "cuda_context",
    "frozen_weights",
    "trainable_weights",
    "master_weights",
    "gradients",
    "optimizer_states",
    "comm_buffers",
    "activations",
    "logits_and_loss",
    "transient",
    "allocator_reserve",
)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory of one job under one layout, in bytes."""

    components: dict[str, int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int  # reserved + CUDA context: what nvidia-smi shows
    host_bytes: int  # CPU RAM needed by offload (pinned optimizer states / params)
    params_total: int
    params_trainable: int
    peak_phase: str  # "forward_backward" or "optimizer_step"
    notes: tuple[str, ...] = field(default=())

    @property
    def model_states_bytes(self) -> int:
        c = self.components
        return (c["frozen_weights"] + c["trainable_weights"] + c["master_weights"]
                + c["gradients"] + c["optimizer_states"])

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
        return model.params.total, n_tensors
    mats = _lora_matrices(model, job)
    return sum(rows * cols * n for rows, cols, n in mats), sum(n for _, _, n in mats)


def _full_tensor_count(model: ModelSpec) -> int:
    n = 1  # embedding
    for lin in model.linears():
        if lin.is_module:
            n += lin.count * (2 if lin.bias else 1)
        else:  # fused experts: one 3-D tensor per layer, not per expert
            n += lin.count // _experts_of(model)
    n += 1  # final norm
    for g in model.groups:
        per = g.norms_per_layer + (2 if g.attention.qk_norm else 0)
        if g.attention.is_mla:
            per += 1 + (1 if g.attention.q_lora_rank else 0)
        if g.moe is not None:
            per += 1  # router weight
        n += g.count * per
    return n


def _experts_of(model: ModelSpec) -> int:
    for g in model.groups:
        if g.moe is not None:
            return g.moe.num_experts
    return 1


# ---------------------------------------------------------------------------------------------
# model states
# ---------------------------------------------------------------------------------------------
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
    for g in model.groups:
        if g.moe is not None:
            out.append((g.moe.num_experts, h, g.moe.num_experts * h, g.count))
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
    out = [(h, 1)]
    for lin in model.linears():
        if lin.bias:
            out.append((lin.out_features, lin.count))
    for g in model.groups:
        a = g.attention
        out.append((h, g.count * g.norms_per_layer))
        if a.qk_norm:
            out.append((a.head_dim, 2 * g.count))
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
    consts = quant_state_bytes(model, job)
    quant_bytes = Fraction(quantized, 2) + consts
    # biases of quantized layers stay in the compute dtype
    unquantized = model.params.total - quantized
    return quant_bytes, Fraction(unquantized)


def _autocast_weight_elems(model: ModelSpec, backend: str = "cuda") -> int:
    """Weights autocast copies to the compute dtype and keeps for backward: every matmul weight
    (nn.Linear weights without biases, MoE routers, the lm_head or the tied embedding). On CUDA the
    grouped_mm experts are autocast too; on CPU they run in fp32."""
    n = 0
    for lin in model.linears():
        if lin.is_module or backend == "cuda":
            n += lin.count * lin.in_features * lin.out_features
    n += model.params.router
    if model.tie_word_embeddings:
        n += model.params.embedding
    return n


def _first_layer_frozen_a(model: ModelSpec, job: Job) -> int:
    """lora_A elements of the first layer's projections that read the (grad-free) layer input."""
    if not job.uses_lora:
        return 0
    targets = lora_targets(model, job.lora)
    return sum(job.lora.r * lin.in_features for lin in _group_linears(model, model.groups[0])
               if lin.module in _READS_LAYER_INPUT and lin.module in targets)


def _autocast_recompute(job: Job, layout: Layout) -> bool:
    """Autocast copies follow checkpointing (single GPU / DDP under HF Trainer); ZeRO and FSDP
    keep their own compute-dtype working copy of the weights instead."""
    return (job.gradient_checkpointing and job.precision.endswith("-mixed")
            and not (layout.shards_params or layout.shards_optimizer))


def _recompute_weight_copy_bytes(model: ModelSpec, job: Job, layout: Layout) -> int:
    """Under checkpointing with autocast, the compute-dtype weight copies of the one layer being
    recomputed in backward (all matmul weights in full fine-tuning, the adapters with LoRA)."""
    prec = PRECISIONS[job.precision]
    if not _autocast_recompute(job, layout):
        return 0
    c = int(dtype_bytes(prec["compute"]))
    if job.method == "full":
        return c * largest_layer_params(model) if prec["trainable"] != prec["compute"] else 0
    n_train, _ = trainable_params(model, job)
    return c * -(-n_train // model.num_layers)


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
        master = dtype_bytes(prec["compute"]) * _autocast_weight_elems(model) if mixed else Fraction(0)
        grad_b = dtype_bytes(prec["grad"])
        param_b = dtype_bytes(train_dtype)
    else:
        # PEFT keeps adapters in fp32 (autocast_adapter_dtype=True) whatever the base dtype
        trainable_w = Fraction(4) * n_train
        # autocast's compute-dtype copies of the fp32 adapters, kept for backward (under
        # checkpointing one layer's worth at a time, counted with the recompute transient);
        # lora_A of the first layer's q/k/v reads a grad-free input, so its copy is not kept
        copies = 0 if job.gradient_checkpointing else n_train - _first_layer_frozen_a(model, job)
        master = dtype_bytes(prec["compute"]) * copies if prec["compute"] != "fp32" and \
            job.precision.endswith("-mixed") else Fraction(0)
        grad_b = Fraction(4)
        param_b = Fraction(4)
        if job.method == "lora":
            frozen_w = dtype_bytes(prec["frozen"]) * total
        else:
            quant_bytes, unq = _qlora_frozen_bytes(model, job)
            # prepare_model_for_kbit_training upcasts every non-quantized weight to fp32
            frozen_w = quant_bytes + 4 * unq
    grads = grad_b * n_train
    opt = _optimizer_bytes(job, n_train, n_tensors, param_b, model, consts)
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


def _act_dtypes(job: Job, backend: str) -> _Dtypes:
    prec = PRECISIONS[job.precision]
    compute = int(dtype_bytes(prec["compute"]))
    if job.method == "full":
        w = int(dtype_bytes(prec["trainable"]))
        resid = w
        norm_w = w
    elif job.method == "lora":
        resid = norm_w = int(dtype_bytes(prec["frozen"]))
        w = 0
    else:  # qlora: prepare_model_for_kbit_training upcasts embedding and norms to fp32
        resid = norm_w = 4
        w = 0
        compute = int(dtype_bytes(job.quant.compute_dtype))
    # transformers' grouped_mm experts: autocast covers them on CUDA; on CPU they run in the
    # weight dtype
    expert = compute if backend == "cuda" else (w or resid)
    norm_out = max(norm_w, resid)
    # bitsandbytes' Linear4bit casts its output back to its input's dtype (fp32 after
    # prepare_model_for_kbit_training); other linears produce the compute dtype
    base_out = norm_out if job.method == "qlora" else compute
    return _Dtypes(compute=compute, resid=resid, train_w=w, norm_out=norm_out,
                   full=job.method == "full", expert=expert, autocast=job.precision.endswith("-mixed"),
                   base_out=base_out)


def _norm_saved(t: int, width: int, in_bytes: int, trainable: bool, *, rows: int | None = None,
                gemma: bool = False, weight: int | None = None) -> int:
    """Bytes one RMSNorm call saves over ``t`` tokens of ``width`` features (``rows`` rsqrt
    values: ``t``, or ``t`` x heads for per-head q/k norms).

    llama style (``x.float()``, ``x * rsqrt(mean(x^2) + eps)``, cast back, ``weight * x``): the
    fp32 input (a fresh copy unless it already is fp32), the fp32 rsqrt, and, when the weight is
    trainable, the normalised tensor cast back to the input dtype. gemma style computes entirely
    in fp32 and scales by ``1 + weight``: the normalised tensor stays fp32 and the fp32
    ``1 + weight`` vector (``weight`` elements: ``width``, or the head dim) is saved too."""
    rows = t if rows is None else rows
    out = t * width * 4 + rows * 4
    if gemma:
        out += (width if weight is None else weight) * 4 + (t * width * 4 if trainable else 0)
    elif trainable:
        out += t * width * in_bytes
    return out


def _linear_inputs(t: int, width: int, n_consumers: int, in_bytes: int, dt: _Dtypes) -> int:
    """Inputs saved by ``n_consumers`` trainable linears reading one tensor of ``in_bytes``:
    autocast makes one copy per linear when the input is not in the compute dtype."""
    if not dt.full or n_consumers == 0:
        return 0
    return (n_consumers if in_bytes != dt.compute else 1) * t * width * dt.compute


def _layer_saved_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int,
                       backend: str) -> int:
    """Bytes autograd saves for one decoder layer of group ``g`` for one micro-batch."""
    b, s = job.micro_batch, job.seq_len
    t = b * s
    h = model.hidden_size
    a = g.attention
    c = dt.compute
    heads = a.num_heads // tp
    gemma = FAMILIES[model.family].norm_style == "gemma"
    total = _norm_saved(t, h, dt.resid, dt.full, gemma=gemma)  # input norm
    if g.norms_per_layer == 4:  # gemma: post-attention norm (on o_proj output) and pre/post feed-forward
        total += 2 * _norm_saved(t, h, c, dt.full, gemma=gemma) + _norm_saved(t, h, dt.resid, dt.full, gemma=gemma)
    else:
        total += _norm_saved(t, h, dt.resid, dt.full, gemma=gemma)  # post-attention norm
    masked = g.window is not None and s > g.window and job.attn_impl != "flash"
    if a.is_mla:
        total += _mla_saved(a, t, b, s, h, dt, heads, backend)
    else:
        q = heads * a.head_dim
        kv_heads = max(1, a.num_kv_heads // tp)
        gqa_native = job.attn_impl == "flash" or (job.attn_impl == "sdpa" and not masked and a.head_dim <= 256)
        kv_saved = kv_heads if gqa_native else heads
        total += _linear_inputs(t, h, 1 if a.fused_qkv else 3, dt.norm_out if dt.full else dt.resid, dt)
        if a.qk_norm:  # per-head norms on the q/k projections (compute dtype)
            total += _norm_saved(t, q, c, dt.full, rows=t * heads, gemma=gemma, weight=a.head_dim)
            total += _norm_saved(t, kv_heads * a.head_dim, c, dt.full, rows=t * kv_heads, gemma=gemma,
                                 weight=a.head_dim)
        if job.attn_impl == "eager":
            total += t * q * c + 2 * t * heads * a.head_dim * c  # q and repeated k, v
            # fp32 softmax output and (when the compute dtype is narrower) its cast for the matmul
            total += b * heads * s * s * (4 + (c if c != 4 else 0))
            if a.softcap:
                total += b * heads * s * s * c  # tanh output of the soft-capping
            total += t * q * c if dt.full else 0  # o_proj input (contiguous copy of the output)
        else:
            total += t * q * c + 2 * t * kv_saved * a.head_dim * c  # q, k, v after rope
            total += t * heads * a.v_head_dim * c + b * heads * s * 4  # output + logsumexp
            if a.fused_qkv and dt.full and backend == "cpu":
                # q sliced from the fused projection is made contiguous head-major, so the CPU
                # kernel's output is too and o_proj's input is a separate contiguous copy
                total += t * heads * a.v_head_dim * c
            if masked:
                total += b * s * s * c  # sdpa's float copy of the sliding-window mask, per layer
    if g.mlp is not None:
        total += _mlp_saved(g.mlp, t, h, dt, tp, g.norms_per_layer == 4)
    if g.moe is not None:
        total += _moe_saved(g.moe, t, h, dt, tp, job.uses_lora and lora_wraps_experts(model, job.lora))
    total += _lora_saved(g, model, job, dt, t, tp, backend)
    return total


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


def _moe_saved(m: MoeSpec, t: int, h: int, dt: _Dtypes, tp: int, wrapped: bool = False) -> int:
    """One MoE layer. ``wrapped``: PEFT ParamWrapper LoRA on the experts and the router, which
    materialise ``W + BA`` (compute dtype) for every expert and the router in each forward; a
    frozen router does not save its input."""
    routed = t * m.top_k
    e = dt.expert
    c = dt.compute
    i = m.expert_intermediate_size
    # router: its input copy in the compute dtype, the expert probabilities, top-k ids, the
    # normaliser and the normalised top-k weights; then the per-row weights the experts multiply
    if m.router == "deepseek_v3":
        # an fp32 linear (autocast turns it back to the compute dtype); the sigmoid scores and
        # the top-k weights stay in the logits' dtype
        r = c if dt.autocast else 4
        router_in = t * h * r
        out = t * m.num_experts * r + routed * 8 + t * r + routed * r
        per_row = routed * r  # scaled by routed_scaling_factor: a new tensor
    else:  # softmax in fp32
        router_in = t * h * c
        out = t * m.num_experts * 4 + routed * 8 + t * 4 + routed * 4
        if m.router == "qwen3_moe":  # cast back to the logits' dtype (a no-op in fp32)
            per_row = routed * c if c != 4 else 0
        else:
            per_row = routed * 4
    if dt.full or wrapped:
        out += router_in
    if wrapped:  # the merged router and expert weights
        out += m.num_experts * h * c + m.num_experts * 3 * h * i * c
    # experts (grouped_mm): three index vectors, gathered inputs, gate_up output, act output,
    # product, per-row weights, down output; offsets per expert
    out += 3 * routed * 8 + m.num_experts * 4 + per_row
    out += routed * e * (h + 2 * i + i + i + h)
    if m.shared is not None:
        out += _mlp_saved(m.shared, t, h, dt, tp, False)
    return out // max(1, tp) if tp > 1 else out


def _mla_saved(a, t: int, b: int, s: int, h: int, dt: _Dtypes, heads: int, backend: str) -> int:
    c = dt.compute
    out = 0
    n_in = (1 if a.q_lora_rank else 1) + 1  # q_a (or q) and kv_a read the normed input
    out += _linear_inputs(t, h, n_in, dt.norm_out, dt)
    if a.q_lora_rank:
        out += _norm_saved(t, a.q_lora_rank, c, dt.full) + (t * a.q_lora_rank * c if dt.full else 0)
    out += _norm_saved(t, a.kv_lora_rank, c, dt.full) + (t * a.kv_lora_rank * c if dt.full else 0)
    qk = heads * a.head_dim
    v = heads * a.v_head_dim
    if backend == "cpu":
        # qk and v head dims differ: sdpa falls back to the math kernel, which on CPU upcasts to
        # fp32 and keeps q, k^T, the softmax and v; its output comes back as a separate tensor
        out += 2 * t * qk * 4 + b * heads * s * s * 4 + t * v * 4 + (t * v * c if dt.full else 0)
    else:  # memory-efficient kernel: q, k, v, output, logsumexp
        out += 2 * t * qk * c + t * v * c + t * v * c + b * heads * s * 4
    return out


def _lora_saved(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, t: int, tp: int,
                backend: str) -> int:
    """Per decoder layer: PEFT casts the input to the adapter dtype (fp32), applies dropout
    (CUDA saves a bool mask, CPU a mask in the input dtype), autocast copies the dropout output
    for ``lora_A`` and ``lora_B`` saves its r-wide input."""
    if not job.uses_lora:
        return 0
    targets = lora_targets(model, job.lora)
    r = job.lora.r
    c = dt.compute
    mask = 0 if job.lora.dropout == 0 else (1 if backend == "cuda" else 4)
    out = 0
    for lin in _group_linears(model, g):
        if lin.is_module and lin.module in targets:
            width = lin.in_features
            out += t * width * (mask + c) + t * r * c
    return out


def _group_linears(model: ModelSpec, g: LayerGroup) -> list[LinearSpec]:
    from .model import attention_linears as _attention_linears, mlp_linears as _mlp_linears

    out = _attention_linears(g.attention, model.hidden_size, 1)
    if g.mlp is not None:
        out += _mlp_linears(g.mlp, model.hidden_size, 1, "mlp")
    if g.moe is not None and g.moe.shared is not None:
        out += _mlp_linears(g.moe.shared, model.hidden_size, 1, "mlp")
    return out


def _logits_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> tuple[int, int]:
    """(saved, transient) bytes of the final norm, lm_head and loss in transformers 5.

    ``ForCausalLMLoss`` upcasts the logits to fp32 and cross-entropy's log-softmax saves its fp32
    output; the shifted labels (int64) are saved too. Transient: the compute-dtype logits, their
    fp32 copy, and in backward the fp32 gradient of the log-softmax and its cast.
    """
    t = job.micro_batch * job.seq_len
    h = model.hidden_size
    v = model.vocab_size // tp
    c = dt.compute
    saved = _norm_saved(t, h, dt.resid, dt.full, gemma=FAMILIES[model.family].norm_style == "gemma")
    saved += _linear_inputs(t, h, 1, dt.norm_out, dt)
    if job.uses_lora and "lm_head" in job.lora.target_modules:
        saved += t * h * (c + 1) + t * job.lora.r * c
    # fp32 log-softmax, the shifted int64 targets (with b = 1 the slice of the padded labels is
    # already contiguous, so the whole (1, s + 1) storage stays), the fp32 total weight
    saved += t * v * 4 + 8 * (t if job.micro_batch > 1 else job.seq_len + 1) + 4
    if job.method == "qlora" and dt.autocast and c != 4:
        # prepare_model_for_kbit_training keeps lm_head in fp32: autocast's compute-dtype copy of
        # the (frozen) weight is saved for the input gradient
        saved += model.vocab_size // tp * h * c
    if model.final_logit_softcap:
        saved += t * v * c  # tanh output
    transient = t * v * (c + 4 + 4)
    return saved, transient


#: attention projections that read the (normed) decoder-layer input
_READS_LAYER_INPUT = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa"})


def _first_layer_discount(model: ModelSpec, job: Job, dt: _Dtypes, backend: str) -> int:
    """With a frozen embedding (LoRA/QLoRA, no checkpointing) the first layer's input does not
    require grad: its input norm saves nothing and the LoRA dropouts reading it keep no mask."""
    t = job.micro_batch * job.seq_len
    h = model.hidden_size
    out = _norm_saved(t, h, dt.resid, False, gemma=FAMILIES[model.family].norm_style == "gemma")
    if job.uses_lora and job.lora.dropout > 0:
        mask = 1 if backend == "cuda" else 4
        targets = lora_targets(model, job.lora)
        first = _group_linears(model, model.groups[0])
        for lin in first:
            if lin.module in _READS_LAYER_INPUT and lin.module in targets:
                out += t * h * mask
    return out


def _model_level_saved(model: ModelSpec, job: Job, dt: _Dtypes) -> int:
    """Tensors saved once per model: token ids, the shared RoPE tables and, under (non-reentrant)
    checkpointing, what the layers' recompute closures capture: position ids and any
    materialised attention mask (eager: ``(b, 1, s, s)`` in the residual dtype per distinct layer
    type; sdpa: a ``(1, 1, s, s)`` bool per sliding window shorter than the sequence)."""
    b, s = job.micro_batch, job.seq_len
    t = b * s
    a = model.attention
    out = t * 8 if dt.full else 0  # embedding backward keeps the token ids
    if not a.is_mla:
        n_rope = 2 if model.family == "gemma3_text" else 1
        out += n_rope * 2 * s * a.head_dim * dt.resid  # RoPE cos, sin: (1, s, d), shared
    else:
        out += 2 * s * a.qk_rope_head_dim * dt.resid
    if job.gradient_checkpointing:
        out += s * 8  # position_ids
        kinds = {g.window if g.window is not None and s > g.window else None for g in model.groups}
        if job.attn_impl == "eager":
            out += len(kinds) * b * s * s * dt.resid
        elif job.attn_impl == "sdpa":
            out += sum(s * s for w in kinds if w is not None)
    return out


def saved_activation_bytes(model: ModelSpec, job: Job, layout: Layout | None = None,
                           *, backend: str = "cuda") -> int:
    """Bytes autograd holds between forward and backward for one micro-batch on one GPU:
    activations plus the final norm, lm_head and loss tensors. Excludes weight copies (autocast
    casts are counted with the weights)."""
    saved, logits_saved, _ = _activations(model, job, layout or Layout(), backend)
    return saved + logits_saved


def _activations(model: ModelSpec, job: Job, layout: Layout, backend: str = "cuda") -> tuple[int, int, int]:
    """(saved activations, logits+loss saved, backward transient) per GPU."""
    dt = _act_dtypes(job, backend)
    tp, pp = layout.tp, layout.pp
    t = job.micro_batch * job.seq_len
    per_layer = [(g, _layer_saved_bytes(g, model, job, dt, tp, backend)) for g in model.groups]
    if job.gradient_checkpointing:
        # HF non-reentrant checkpointing keeps each layer's hidden-state input; one layer is
        # recomputed at a time in backward
        saved = sum(g.count * t * model.hidden_size * dt.resid for g, _ in per_layer)
        recompute = max(x for _, x in per_layer) + _recompute_weight_copy_bytes(model, job, layout)
    else:
        saved = sum(g.count * x for g, x in per_layer)
        recompute = 0
        if not dt.full:
            saved -= _first_layer_discount(model, job, dt, backend)
    # pipeline 1F1B: a stage holds layers/pp, for up to pp micro-batches in flight
    saved = saved * min(pp, max(1, job.grad_accum)) // pp if pp > 1 else saved
    saved += _model_level_saved(model, job, dt)
    logits_saved, logits_transient = _logits_bytes(model, job, dt, tp)
    transient = max(recompute, logits_transient)
    return saved, logits_saved, transient


# ---------------------------------------------------------------------------------------------
# the whole breakdown
# ---------------------------------------------------------------------------------------------
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
    predictions use ``"cuda"``."""
    layout = layout or Layout()
    validate_job(model, job, layout)
    consts = consts or memory_constants()
    st = model_states(model, job, consts)
    tp, pp = layout.tp, layout.pp
    mp = tp * pp  # model-parallel split of every weight
    notes: list[str] = []

    lm = layout_memory(model, job, layout, st, consts, backend)
    frozen, trainable, master = lm.frozen_weights, lm.trainable_weights, lm.master_weights
    grads, opt, buffers, host = lm.gradients, lm.optimizer_states, lm.comm_buffers, lm.host
    if _autocast_recompute(job, layout) and job.method == "full":
        # HF Trainer's autocast under checkpointing: the layers' weight copies are dropped after
        # the forward and remade one layer at a time in backward (see the recompute transient);
        # only the lm_head (or tied embedding) copy stays
        outside = model.params.lm_head + (model.params.embedding if model.tie_word_embeddings else 0)
        master = min(st.master_weights, dtype_bytes(PRECISIONS[job.precision]["compute"]) * outside) / mp
    notes.extend(lm.notes)

    # FSDP's mixed precision and DeepSpeed's bf16 mode run the model on compute-dtype weights:
    # activations are those of pure compute-dtype training
    saved, logits_saved, transient = _activations(model, activation_job(job, lm), layout, backend)
    transient += lm.transient + lm.autograd_held
    if job.optimizer == "paged_adamw_8bit":
        notes.append("paged optimizer: states can be evicted to host under pressure")

    resident = frozen + trainable + master + grads + opt + buffers
    fwd_bwd = resident + saved + logits_saved + transient
    # optimizer step: fused AdamW has no whole-model temporaries; activations are freed
    shard = layout.shard_degree if layout.shards_params else 1
    step = resident + lm.step_transient + (_largest_layer_bytes(model, job) / mp / shard
                                           if job.method == "full" else 0)
    peak_phase = "forward_backward" if fwd_bwd >= step else "optimizer_step"
    peak_alloc = int(max(fwd_bwd, step)) + consts.cublas_workspace_bytes
    reserve = max(int(peak_alloc * consts.allocator_reserve_fraction), consts.allocator_reserve_min_bytes)
    peak_reserved = peak_alloc + reserve
    ctx = consts.context_bytes(gpu_vendor)
    components = {
        "cuda_context": ctx,
        "frozen_weights": int(frozen),
        "trainable_weights": int(trainable),
        "master_weights": int(master),
        "gradients": int(grads),
        "optimizer_states": int(opt),
        "comm_buffers": int(buffers),
        "activations": int(saved),
        "logits_and_loss": int(logits_saved),
        "transient": int(transient) + consts.cublas_workspace_bytes,
        "allocator_reserve": reserve,
    }
    if job.method == "qlora" and model.is_moe:
        notes.append("qlora: routed experts are 3-D parameters in transformers 5 and stay unquantized")
    return MemoryBreakdown(
        components=components,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_reserved,
        device_total_bytes=peak_reserved + ctx,
        host_bytes=int(host),
        params_total=st.params_total,
        params_trainable=st.params_trainable,
        peak_phase=peak_phase,
        notes=tuple(notes),
    )


def largest_layer_params(model: ModelSpec) -> int:
    """Weights of the largest decoder layer (what ZeRO-3/FSDP gather at once)."""
    best = 0
    for g in model.groups:
        n = sum(lin.params for lin in _group_linears(model, g))
        if g.moe is not None:
            m = g.moe
            n += m.num_experts * 3 * model.hidden_size * m.expert_intermediate_size
        best = max(best, n)
    return best


def _largest_layer_bytes(model: ModelSpec, job: Job) -> int:
    c = int(dtype_bytes(PRECISIONS[job.precision]["compute"]))
    return largest_layer_params(model) * c
