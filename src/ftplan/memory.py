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
from .job import PRECISIONS, Job, Layout, lora_targets, validate_job
from .model import LayerGroup, LinearSpec, ModelSpec
from .units import GIB, dtype_bytes

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
    r = job.lora.r
    count = 0
    tensors = 0
    for lin in _lora_linears(model, job):
        count += lin.count * r * (lin.in_features + lin.out_features)
        tensors += 2 * lin.count
    return count, tensors


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
        small, big = _split_small_tensors(model, job, consts.bnb_8bit_min_size)
        block = consts.bnb_8bit_block_size
        big_bytes = Fraction(2) * big + Fraction(2 * 4, block) * big
        return big_bytes + 8 * small
    if opt == "adafactor":
        # factored second moment for matrices (row + column vectors, fp32), full for vectors;
        # no first moment (HF Adafactor default beta1=None)
        return Fraction(4) * _adafactor_elems(model, job)
    raise AssertionError(opt)


def _split_small_tensors(model: ModelSpec, job: Job, min_size: int) -> tuple[int, int]:
    small = big = 0
    for n_elem, count in _trainable_tensor_sizes(model, job):
        if n_elem < min_size:
            small += n_elem * count
        else:
            big += n_elem * count
    return small, big


def _trainable_tensor_sizes(model: ModelSpec, job: Job) -> list[tuple[int, int]]:
    """(elements per tensor, how many such tensors) of the trainable parameters."""
    if job.uses_lora:
        out = []
        for lin in _lora_linears(model, job):
            out.append((job.lora.r * lin.in_features, lin.count))
            out.append((job.lora.r * lin.out_features, lin.count))
        return out
    return [(rows * cols, n) for rows, cols, n in _full_matrices(model)] + _full_vectors(model)


def _full_matrices(model: ModelSpec) -> list[tuple[int, int, int]]:
    h = model.hidden_size
    out = [(model.vocab_size, h, 1)]
    for lin in model.linears():
        if lin.is_module:
            out.append((lin.out_features, lin.in_features, lin.count))
        else:
            e = _experts_of(model)
            out.append((e * lin.out_features, lin.in_features, lin.count // e))
    for g in model.groups:
        if g.moe is not None:
            out.append((g.moe.num_experts, h, g.count))
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
        mats = []
        for lin in _lora_linears(model, job):
            mats.append((job.lora.r, lin.in_features, lin.count))
            mats.append((lin.out_features, job.lora.r, lin.count))
        vecs: list[tuple[int, int]] = []
    else:
        mats = _full_matrices(model)
        vecs = _full_vectors(model)
    return sum((r + c) * n for r, c, n in mats) + sum(e * n for e, n in vecs)


def _qlora_frozen_bytes(model: ModelSpec, job: Job) -> tuple[Fraction, Fraction]:
    """(quantized bytes incl. constants, bytes of the parameters bitsandbytes leaves alone)."""
    q = job.quant
    skip = set(q.skip_modules)
    quantized = 0
    quant_tensors = 0
    for lin in model.linears():
        if lin.is_module and lin.module not in skip:
            quantized += lin.count * lin.in_features * lin.out_features
            quant_tensors += lin.count
    blocks = Fraction(quantized, q.blocksize)
    if q.double_quant:
        # uint8 absmax per block + fp32 absmax per 256 absmax-blocks + 256-entry fp32 code and
        # fp32 offset per tensor (bitsandbytes QuantState.state2)
        consts = blocks * 1 + Fraction(quantized, q.blocksize * 256) * 4 + quant_tensors * (256 * 4 + 4)
    else:
        consts = blocks * 4
    quant_bytes = Fraction(quantized, 2) + consts
    # biases of quantized layers stay in the compute dtype
    unquantized = model.params.total - quantized
    return quant_bytes, Fraction(unquantized)


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
        master = dtype_bytes(prec["compute"]) * n_train if mixed else Fraction(0)
        grad_b = dtype_bytes(prec["grad"])
        param_b = dtype_bytes(train_dtype)
    else:
        # PEFT keeps adapters in fp32 (autocast_adapter_dtype=True) whatever the base dtype
        trainable_w = Fraction(4) * n_train
        master = Fraction(0)
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
    resid: int  # bytes of the residual stream (dtype of the embedding weight)
    lora_in: int  # bytes of the tensors entering LoRA A (dropout output)


def _act_dtypes(job: Job) -> _Dtypes:
    prec = PRECISIONS[job.precision]
    compute = int(dtype_bytes(prec["compute"]))
    if job.method == "full":
        resid = int(dtype_bytes(prec["trainable"]))
    elif job.method == "lora":
        resid = int(dtype_bytes(prec["frozen"]))
    else:  # qlora: prepare_model_for_kbit_training upcasts the embedding to fp32
        resid = 4
        compute = int(dtype_bytes(job.quant.compute_dtype))
    return _Dtypes(compute=compute, resid=resid, lora_in=resid)


def _layer_saved_bytes(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> int:
    """Bytes autograd saves for one decoder layer of group ``g`` for one micro-batch."""
    b, s = job.micro_batch, job.seq_len
    t = b * s
    h = model.hidden_size
    a = g.attention
    c, r = dt.compute, dt.resid
    cast = c != r  # matmul inputs need a cast copy

    def norm(width: int) -> int:
        # RMSNorm in fp32: saves the fp32 input (a copy when the stream is not fp32), the
        # normalized output in the stream dtype and the fp32 rsqrt per row
        return t * width * (4 if r != 4 else 0) + t * width * 4 + t * width * r + t * 4

    total = 0
    total += norm(h)  # input norm; its output (stream dtype) feeds the projections
    q = a.num_heads * a.head_dim // tp
    kv = a.num_kv_heads * a.head_dim // tp if a.num_kv_heads >= tp else a.head_dim
    v = a.num_heads * a.v_head_dim // tp
    # projections: each nn.Linear saves its input (a fresh autocast copy per linear when casting)
    n_in = 1 if a.fused_qkv else 3
    total += (n_in if cast else 1) * t * h * c
    # attention core (sdpa / flash): q, k, v after rope, output, logsumexp
    total += t * (q + 2 * kv) * c + t * v * c + b * (a.num_heads // tp) * s * 4
    if job.attn_impl == "eager":
        total += b * (a.num_heads // tp) * s * s * (c + c)  # scores and softmax probs
    total += t * v * c  # o_proj input (contiguous copy of the attention output)
    total += norm(h)
    if g.mlp is not None:
        total += _mlp_saved(g.mlp.intermediate_size // tp, t, h, c, cast, g.mlp.fused_gate_up)
    if g.moe is not None:
        m = g.moe
        routed = t * m.top_k
        total += t * m.num_experts * 4 + routed * 8  # router logits fp32 + routing weights/indices
        total += _mlp_saved(m.expert_intermediate_size, routed, h, c, True, True) // max(1, tp)
        if m.shared is not None:
            total += _mlp_saved(m.shared.intermediate_size // tp, t, h, c, cast, False)
    total += _lora_saved(g, model, job, dt, t, tp)
    return total


def _mlp_saved(i: int, t: int, h: int, c: int, cast: bool, fused: bool) -> int:
    n_in = 1 if fused or not cast else 2
    # inputs of gate/up, act input (gate out), act output and up output for the product,
    # down_proj input
    return n_in * t * h * c + t * i * c * 4


def _lora_saved(g: LayerGroup, model: ModelSpec, job: Job, dt: _Dtypes, t: int, tp: int) -> int:
    if not job.uses_lora:
        return 0
    targets = lora_targets(model, job.lora)
    r = job.lora.r
    out = 0
    for lin in model.linears():
        if not lin.is_module or lin.module not in targets:
            continue
        per_layer = lin.count // model.num_layers if lin.category != "lm_head" else 0
        if per_layer == 0:
            continue
        x = t * lin.in_features * dt.lora_in
        if job.lora.dropout > 0:
            out_one = x + t * lin.in_features  # dropout output + bool mask
        else:
            out_one = 0
        out_one += t * r * dt.compute  # lora_B input
        out += per_layer * out_one
    return out * g.count // g.count  # per layer of this group


def _logits_bytes(model: ModelSpec, job: Job, dt: _Dtypes, tp: int) -> tuple[int, int]:
    """(saved, transient) bytes of the lm_head output and the loss in transformers 5.

    The lm_head output is returned in the compute dtype; ``ForCausalLMLoss`` upcasts it to fp32
    and cross-entropy's log-softmax saves its fp32 output. In backward, the fp32 gradient of the
    logits and its compute-dtype cast exist at once.
    """
    t = job.micro_batch * job.seq_len
    v = model.vocab_size // tp
    c = dt.compute
    saved = t * v * c + t * v * 4 + t * model.hidden_size * c + t * 8
    if model.final_logit_softcap:
        saved += 2 * t * v * c
    transient = t * v * 4 + t * v * 4  # fp32 upcast + grad_input of log-softmax
    return saved, transient


def saved_activation_bytes(model: ModelSpec, job: Job, layout: Layout | None = None) -> int:
    """Bytes autograd holds between forward and backward for one micro-batch on one GPU."""
    return _activations(model, job, layout or Layout())[0]


def _activations(model: ModelSpec, job: Job, layout: Layout) -> tuple[int, int, int]:
    """(saved activations, logits+loss saved, backward transient) per GPU."""
    dt = _act_dtypes(job)
    tp, pp = layout.tp, layout.pp
    t = job.micro_batch * job.seq_len
    per_layer = [(g, _layer_saved_bytes(g, model, job, dt, tp)) for g in model.groups]
    layers_on_gpu = Fraction(1, pp)
    # 1F1B pipeline: the first stage holds pp micro-batches in flight -> about all layers' worth
    inflight = pp
    if job.gradient_checkpointing:
        saved = sum(g.count * t * model.hidden_size * dt.resid for g, _ in per_layer)
        recompute = max(x for _, x in per_layer)
    else:
        saved = sum(g.count * x for g, x in per_layer)
        recompute = 0
    saved = int(saved * layers_on_gpu * inflight)
    saved += t * 8  # input ids (int64)
    logits_saved, logits_transient = _logits_bytes(model, job, dt, tp)
    if pp > 1:
        logits_saved, logits_transient = logits_saved, logits_transient  # last stage only
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
) -> MemoryBreakdown:
    """Per-GPU memory of ``job`` on ``model`` under ``layout``."""
    layout = layout or Layout()
    validate_job(model, job, layout)
    consts = consts or memory_constants()
    st = model_states(model, job, consts)
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    mp = tp * pp  # model-parallel split of every weight
    notes: list[str] = []

    frozen = st.frozen_weights / mp
    trainable = st.trainable_weights / mp
    master = st.master_weights / mp
    grads = st.gradients / mp
    opt = st.optimizer_states / mp
    host = 0

    if layout.shards_optimizer:
        opt /= dp
    if layout.shards_grads:
        grads /= dp
    if layout.shards_params:
        frozen /= dp
        trainable /= dp
        master /= dp
    elif layout.shards_optimizer and st.master_weights:
        master /= dp  # ZeRO-1/2 keep the fp32 master partitioned with the optimizer
    if layout.offload_optimizer:
        host += opt + (master if st.master_weights else 0)
        opt = 0
        if st.master_weights:
            master = 0
    if layout.offload_params:
        host += frozen + trainable
        frozen = trainable = 0

    saved, logits_saved, transient = _activations(model, job, layout)
    # transient extras of the layout
    if layout.shards_params and dp > 1:
        # ZeRO-3/FSDP gather one layer (plus one prefetched) in the compute dtype
        layer_bytes = _largest_layer_bytes(model, job) / mp
        transient += 2 * layer_bytes
        if job.method == "full":
            transient += layer_bytes  # its unsharded gradient before reduce-scatter
    if layout.strategy == "ddp":
        # DDP's reducer keeps a flat bucket copy of every gradient (gradient_as_bucket_view=False)
        transient += int(grads)
        notes.append("ddp: gradient buckets add a full gradient copy (gradient_as_bucket_view=False)")
    if job.optimizer == "paged_adamw_8bit":
        notes.append("paged optimizer: states can be evicted to host under pressure")

    resident = frozen + trainable + master + grads + opt
    fwd_bwd = resident + saved + logits_saved + transient
    # optimizer step: fused AdamW has no whole-model temporaries; activations are freed
    step = resident + (_largest_layer_bytes(model, job) / mp if job.method == "full" else 0)
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


def _largest_layer_bytes(model: ModelSpec, job: Job) -> int:
    prec = PRECISIONS[job.precision]
    c = int(dtype_bytes(prec["compute"]))
    best = 0
    for g in model.groups:
        n = 0
        for lin in model.linears():
            pass
        h = model.hidden_size
        a = g.attention
        n = h * (a.num_heads * a.head_dim + 2 * a.num_kv_heads * a.head_dim) + a.num_heads * a.v_head_dim * h
        if g.mlp is not None:
            n += 3 * h * g.mlp.intermediate_size
        if g.moe is not None:
            n += g.moe.num_experts * 3 * h * g.moe.expert_intermediate_size
        best = max(best, n * c)
    return best


def gib(n: int) -> float:
    return n / GIB
