"""Step time, throughput and wall-clock hours of a fine-tuning job:
``estimate_runtime(model, job, layout, gpu, *, offer=None) -> RuntimeEstimate``.

Pure arithmetic, no I/O beyond the lazily loaded constants of ``catalog/data/efficiency.json``
(every number below comes from there, with its source). One optimizer step, seen from one GPU, is a
sum of named terms, each a function of this module:

* :func:`matmul_time` -- every weight GEMM (forward, input gradient, weight gradient when the
  weight trains, forward again under checkpointing; LoRA's two skinny GEMMs per wrapped module in
  each of those passes), each at a size-dependent fraction of the dense peak and never faster than
  its operands' HBM traffic (:func:`gemm_time`, a roofline); routed experts held in fp32
  (:func:`fp32_expert_gemms`: no autocast for ``torch._grouped_mm``) at the GPU's FP32 peak;
* :func:`attention_time` -- fused (flash / sdpa) attention at the measured fraction of peak of the
  kernel, or eager attention: score GEMMs plus the memory-bound softmax on the full score matrix;
* :func:`elementwise_time` -- the memory-bound ops (norms, activations, rotary, residual adds, casts,
  the fp32 loss, LoRA's scale/add, autocast weight casts, gradient accumulation): bytes from an op
  inventory / achieved HBM bandwidth (``torch.compile`` fuses them: fewer bytes);
* :func:`dequant_time` -- bitsandbytes 4-bit dequantization of every quantized weight in every pass,
  at its measured cost;
* :func:`host_time` -- the CPU launching one kernel per op: a micro-batch takes at least its op count
  x the dispatch time, which is why short micro-batches are slower than FLOP-proportional; plus
  :func:`step_overhead` per optimizer step;
* :func:`optimizer_time` -- optimizer (and gradient clipping) bytes / HBM bandwidth, or CPU Adam +
  PCIe when offloaded;
* :func:`dp_comm` -- data-parallel communication: DDP bucketed all-reduce during the last backward;
  ZeRO-1/2 reduce-scatter + parameter all-gather after the step; ZeRO-3/FSDP all-gathers per layer
  in forward and backward and a reduce-scatter per layer, prefetched behind compute (exposed: what
  compute cannot hide, the share that overlap costs, and the first layer's gather); ring latency per
  collective (per layer, not per bucket); GeForce cards without peer-to-peer bounce through host
  memory;
* :func:`tp_comm` / :func:`pp_comm` / :func:`pp_bubble_fraction` -- tensor-parallel all-reduces (on
  the critical path), pipeline sends and the 1F1B bubble (an interleaved schedule, ``pp_virtual``
  chunks per rank, divides the bubble and multiplies the sends by ``pp_virtual``);
* :func:`ep_comm` -- MoE expert parallelism: the dispatch/combine all-to-alls of every MoE layer
  on the critical path (the experts' data-parallel traffic moves to their own group in
  :func:`dp_comm`);
* what checkpointing re-runs (:func:`recompute_fractions`, from :mod:`ftplan.actflops`) and the
  loss path (:func:`lm_head_recompute`, :func:`loss_bytes_per_token`: ``job.loss``);
* :func:`clock_factor` -- a power cap below the board TDP lowers the sustained clock.

A micro-batch costs ``max(GPU time, host time)``. The uncertainty band (``step_time_s_low/high``) is
the calibrated quantile range of log(measured / predicted) over held-out published measurements
(``catalog/data/runtime_reference.json``, ``benchmarks/runtime_accuracy.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from .actflops import loss_extra_flops_per_token, recompute_flops_per_token
from .catalog.efficiency import Efficiency, Recompute, efficiency
from .errors import ConfigError
from .job import PRECISIONS, Job, Layout, lora_targets, lora_wraps_experts, planned_attention
from .memory import model_states
from .model import ModelSpec
from .units import dtype_bytes

__all__ = [
    "RuntimeEstimate",
    "FlopsPerToken",
    "Rates",
    "estimate_runtime",
    "job_totals",
    "for_dataset",
    "flops_per_token",
    "attention_context",
    "gemm_time",
    "matmul_time",
    "linear_time",
    "clear_caches",
    "attention_time",
    "elementwise_time",
    "dequant_time",
    "quantize_time",
    "host_time",
    "loss_syncs",
    "adapter_traffic_bytes",
    "step_overhead",
    "loss_bytes_per_token",
    "optimizer_time",
    "host_link_bytes_per_s",
    "dp_comm",
    "tp_comm",
    "pp_comm",
    "ep_comm",
    "lm_head_recompute",
    "clock_factor",
    "all_reduce_time",
    "reduce_scatter_time",
    "all_gather_time",
    "pp_bubble_fraction",
    "compute_dtype",
    "rates_for",
    "recompute_fractions",
    "Recompute",
    "fp32_expert_gemms",
    "fp32_experts_note",
]

#: Megatron-style row-parallel projections (their input dimension is split under TP)
_ROW_PARALLEL = frozenset({"o_proj", "down_proj", "dense", "out_proj", "fc2", "w2", "dense_4h_to_h"})
#: MLP up-projections whose output size is the per-token intermediate activation
_UP_PROJ = frozenset({"up_proj", "gate_up_proj", "w3", "fc1", "c_fc", "dense_h_to_4h"})


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per trained token, by pass."""

    forward: float
    backward: float
    recompute: float
    base_matmul: float  # forward FLOPs of the model's weight matmuls (lm_head included)
    attention: float  # forward FLOPs of attention scores and values
    adapters: float  # forward FLOPs of the LoRA adapters
    lm_head: float

    @property
    def model(self) -> float:
        """Model FLOPs (what MFU counts): forward + backward, no recompute."""
        return self.forward + self.backward

    @property
    def hardware(self) -> float:
        return self.forward + self.backward + self.recompute


@dataclass(frozen=True)
class RuntimeEstimate:
    step_time_s: float
    compute_time_s: float  # GPU work of the step's micro-batches (without the pipeline bubble)
    comm_time_s: float  # all communication of one step (before overlap)
    exposed_comm_s: float  # communication not hidden behind compute
    optimizer_time_s: float
    dequant_time_s: float
    tokens_per_s: float  # whole job (all GPUs)
    mfu: float  # model FLOPs utilisation against the dense peak of the compute dtype
    flops_per_token: float  # model FLOPs per token (forward + backward)
    total_tokens: int | None
    steps: int | None
    hours: float | None  # training time, without start-up
    startup_hours: float
    tokens_per_step: int
    efficiency: float  # achieved fraction of peak on the matmul work
    breakdown: dict[str, float] = field(default_factory=dict)
    #: calibrated band (held-out quantiles of measured / predicted step time, see efficiency.json)
    step_time_s_low: float | None = None
    step_time_s_high: float | None = None
    tokens_per_s_low: float | None = None  # = tokens per step / step_time_s_high
    tokens_per_s_high: float | None = None
    hours_low: float | None = None
    hours_high: float | None = None
    band_quantiles: tuple[float, float] | None = None
    host_bound: bool = False  # micro-batches limited by the CPU launching kernels, not the GPU

    @property
    def total_hours(self) -> float | None:
        return None if self.hours is None else self.hours + self.startup_hours

    @property
    def total_hours_low(self) -> float | None:
        return None if self.hours_low is None else self.hours_low + self.startup_hours

    @property
    def total_hours_high(self) -> float | None:
        return None if self.hours_high is None else self.hours_high + self.startup_hours


class Rates(NamedTuple):
    """What the GPU delivers for this job: the numbers every term divides by."""

    peak_flops: float  # datasheet dense peak of the compute dtype, FLOP/s
    clock: float  # sustained-clock factor (power cap)
    gemm_fraction: float
    gemm_launch_s: float  # fixed time per GEMM
    flash_fraction: float
    hbm_bytes_per_s: float  # achieved
    hbm_nominal_bytes_per_s: float  # datasheet
    #: FP8 / FP4 GEMMs of the job's low-precision recipe (``job.low_precision``; 0 without one):
    #: the format's datasheet dense peak x the recipe's achieved efficiency relative to bf16
    #: (``precisions.json`` ``efficiency_vs_bf16``), FLOP/s; and the operand bytes per element
    lp_flops: float = 0.0
    lp_operand_bytes: float = 2.0
    #: the GPU's FP32 datasheet peak (gpus.csv ``fp32_tflops``), FLOP/s: what grouped_mm experts
    #: held in fp32 run at (:func:`fp32_expert_gemms`); 0 where the catalog has no FP32 rate
    fp32_flops: float = 0.0


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------
def compute_dtype(job: Job) -> str:
    if job.method == "qlora":
        return job.quant.compute_dtype
    return PRECISIONS[job.precision]["compute"]


_NO_RECOMPUTE = Recompute(0.0, 0.0, 0.0)
_RC_CACHE: dict[tuple, tuple[ModelSpec, Recompute]] = {}


def recompute_fractions(job: Job, eff: Efficiency | None = None, model: ModelSpec | None = None) -> Recompute:
    """What checkpointing re-runs in backward, as shares of the forward's matmul, attention and
    elementwise work: everything of each checkpointed layer (``full``), all but the attention
    kernel (TRL's ``selective-attention``), the attention kernel and the cached matmul outputs
    kept (torchtitan's per-op ``selective``: elementwise ops recomputed), or the layers
    ``every-k`` checkpoints (efficiency.json ``recompute``).

    With ``model``, the matmul share is the recomputed matmul FLOPs of :mod:`ftplan.actflops`
    over those of full checkpointing (which mm outputs the selective policy caches, which layers
    every-k checkpoints: transformers' layers 0, k, 2k, ...), and the attention and elementwise
    shares are scaled by the checkpointed layers; without it, every-k is taken as 1/k.
    """
    mode = job.ac_mode
    if mode == "none":
        return _NO_RECOMPUTE
    table = (eff or efficiency()).recompute
    base = table.get(mode) or table["full"]
    if model is None:
        if mode == "every-k":
            f = 1.0 / max(1, int(job.checkpoint_every))
            return Recompute(f * base.matmul, f * base.attention, f * base.elementwise)
        return base
    key = (id(model), id(table), mode, job.checkpoint_every, job.method, job.lora, job.attn_impl)
    hit = _RC_CACHE.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    from .memory import checkpointed_layer_counts

    layers = sum(checkpointed_layer_counts(model, job)) / max(1, model.num_layers)
    full_mm = recompute_flops_per_token(model, job.with_(checkpointing="full"), 0.0)
    mm = recompute_flops_per_token(model, job, 0.0) / full_mm if full_mm > 0 else base.matmul * layers
    # eager attention is no single op a policy could save: it is recomputed with its layer
    attn = 1.0 if job.attn_impl == "eager" else base.attention
    out = Recompute(mm, attn * layers, base.elementwise * layers)
    if len(_RC_CACHE) > 4096:
        _RC_CACHE.clear()
    _RC_CACHE[key] = (model, out)
    return out


def short_conv_flops_per_token(sc: Any, hidden: int) -> float:
    """Forward FLOPs per token of LFM2's depthwise causal conv: ``K`` multiply-adds per channel
    (``2 K h``; 12k for LFM2-1.2B, against 34M in the layer's two projections). Priced with the
    attention kernels: cheap either way."""
    return 2.0 * sc.conv_kernel * hidden


def delta_rule_flops_per_token(la: Any, seq_len: int) -> float:
    """Forward FLOPs per token of one Gated DeltaNet layer's chunked delta rule (the projections
    and the conv are counted elsewhere: linears, elementwise).

    Per value head and chunk of C tokens (dk, dv the key and value head dims), the chunked form
    (``torch_chunk_gated_delta_rule``; flash-linear-attention's ``chunk_gated_delta_rule`` runs
    the same products in Triton): ``k_beta @ k^T`` and ``q @ k^T`` (2 C^2 dk each), the UT
    transform's two triangular solves (C^2 dv + C^2 dk), the state reads ``k_cumdecay @ S`` and
    ``q @ S`` (2 C dk dv each), ``intra @ v_new`` (2 C^2 dv) and the state update
    ``k^T @ v_new`` (2 C dk dv): C^2 (5 dk + 3 dv) + 6 C dk dv, i.e. C (5 dk + 3 dv) + 6 dk dv per
    token, over the sequence padded to a multiple of C. For dk = dv = 128, C = 64: 164k FLOPs per
    token and value head (Qwen3.5-27B: 7.9 MFLOPs per token and layer, against 0.3 GFLOPs of its
    projections)."""
    c = float(la.chunk_size)
    dk, dv = float(la.k_head_dim), float(la.v_head_dim)
    padded = -(-int(seq_len) // la.chunk_size) * la.chunk_size
    per_token = c * (5.0 * dk + 3.0 * dv) + 6.0 * dk * dv
    return la.num_v_heads * per_token * padded / max(1, int(seq_len))


def attention_context(seq_len: int, window: int | None, attn_impl: str) -> float:
    """Average number of keys a query attends to, as the kernel computes them.

    Causal kernels (sdpa with is_causal, flash) skip the upper triangle: s/2. A sliding window
    bounds it only with flash (block skipping); sdpa with a window mask and eager compute the
    full square.
    """
    s = float(seq_len)
    if attn_impl == "eager":
        return s
    if window and seq_len > window:
        if attn_impl == "flash":
            w = float(window)
            return w - w * w / (2.0 * s)
        return s  # masked, not skipped
    return s / 2.0


_FLOPS_CACHE: dict[tuple, FlopsPerToken] = {}


def flops_per_token(model: ModelSpec, job: Job) -> FlopsPerToken:
    """FLOPs per token of ``job`` on ``model`` (independent of micro-batch and layout)."""
    key = (model, job.method, job.lora.r, job.lora.target_modules, job.seq_len, job.attn_impl,
           job.ac_mode, job.checkpoint_every, job.loss)
    hit = _FLOPS_CACHE.get(key)
    if hit is not None:
        return hit
    h = model.hidden_size
    base = 0.0
    lm_head = 0.0
    for lin in model.linears():
        f = 2.0 * lin.in_features * lin.out_features * lin.count * lin.token_fraction
        base += f
        if lin.category == "lm_head":
            lm_head += f
    if model.tie_word_embeddings:
        lm_head = 2.0 * h * model.vocab_size
        base += lm_head
    attn = 0.0
    for g in model.groups:
        a = g.attention
        if g.short_conv is not None:
            # LFM2's short convolution: its depthwise causal conv (K taps per channel) stands in for
            # attention; its projections are among the linears above
            attn += g.count * short_conv_flops_per_token(g.short_conv, h)
            continue
        if a is None:  # a Gated DeltaNet layer: its chunked delta rule stands in for attention
            attn += g.count * delta_rule_flops_per_token(g.linear_attention, job.seq_len)
            continue
        ctx = attention_context(job.seq_len, g.window, job.attn_impl)
        attn += g.count * 2.0 * ctx * a.num_heads * (a.head_dim + a.v_head_dim)
    adapters = 0.0
    if job.uses_lora:
        targets = lora_targets(model, job.lora)
        r = job.lora.r
        for lin in model.linears():
            if lin.is_module and lin.module in targets:
                adapters += 2.0 * r * (lin.in_features + lin.out_features) * lin.count
    fwd = base + attn + adapters
    if job.method == "full":
        bwd = 2.0 * fwd
    else:  # frozen base: input gradients only; attention and adapters: input + weight grads
        bwd = base + 2.0 * attn + 2.0 * adapters
    # checkpointing variants and the loss path (actflops): what backward re-executes
    recompute = recompute_flops_per_token(model, job, attn) + loss_extra_flops_per_token(model, job)
    out = FlopsPerToken(forward=fwd, backward=bwd, recompute=recompute, base_matmul=base,
                        attention=attn, adapters=adapters, lm_head=lm_head)
    if len(_FLOPS_CACHE) > 4096:
        _FLOPS_CACHE.clear()
    _FLOPS_CACHE[key] = out
    return out


# ---------------------------------------------------------------------------------------------
# rates
# ---------------------------------------------------------------------------------------------
def clock_factor(gpu: Any, eff: Efficiency) -> float:
    """Sustained-clock factor under a power cap: ``(power_limit_w / tdp_w) ** power_exponent``.

    A GPU object may carry ``power_limit_w`` (a power-capped run); without one, or at/above the
    TDP, the factor is 1.
    """
    cap = getattr(gpu, "power_limit_w", None)
    tdp = getattr(gpu, "tdp_w", None)
    if not cap or not tdp or cap >= tdp:
        return 1.0
    return (float(cap) / float(tdp)) ** eff.power_exponent


_RATES_CACHE: dict[tuple, tuple[Any, Efficiency, Rates]] = {}


def rates_for(gpu: Any, job: Job, eff: Efficiency) -> Rates:
    dt = compute_dtype(job)
    recipe = _recipe(job)
    key = (id(gpu), id(eff), dt, job.low_precision, recipe.efficiency_vs_bf16 if recipe else None)
    hit = _RATES_CACHE.get(key)
    if hit is not None and hit[0] is gpu and hit[1] is eff:
        return hit[2]
    rates = _rates(gpu, dt, eff, recipe)
    if len(_RATES_CACHE) > 1024:
        _RATES_CACHE.clear()
    _RATES_CACHE[key] = (gpu, eff, rates)
    return rates


def _recipe(job: Job) -> Any:
    """The job's FP8 / FP4 recipe (``ftplan.lowprec.Recipe``) or None."""
    if not job.low_precision:
        return None
    from .lowprec import get_recipe

    return get_recipe(job.low_precision)


def _rates(gpu: Any, dt: str, eff: Efficiency, recipe: Any = None) -> Rates:
    peak = gpu.peak_tflops(dt)
    if not peak:
        raise ConfigError(f"{getattr(gpu, 'name', gpu)} has no {dt} tensor throughput",
                          "pick another `precision` (e.g. `precision=fp16-mixed`) or another `gpu`",
                          field="precision")
    arch = getattr(gpu, "arch", None)
    vendor = getattr(gpu, "vendor", None)
    bw = float(gpu.mem_bw_tbps) * 1e12
    lp_flops, lp_bytes = 0.0, 2.0
    if recipe is not None and recipe.kind == "gemm":
        from .lowprec import gpu_problem, low_precision_peak_tflops

        why = gpu_problem(recipe, gpu) if hasattr(gpu, "compute_capability") else None
        lp_peak = low_precision_peak_tflops(recipe, gpu)
        if why or not lp_peak:
            raise ConfigError(why or f"{getattr(gpu, 'name', gpu)} has no {recipe.peak} tensor throughput",
                              "pick a GPU that supports it or another `precision`", field="precision")
        lp_flops = float(lp_peak) * 1e12 * recipe.efficiency_vs_bf16
        lp_bytes = recipe.weight.elem_bits / 8.0
    fp32 = gpu.peak_tflops("fp32") if hasattr(gpu, "peak_tflops") else None
    return Rates(
        peak_flops=float(peak) * 1e12,
        clock=clock_factor(gpu, eff),
        gemm_fraction=eff.gemm_fraction(arch, vendor, getattr(gpu, "name", None), getattr(gpu, "bf16_tflops", None)),
        gemm_launch_s=eff.gemm_launch(arch),
        flash_fraction=eff.flash(arch),
        hbm_bytes_per_s=bw * eff.hbm(arch),
        hbm_nominal_bytes_per_s=bw,
        lp_flops=lp_flops,
        lp_operand_bytes=lp_bytes,
        fp32_flops=float(fp32 or 0.0) * 1e12,
    )


# ---------------------------------------------------------------------------------------------
# GEMMs
# ---------------------------------------------------------------------------------------------
def gemm_time(m: float, k: float, n: float, rates: Rates, elem_bytes: float = 2.0) -> float:
    """Seconds for one ``(m x k) @ (k x n)`` GEMM.

    The slower of compute, ``2mkn / (peak x clock x fraction)``, and memory, reading both operands
    and writing the result at the achieved HBM bandwidth (roofline), plus a fixed time per GEMM
    (launch and wave tail: what makes small GEMMs slow in the cuBLAS microbenchmarks of
    efficiency.json).
    """
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    t_compute = 2.0 * m * k * n / (rates.peak_flops * rates.clock * rates.gemm_fraction)
    t_memory = elem_bytes * (m * k + k * n + m * n) / rates.hbm_bytes_per_s
    return (t_compute if t_compute > t_memory else t_memory) + rates.gemm_launch_s


class _Lin(NamedTuple):
    count: float  # per GPU (pipeline stage)
    k: int  # in features on this GPU (tensor-parallel split)
    n: int  # out features on this GPU
    token_fraction: float
    trainable: bool  # weight gradient computed
    recompute: float  # share of the forward run again in backward (checkpointing)
    lora_r: int  # 0 = no adapter
    #: converted by the low-precision recipe: forward, input gradient (and the weight gradient when
    #: ``lp_wgrad``) run at ``Rates.lp_flops``
    lp: bool = False
    lp_wgrad: bool = False
    #: the weight-gradient GEMM runs although the weight is frozen (torchao's float8 autograd
    #: function on a LoRA base: computed, then discarded)
    extra_wgrad: bool = False
    #: grouped_mm experts held in fp32 (:func:`fp32_expert_gemms`): every GEMM at
    #: ``Rates.fp32_flops`` with fp32 operands
    fp32: bool = False


_PROFILE_CACHE: dict[tuple, tuple[_Lin, ...]] = {}


def lm_head_recompute(job: Job) -> float:
    """Share of the LM head's forward GEMM run again in backward: TRL's fused head (``loss=trl``)
    recomputes each logits tile in backward (:func:`ftplan.actflops.loss_extra_flops_per_token`);
    transformers' loss keeps the logits and Liger computes their gradient in the forward."""
    return 1.0 if job.loss == "trl" else 0.0


def fp32_expert_gemms(model: ModelSpec, job: Job, layout: Layout) -> bool:
    """The routed experts' GEMMs run in fp32 although the job computes in bf16/fp16.

    transformers 5.24's MoE experts (``integrations/moe.py`` ``_grouped_mm``, the default
    ``experts_implementation``) call ``torch._grouped_mm(input.to(weight.dtype), weight, ...)``,
    and ``torch._grouped_mm`` has no autocast kernel (pytorch#174763; the dispatcher has no
    ``AutocastCUDA`` kernel for ``aten::_grouped_mm``): the experts run in their weights' dtype,
    an fp32 one through torch's non-bf16 fallback (one ``mm`` per expert, cuBLAS SGEMM: PyTorch's
    default ``allow_tf32=False``, which HF Trainer's ``tf32=None`` keeps). The weights are fp32
    on one GPU or DDP (no engine casting the parameters; FSDP's ``param_dtype`` and DeepSpeed's
    bf16 mode hand compute-dtype ones) under PEFT's QLoRA recipe (``prepare_model_for_kbit_training``
    upcasts the unquantized 3-D experts), full fine-tuning with fp32 master weights, and LoRA on
    an fp32-loaded base: the same dtype rule as ``memory._act_dtypes`` ``expert``. Llama 4's
    experts (``dense_dispatch``: ``bmm``, which autocast covers) are not concerned."""
    if layout.engine not in ("torch", "ddp") or compute_dtype(job) == "fp32":
        return False
    if not any(g.moe is not None and not g.moe.dense_dispatch for g in model.groups):
        return False
    if job.method == "full":
        w = PRECISIONS[job.precision]["trainable"]
    elif job.method == "lora":
        w = job.frozen_dtype
    else:
        w = job.unquantized_dtype
    return w == "fp32"


def fp32_experts_note(model: ModelSpec, job: Job, layout: Layout, gpu: Any = None,
                      rt: RuntimeEstimate | None = None) -> str | None:
    """One line when the routed experts' GEMMs run in fp32 (:func:`fp32_expert_gemms`): why, what
    it costs (the GPU's FP32 vs compute-dtype rate; with ``rt`` the seconds of the step), and the
    change that keeps them in the compute dtype; None otherwise."""
    if not fp32_expert_gemms(model, job, layout):
        return None
    c = compute_dtype(job)
    if job.method == "qlora":
        why = "PEFT's QLoRA recipe (prepare_model_for_kbit_training) upcasts them to fp32"
        fix = (f"`qlora_recipe=trl` (TRL's SFTTrainer as-is: no kbit upcast) keeps them in {c}, "
               "as do FSDP / DeepSpeed")
    elif job.method == "full":
        why = "full fine-tuning under autocast keeps fp32 master weights"
        fix = (f"FSDP or DeepSpeed (`strategy=fsdp`, `strategy=zero2`: {c} parameters in the forward), "
               f"or pure `precision={c}`, run them in {c}")
    else:
        why = "the LoRA base is loaded in fp32"
        fix = f"load the base in {c} (drop `base_dtype`), or shard with FSDP / DeepSpeed"
    rate = ""
    if gpu is not None:
        fp32, peak = gpu.peak_tflops("fp32"), gpu.peak_tflops(c)
        if fp32 and peak:
            rate = f" ({float(fp32):g} vs {float(peak):g} {c} TFLOPS on {getattr(gpu, 'name', gpu)})"
    cost = ""
    if rt is not None and rt.breakdown.get("fp32_expert_matmul_s"):
        cost = f": {rt.breakdown['fp32_expert_matmul_s']:.2f} s of the {rt.step_time_s:.2f} s step"
    return (f"routed experts run their GEMMs in fp32, at the GPU's FP32 rate{rate}{cost}; why: {why}, and "
            f"torch._grouped_mm has no autocast kernel (transformers' experts run in their weights' dtype); "
            f"fix: {fix}")


def _linear_profile(model: ModelSpec, job: Job, tp: int, pp: int, fp32_experts: bool = False) -> tuple[_Lin, ...]:
    rc = recompute_fractions(job, None, model).matmul
    head_rc = lm_head_recompute(job)
    key = (model, job.method, job.lora, rc, head_rc, tp, pp, job.low_precision, job.loss, fp32_experts)
    hit = _PROFILE_CACHE.get(key)
    if hit is not None:
        return hit
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    full = job.method == "full"
    lins = list(model.linears())
    recipe = _recipe(job)
    if recipe is not None and recipe.kind == "gemm":
        from .lowprec import converted_counts

        conv = converted_counts(model, job)
        lp_wgrad = bool(recipe.low_precision_gemms.get("wgrad", True))
        # torchao's float8 function computes grad_weight even for a frozen weight
        extra = recipe.is_torchao_float8 and not full
    else:
        conv, lp_wgrad, extra = (0,) * len(lins), False, False
    out: list[_Lin] = []
    if model.tie_word_embeddings:  # the tied lm_head is a GEMM with the embedding matrix
        out.append(_Lin(1.0 / pp, model.hidden_size, math.ceil(model.vocab_size / tp), 1.0, full, head_rc, 0))
    for lin, n_conv in zip(lins, conv):
        k, n = lin.in_features, lin.out_features
        if tp > 1:
            if lin.module in _ROW_PARALLEL:
                k = math.ceil(k / tp)
            else:
                n = math.ceil(n / tp)
        r = job.lora.r if (lin.is_module and lin.module in targets) else 0
        lrc = head_rc if lin.category == "lm_head" else rc
        if n_conv:
            out.append(_Lin(n_conv / pp, k, n, lin.token_fraction, full, lrc, r, True, lp_wgrad, extra))
        if lin.count - n_conv > 0:
            out.append(_Lin((lin.count - n_conv) / pp, k, n, lin.token_fraction, full, lrc, r,
                            fp32=fp32_experts and lin.category == "experts"))
    res = tuple(out)
    if len(_PROFILE_CACHE) > 2048:
        _PROFILE_CACHE.clear()
    _PROFILE_CACHE[key] = res
    return res


def matmul_time(model: ModelSpec, job: Job, layout: Layout, tokens: float, rates: Rates) -> float:
    """GPU seconds of every weight GEMM of one micro-batch of ``tokens`` tokens on one GPU.

    Per weight: forward, input gradient, weight gradient (trainable weights only), and the forward
    again under checkpointing. A LoRA adapter adds ``x @ A`` and ``(xA) @ B`` in each forward and
    their four gradient GEMMs in backward: skinny GEMMs that are memory-bound on the activations.
    Each GEMM as :func:`gemm_time` (written out inline here: the planner calls this thousands of
    times).

    Linears a low-precision recipe converts (``job.low_precision``: ``ftplan.lowprec``) run their
    forward, recompute and input-gradient GEMMs, and the weight-gradient GEMM where the recipe
    quantizes it, at ``Rates.lp_flops`` with FP8/FP4 operands (bf16 output); torchao's float8
    function also runs the weight-gradient GEMM of a frozen LoRA base, whose result autograd
    discards.

    Routed experts held in fp32 (:func:`fp32_expert_gemms`) run every GEMM at the GPU's FP32 peak
    (``Rates.fp32_flops``, at the same achieved fraction as the compute dtype's GEMMs, as ftplan
    prices an fp32 job's GEMMs) with fp32 operands.
    """
    lins = _linear_profile(model, job, layout.tp, layout.pp, fp32_expert_gemms(model, job, layout))
    return _matmul_seconds(lins, tokens, rates)[0]


def linear_time(m: float, k: int, n: int, rates: Rates, *, low_precision: bool = False,
                low_precision_wgrad: bool = True) -> float:
    """GPU seconds of one trainable ``nn.Linear`` (m x k) @ (k x n): forward, input gradient and
    weight gradient, in the compute dtype or (``low_precision``) at ``rates.lp_flops`` with FP8/FP4
    operands (the weight gradient too when ``low_precision_wgrad``); the quantize kernels are not
    included (:func:`quantize_time`)."""
    lin = _Lin(1.0, k, n, 1.0, True, 0.0, 0, low_precision, low_precision_wgrad)
    return _matmul_seconds((lin,), float(m), rates)[0]


def clear_caches() -> None:
    """Forget every memoised intermediate (for a caller that swaps catalog data in place, e.g.
    ``scripts/calibrate.py``)."""
    for c in (_STATIC_CACHE, _RATES_CACHE, _PROFILE_CACHE, _FLOPS_CACHE, _EW_CACHE, _LP_CACHE, _RC_CACHE,
              _STATES_CACHE):
        c.clear()


def _matmul_seconds(lins: tuple[_Lin, ...], tokens: float, rates: Rates) -> tuple[float, float, float]:
    """(all GEMM seconds, of which in the low-precision GEMMs, of which in fp32 expert GEMMs) of
    one micro-batch."""
    # gemm_time written out: max(2mkn / P, 2(mk + kn + mn) / B) + t0 per GEMM
    ip = 2.0 / (rates.peak_flops * rates.clock * rates.gemm_fraction)
    ib = 2.0 / rates.hbm_bytes_per_s
    lp_ip = 2.0 / (rates.lp_flops * rates.clock * rates.gemm_fraction) if rates.lp_flops else 0.0
    lp_b = rates.lp_operand_bytes / rates.hbm_bytes_per_s
    t0 = rates.gemm_launch_s
    # fp32 expert GEMMs (torch's grouped_mm fallback: cuBLAS SGEMM per expert): FP32 peak, 4-byte
    # operands; without an FP32 rate in the catalog they stay at the compute dtype's
    ip32 = 2.0 / (rates.fp32_flops * rates.clock * rates.gemm_fraction) if rates.fp32_flops else 0.0
    ib32 = 4.0 / rates.hbm_bytes_per_s
    total = 0.0
    low = 0.0
    wide = 0.0
    for count, k, n, tf, trainable, rc, r, lp, lp_wgrad, extra, fp32 in lins:
        m = tokens * tf
        if m <= 0:
            continue
        if fp32 and ip32:
            tm = (m * k + k * n + m * n) * ib32
            tc = m * k * n * ip32
            t = ((tc if tc > tm else tm) + t0) * (2.0 + rc + (1.0 if trainable else 0.0))
            wide += count * t
            total += count * t
            continue
        tm = (m * k + k * n + m * n) * ib  # same operand traffic for forward, dgrad and wgrad
        tc = m * k * n * ip
        one = (tc if tc > tm else tm) + t0
        wgrad = trainable or extra
        if lp and lp_ip:
            tml = (m * k + k * n) * lp_b + m * n * ib  # FP8/FP4 operands, bf16 result
            tcl = m * k * n * lp_ip
            one_lp = (tcl if tcl > tml else tml) + t0
            t_low = one_lp * (2.0 + rc + (1.0 if wgrad and lp_wgrad else 0.0))
            t = t_low + (one if wgrad and not lp_wgrad else 0.0)
            low += count * t_low
        else:
            # forward (+ recompute), input gradient, weight gradient of trainable weights
            t = one * (2.0 + rc + (1.0 if wgrad else 0.0))
        if r:
            mr, kr, rn = m * r, k * r, r * n
            a = max(m * k * r * ip, (m * k + kr + mr) * ib) + t0  # x @ A and its two gradients
            b = max(m * r * n * ip, (mr + rn + m * n) * ib) + t0  # (xA) @ B and its two gradients
            t += (a + b) * (1.0 + rc) + 2.0 * (a + b)
        total += count * t
    return total, low, wide


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def attention_time(model: ModelSpec, job: Job, layout: Layout, tokens: float, rates: Rates,
                   eff: Efficiency) -> float:
    """GPU seconds of attention (scores and values) for one micro-batch on one GPU.

    Fused kernels (``flash``, and ``sdpa``, which dispatches to FlashAttention-2 for half precision
    on CUDA) run the forward FLOPs, ``flash_backward_factor`` x them in backward (the kernel
    recomputes the scores), and the forward again under checkpointing, at the kernel's measured
    fraction of peak. ``eager`` materialises the score matrix: its GEMMs at the GEMM rate plus the
    memory-bound scaling/mask/softmax/cast traffic on every score element.
    """
    f = flops_per_token(model, job)
    if f.attention <= 0:
        return 0.0
    gc = recompute_fractions(job, eff, model).attention
    share = 1.0 / (layout.tp * layout.pp)
    if job.attn_impl == "eager":
        score_bytes = 0.0  # forward traffic per token on the score matrices (all layers)
        for g in model.groups:
            if g.attention is None:
                continue  # Gated DeltaNet: no score matrix
            if g.attention.sinks:
                per = sinks_eager_bytes_per_score(job, layout.engine)
            else:
                per = eff.eager_bytes_per_score + (eff.eager_softcap_bytes_per_score if g.attention.softcap else 0.0)
            score_bytes += g.count * g.attention.num_heads * attention_context(job.seq_len, g.window, "eager") * per
        flops = tokens * f.attention * share * (3.0 + gc)
        rate = rates.peak_flops * rates.clock * rates.gemm_fraction
        traffic = tokens * score_bytes * share * (1.0 + eff.elementwise_backward_factor + gc)
        return flops / rate + traffic / rates.hbm_bytes_per_s
    flops = tokens * f.attention * share * (1.0 + eff.flash_backward_factor + gc)
    return flops / (rates.peak_flops * rates.clock * rates.flash_fraction)


def sinks_eager_bytes_per_score(job: Job, engine: str) -> float:
    """Forward traffic per score element of gpt_oss's eager attention, from its op inventory (the
    counterpart of ``efficiency.json`` ``attention.eager_bytes_per_score``, whose conventions it
    keeps: the mask add reads a score-sized mask): write q@k^T (c bytes), scale (c + c), add the
    mask (3c), join the sink logits (``torch.cat``: read c, write k; with wider sinks autocast
    first casts the scores, k + k more), the row max (read k), subtract it (k + k), softmax in the
    joined dtype (k + k), cast its first s columns for the value matmul when wider (k + c), read by
    attn@v (c). ``c``: the compute dtype; ``k``: the joined logits'
    dtype, which ``torch.cat`` promotes to the sinks' (fp32 where the weights are fp32 and autocast
    runs on them: mixed-precision full fine-tuning, PEFT's QLoRA upcast, an fp32 LoRA base on one
    GPU or DDP; FSDP and DeepSpeed gather compute-dtype weights). 28 B with both in bf16 (llama's
    eager: 30), 54 B with fp32 joined logits. Held against the bytes aten moves on CPU
    (tests/test_elementwise_bytes_vs_torch.py::test_gpt_oss_eager_score_traffic)."""
    c = float(dtype_bytes(PRECISIONS[job.precision]["compute"]))
    if job.method == "qlora":
        c = float(dtype_bytes(job.quant.compute_dtype))
    k = c
    if engine in ("torch", "ddp") and job.precision.endswith("-mixed"):
        if job.method == "full":
            k = max(c, float(dtype_bytes(PRECISIONS[job.precision]["trainable"])))
        elif job.method == "qlora":
            k = max(c, float(dtype_bytes(job.unquantized_dtype)))
        else:
            k = max(c, float(dtype_bytes(job.frozen_dtype)))
    # autocast joins wider sinks by first casting the scores to their dtype (cat is a "promote"
    # op), then concatenating: c + k, then k + k more
    cat = c + k + (2 * k if k != c else 0.0)
    return c + 2 * c + 3 * c + cat + k + 2 * k + 2 * k + ((k + c) if k != c else 0.0) + c


# ---------------------------------------------------------------------------------------------
# memory-bound ops
# ---------------------------------------------------------------------------------------------
_EW_CACHE: dict[tuple, tuple[Efficiency, tuple[float, float, float, float]]] = {}


def _fp32_stream(job: Job, engine: str) -> bool:
    """The layers' activations (residual stream, norm outputs) are fp32: the embeddings and norms
    were left in fp32 (PEFT's ``prepare_model_for_kbit_training`` for QLoRA; a LoRA base loaded in
    fp32) and autocast runs on them without an engine casting the parameters (one GPU, DDP)."""
    if not job.precision.endswith("-mixed") or engine not in ("torch", "ddp"):
        return False
    return job.kbit_upcast or job.casts_fp32_base


def adapter_traffic_bytes(job: Job, eff: Efficiency, fp32_stream: bool = False,
                          engine: str = "torch") -> tuple[float, float, float, float]:
    """Bytes read + written by the non-GEMM ops of one LoRA-wrapped linear per element of its input
    and of its output: (input forward, input backward, output forward, output backward).

    An op inventory of PEFT 0.21 ``lora.Linear.forward`` / ``lora.bnb.Linear4bit.forward`` (the
    dtypes: the input ``a`` (fp32 on an fp32 stream, else the compute dtype), the adapter ``w``
    (fp32: PEFT's ``autocast_adapter_dtype``; bf16 under TRL's QLoRA recipe), the autocast compute
    dtype ``c``):

    * input side, forward: PEFT casts ``x`` to the adapter dtype (``_cast_input_dtype``; the bnb
      layer only without autocast): read ``a`` write ``w``; dropout (``lora_dropout > 0``) in that
      dtype: read, write, and a 1-byte mask (``dropout_mask_bytes``); autocast casts it to the
      compute dtype for ``lora_A``: read, write. Backward: each of these again (gradient casts,
      dropout's mask multiply) and the add of the adapter's input gradient to the base layer's
      (read 2, write 1 in ``a``).
    * output side: ``lora_B(...) * scaling`` (read, write in ``c``) and ``result + lora`` (read both,
      write the wider), cast back to the base output's dtype if wider; QLoRA's ``result.clone()``
      (read, write). Backward: the scaling multiply, and the casts.
    """
    autocast = job.precision.endswith("-mixed")
    c = float(dtype_bytes(compute_dtype(job))) if autocast else float(dtype_bytes(job.frozen_dtype))
    # the adapters stay in PEFT's dtype on one GPU / DDP under autocast; FSDP / DeepSpeed run every
    # parameter in the compute dtype, and a pure-precision run holds them in that dtype
    w = float(dtype_bytes(job.adapter_dtype)) if autocast and engine in ("torch", "ddp") else c
    a = 4.0 if fp32_stream else c
    qlora = job.method == "qlora"
    peft_cast = (a + w) if a != w and (not qlora or not autocast) else 0.0
    d = w if peft_cast else a
    drop = (2.0 * d + eff.dropout_mask_bytes) if job.lora.dropout > 0 else 0.0
    e = c if autocast else w  # dtype of the adapter's GEMMs and of its output
    ac = (d + e) if d != e else 0.0
    in_fwd = peft_cast + drop + ac
    in_bwd = ac + drop + peft_cast + 3.0 * a
    a_out = a if qlora else c  # bnb's Linear4bit casts its output back to the input's dtype
    r = max(a_out, e)
    back = (r + a_out) if r != a_out else 0.0
    out_fwd = 2.0 * e + a_out + e + r + back + (2.0 * a_out if qlora else 0.0)
    out_bwd = 2.0 * e + ((r + e) if r != e else 0.0) + back
    return in_fwd, in_bwd, out_fwd, out_bwd


def _elementwise_dims(model: ModelSpec, job: Job, tp: int, eff: Efficiency,
                      engine: str = "torch") -> tuple[float, float, float, float]:
    """Forward bytes per token of (the layers' memory-bound ops, LoRA's adapter ops and bnb's
    casts in the forward) summed over the layers with the op-inventory weights (eager or compiled),
    the expert weights PEFT merges in every forward when it wraps fused MoE experts, and the
    backward bytes per token of the adapter ops and casts."""
    fp32 = _fp32_stream(job, engine)
    key = (model, job.lora, job.method, job.torch_compile, tp, id(eff), fp32, job.precision, job.quant,
           job.base_dtype, engine in ("torch", "ddp"))
    hit = _EW_CACHE.get(key)
    if hit is not None and hit[0] is eff:  # id(eff) alone could be a collected object's
        return hit[1]
    inv = eff.elementwise_compiled if job.torch_compile else eff.elementwise_eager
    # QLoRA on an fp32 stream: bnb returns fp32 projections, so the q/k and MLP elementwise ops run
    # on fp32 tensors (twice the bytes of the bf16 inventory)
    wide = 4.0 / float(dtype_bytes(compute_dtype(job))) if (fp32 and job.method == "qlora") else 1.0
    h = model.hidden_size
    total = 0.0
    for g in model.groups:
        a = g.attention
        la = g.linear_attention
        inter = 0.0
        if g.mlp is not None:
            inter += g.mlp.intermediate_size
        if g.moe is not None:
            inter += g.moe.computed_experts * g.moe.expert_intermediate_size  # (llama4: every expert)
            if g.moe.shared is not None:
                inter += g.moe.shared.intermediate_size
        if la is not None:
            # Gated DeltaNet (not measured): the conv, silu and l2norm over the q/k/v channels
            # priced as q/k features, the gated norm over the value width as attention output
            qk, attn_out = la.conv_dim, la.value_dim
        elif g.short_conv is not None:
            # LFM2's short convolution (not measured): B * x and C * conv read the 3h-wide in_proj
            # output, priced as q/k features; the conv output and its transposed copy as attention output
            qk, attn_out = 3 * h, h
        else:
            qk, attn_out = (a.num_heads + a.num_kv_heads) * a.head_dim, a.num_heads * a.v_head_dim
        per_layer = (inv.per_hidden * h + (wide * (inv.per_intermediate * inter + inv.per_qk * qk)
                     + inv.per_attn_out * attn_out) / tp)
        total += g.count * per_layer
    lora_f = lora_b = 0.0
    if job.uses_lora:
        targets = lora_targets(model, job.lora)
        in_f, in_b, out_f, out_b = adapter_traffic_bytes(job, eff, fp32, engine)
        for lin in model.linears():
            if lin.is_module and lin.module in targets:
                n = lin.count * lin.token_fraction / tp
                lora_f += n * (in_f * lin.in_features + out_f * lin.out_features)
                lora_b += n * (in_b * lin.in_features + out_b * lin.out_features)
    if job.method == "qlora" and fp32:
        # bnb Linear4bit.forward: x.to(compute dtype) and the product .to(input dtype), forward and
        # backward (the gradients cast back), on every quantized linear
        c = float(dtype_bytes(compute_dtype(job)))
        skip = set(job.quant.skip_modules)
        for lin in model.linears():
            if lin.is_module and lin.module not in skip:
                n = lin.count * lin.token_fraction / tp * (4.0 + c) * (lin.in_features + lin.out_features)
                lora_f += n
                lora_b += n
    merged = 0.0
    if job.uses_lora and lora_wraps_experts(model, job.lora):
        merged = sum(lin.params for lin in model.linears() if lin.category == "experts") / tp
    res = (total, lora_f, merged, lora_b)
    if len(_EW_CACHE) > 2048:
        _EW_CACHE.clear()
    _EW_CACHE[key] = (eff, res)
    return res


def elementwise_time(model: ModelSpec, job: Job, layout: Layout, tokens: float, rates: Rates,
                     eff: Efficiency, params_per_gpu: float, first_micro_batch_share: float) -> float:
    """GPU seconds of the memory-bound ops of one micro-batch on one GPU.

    Layer ops (norms, residual adds, rotary, activation x gate, attention-output copy, LoRA
    scale/add) from the op inventory, forward + ``backward_factor`` x forward + recompute; the fp32
    cross-entropy on the logits (:func:`loss_bytes_per_token`); LoRA-wrapped MoE experts merged in
    every forward; for mixed-precision full fine-tuning the autocast weight casts (every forward)
    and gradient casts, and accumulating into fp32 gradients after the first micro-batch
    (``first_micro_batch_share`` = 1/m).
    """
    per_token = _elementwise_bytes_per_token(model, job, layout, eff)
    fixed = _weight_traffic_bytes(model, job, layout, eff, params_per_gpu, first_micro_batch_share)
    return (tokens * per_token + fixed) / rates.hbm_bytes_per_s


def loss_bytes_per_token(model: ModelSpec, job: Job, layout: Layout, eff: Efficiency) -> float:
    """Bytes moved by the loss per token and logit (efficiency.json ``loss_bytes_per_logit`` by
    loss path: transformers' ForCausalLMLoss upcasts the whole logits to fp32; TRL's fused head
    does the same per tile and again in the backward's recompute; Liger's fused kernel reads the
    logits tile once and writes its gradient in place); on the last pipeline stage,
    vocabulary-parallel under TP."""
    per_logit = eff.loss_bytes_per_logit.get(job.loss, eff.loss_bytes_per_logit["hf"])
    return model.vocab_size / layout.tp / layout.pp * per_logit


def _elementwise_bytes_per_token(model: ModelSpec, job: Job, layout: Layout, eff: Efficiency) -> float:
    layer_bytes, lora_fwd, _, lora_bwd = _elementwise_dims(model, job, layout.tp, eff, layout.engine)
    rc = recompute_fractions(job, eff, model).elementwise
    passes = 1.0 + eff.elementwise_backward_factor + rc
    per_token = (layer_bytes * passes + lora_fwd * (1.0 + rc) + lora_bwd) / layout.pp * eff.elementwise_scale
    return per_token + loss_bytes_per_token(model, job, layout, eff)


def _weight_traffic_bytes(model: ModelSpec, job: Job, layout: Layout, eff: Efficiency,
                          params_per_gpu: float, first_micro_batch_share: float,
                          rc: Recompute | None = None) -> float:
    rc = rc or recompute_fractions(job, eff, model)
    total = 0.0
    merged_params = _elementwise_dims(model, job, layout.tp, eff, layout.engine)[2]
    if merged_params:  # PEFT ParamWrapper: W + BA of every expert, each forward and its backward
        total += merged_params / layout.pp * eff.lora_expert_merge_bytes_per_param * (2.0 + rc.matmul)
    if job.method == "full":
        prec = PRECISIONS[job.precision]
        if prec["trainable"] != prec["compute"]:  # autocast: weight cast per forward, grad cast back
            # (weights a low-precision recipe converts are cast by its quantize kernels instead)
            total += (params_per_gpu * (1.0 - _converted_share(model, job)) * eff.autocast_cast_bytes_per_param
                      * (2.0 + rc.matmul))
        if prec["grad"] == "fp32":
            total += params_per_gpu * eff.grad_accumulate_bytes_per_param * (1.0 - first_micro_batch_share)
    return total


_LP_CACHE: dict[tuple, tuple[float, float, float]] = {}


def _lowprec_static(model: ModelSpec, job: Job) -> tuple[float, float, float]:
    """(share of the parameters the recipe converts, quantize bytes per token, quantize bytes per
    micro-batch) of ``job``'s low-precision recipe (zeros without one)."""
    if not job.low_precision:
        return 0.0, 0.0, 0.0
    key = (model, job.low_precision, job.method, job.loss)
    hit = _LP_CACHE.get(key)
    if hit is None:
        from .lowprec import converted_weight_elems, get_recipe, quant_traffic_bytes

        r = get_recipe(job.low_precision)
        share = 0.0
        if r is not None and r.kind == "gemm":
            share = converted_weight_elems(model, job) / max(1, model.params.total)
        per_token, per_mb = quant_traffic_bytes(model, job)
        hit = (share, float(per_token), float(per_mb))
        if len(_LP_CACHE) > 1024:
            _LP_CACHE.clear()
        _LP_CACHE[key] = hit
    return hit


def _converted_share(model: ModelSpec, job: Job) -> float:
    return _lowprec_static(model, job)[0]


def _fp8_gather_saving(model: ModelSpec, job: Job) -> float:
    """Bytes an FSDP2 float8 all-gather (torchao tensorwise) saves per full-model gather: the
    converted weights travel in FP8 (1 byte) instead of the compute dtype."""
    r = _recipe(job)
    if r is None or not r.fsdp_float8_all_gather or job.method != "full":
        return 0.0
    c = float(dtype_bytes(compute_dtype(job)))
    return _converted_share(model, job) * model.params.total * (c - 1.0)


def quantize_time(model: ModelSpec, job: Job, layout: Layout, tokens: float, rates: Rates) -> float:
    """GPU seconds of the low-precision recipe's quantize kernels (amax, scale, cast, transpose)
    in one micro-batch of ``tokens`` tokens on one GPU: the inputs and output gradients of every
    converted linear and its weight, read in the compute dtype and written in FP8/FP4, as many
    passes as the recipe's kernels make (``precisions.json`` ``cast_traffic``,
    :func:`ftplan.lowprec.quant_traffic_bytes`), at the achieved HBM bandwidth. With FSDP2 float8
    all-gather the weights are cast on the shard before the gather. Memory-bound work FP8 adds:
    what keeps a real FP8 step from being "GEMM time / 2"."""
    _, per_token, per_mb = _lowprec_static(model, job)
    if not per_token and not per_mb:
        return 0.0
    r = _recipe(job)
    if layout.shards_params and r is not None and r.fsdp_float8_all_gather and job.method == "full":
        per_mb /= layout.dp
    return (per_token * tokens + per_mb) / (layout.tp * layout.pp) / rates.hbm_bytes_per_s


def dequant_time(model: ModelSpec, job: Job, layout: Layout, rates: Rates, eff: Efficiency) -> float:
    """GPU seconds of bitsandbytes 4-bit dequantization in one micro-batch on one GPU.

    Every quantized weight is dequantized in the forward, again for the input gradient in
    backward, and again in the recompute under checkpointing, at the measured cost in bytes per
    weight at the datasheet bandwidth (efficiency.json ``dequant``). A torchao weight-only FP8 /
    NVFP4 base (``job.low_precision``) instead: its passes and bytes from
    :func:`ftplan.lowprec.weight_only_dequant`, at the achieved HBM bandwidth.
    """
    if job.low_precision and job.method != "qlora":
        from .lowprec import weight_only_dequant

        passes, nbytes = weight_only_dequant(model, job, recompute_fractions(job, eff, model).matmul)
        return passes * nbytes / (layout.tp * layout.pp) / rates.hbm_bytes_per_s
    if job.casts_fp32_base and layout.engine in ("torch", "ddp"):
        # autocast casts each fp32 base weight in the forward (and again in the recompute); the
        # matmul keeps that copy for the input gradient: read fp32, write the compute dtype per
        # weight and pass
        elems = sum(lin.in_features * lin.out_features * lin.count for lin in model.linears())
        passes = 1.0 + recompute_fractions(job, eff, model).matmul
        per_weight = float(dtype_bytes(job.frozen_dtype) + dtype_bytes(compute_dtype(job)))
        return passes * elems * per_weight / (layout.tp * layout.pp) / rates.hbm_bytes_per_s
    if job.method != "qlora":
        return 0.0
    passes = 2.0 + recompute_fractions(job, eff, model).matmul
    b = eff.dequant_bytes_per_weight + (eff.dequant_double_quant_extra_bytes if job.quant.double_quant else 0.0)
    q = _quantized_params(model, job) / (layout.tp * layout.pp)
    return passes * q * b / rates.hbm_nominal_bytes_per_s


# ---------------------------------------------------------------------------------------------
# host (CPU) side
# ---------------------------------------------------------------------------------------------
_LORA_COUNT_CACHE: dict[tuple, float] = {}


def _lora_module_count(model: ModelSpec, job: Job) -> float:
    if not job.uses_lora:
        return 0.0
    key = (model, job.lora)
    hit = _LORA_COUNT_CACHE.get(key)
    if hit is None:
        targets = lora_targets(model, job.lora)
        hit = float(sum(lin.count for lin in model.linears() if lin.is_module and lin.module in targets))
        if len(_LORA_COUNT_CACHE) > 1024:
            _LORA_COUNT_CACHE.clear()
        _LORA_COUNT_CACHE[key] = hit
    return hit


def _quant_module_count(model: ModelSpec, job: Job) -> float:
    if job.method != "qlora":
        return 0.0
    skip = set(job.quant.skip_modules)
    return float(sum(lin.count for lin in model.linears() if lin.is_module and lin.module not in skip))


def host_time(model: ModelSpec, job: Job, layout: Layout, eff: Efficiency) -> float:
    """CPU seconds to launch one micro-batch: ops per layer, per LoRA module and per bitsandbytes
    4-bit module x passes (forward, backward, recompute) x the per-op dispatch time, plus the Python
    work of ``torch.utils.checkpoint`` per checkpointed layer; ``torch.compile`` keeps
    ``compile_op_factor`` of the launches."""
    n_lora = _lora_module_count(model, job)
    n_quant = _quant_module_count(model, job)
    ops_fwd = (model.num_layers * eff.ops_per_layer_forward + n_lora * eff.ops_per_lora_module_forward
               + n_quant * eff.ops_per_quant_module_forward) / layout.pp
    rc = recompute_fractions(job, eff, model).elementwise
    passes = 1.0 + eff.backward_op_factor + rc
    ops = ops_fwd * passes * (eff.compile_op_factor if job.torch_compile else 1.0)
    ops += rc * model.num_layers / layout.pp * eff.checkpoint_ops_per_layer
    return ops * eff.dispatch_s_per_op


def loss_syncs(job: Job) -> bool:
    """The loss path waits for the GPU between the forward and the backward: TRL's fused LM head
    scores only the labelled positions (``hidden_states[mask]``, a boolean index whose size the host
    must read: trl/trainer/utils.py ``add_fused_lm_head``), so the host cannot launch the backward
    while the forward runs."""
    return job.loss == "trl"


def _host_forward_share(model: ModelSpec, job: Job, layout: Layout, eff: Efficiency) -> float:
    h = host_time(model, job, layout, eff)
    if h <= 0:
        return 0.0
    rc = recompute_fractions(job, eff, model).elementwise
    ckpt = rc * model.num_layers / layout.pp * eff.checkpoint_ops_per_layer * eff.dispatch_s_per_op
    passes = 1.0 + eff.backward_op_factor + rc
    return (h - ckpt) / passes / h


def step_overhead(eff: Efficiency) -> float:
    """Fixed seconds per optimizer step (zero_grad, scheduler, logging, sync, data hand-off)."""
    return eff.step_fixed_s


# ---------------------------------------------------------------------------------------------
# optimizer
# ---------------------------------------------------------------------------------------------
def host_link_bytes_per_s(gpu: Any, eff: Efficiency) -> float:
    """Achieved host<->GPU bytes/s of offload transfers: ``pcie_bytes_per_s``, measured on a PCIe
    Gen4 x16 link, scaled down when the GPU's host link (``pcie_bw_gbps``: its PCIe generation at
    x16, or a stated slower slot) is slower than that link; never scaled up."""
    link = getattr(gpu, "pcie_bw_gbps", None)
    ref = eff.pcie_measured_link_gbps
    if link and 0 < float(link) < ref:
        return eff.pcie_bytes_per_s * float(link) / ref
    return eff.pcie_bytes_per_s


def optimizer_time(st: Any, job: Job, layout: Layout, rates: Rates, eff: Efficiency,
                   expert_share: float = 0.0, host_bytes_per_s: float | None = None) -> tuple[float, float]:
    """(optimizer seconds, offload transfer seconds) per step on one GPU.

    On the GPU: read weights, master, gradients and states and write weights, master and states
    (x the implementation's traffic factor: fused 1, foreach/for-loop ~3), plus gradient clipping,
    on this GPU's shard (with expert parallelism an unsharded optimizer holds ``1 / ep`` of the
    routed experts, ``expert_share`` of the parameters). Offloaded: CPU Adam at ``cpu_adam_params_per_s`` plus the gradient and
    parameter transfers over PCIe (``host_bytes_per_s``, default ``pcie_bytes_per_s``).
    """
    mp = layout.tp * layout.pp
    dp = layout.dp
    shard = dp if layout.shards_optimizer else 1
    grads = st.gradients / mp
    upd_params = (st.params_trainable * float(dtype_bytes(compute_dtype(job))) if job.method == "full"
                  else st.trainable_weights) / mp
    if layout.offload_optimizer:
        n_shard = st.params_trainable / mp / shard
        opt = n_shard / eff.cpu_adam_params_per_s
        xfer = (grads / (dp if layout.shards_grads else 1) + upd_params / shard) / (host_bytes_per_s or eff.pcie_bytes_per_s)
        return opt, xfer
    factor = eff.optimizer_traffic_factor.get(job.optimizer_impl, 1.0)
    if job.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        factor = eff.optimizer_traffic_factor["fused"]  # bitsandbytes' 8-bit optimizers are fused kernels
    opt_bytes = (factor * (2.0 * (st.trainable_weights + st.master_weights + st.optimizer_states) + st.gradients)
                 + eff.grad_clip_bytes_factor * st.gradients) / mp / shard
    if layout.ep > 1 and job.method == "full" and not layout.shards_optimizer:
        # an unsharded optimizer updates only the rank's 1/ep of the routed experts
        opt_bytes *= (1.0 - expert_share) + expert_share / layout.ep
    return opt_bytes / rates.hbm_bytes_per_s, 0.0


# ---------------------------------------------------------------------------------------------
# communication
# ---------------------------------------------------------------------------------------------
def all_reduce_time(nbytes: float, n: int, bw_bytes_per_s: float, latency_s: float = 0.0,
                    bucket_bytes: float | None = None) -> float:
    """Ring all-reduce: 2(n-1)/n x bytes / bw, plus 2(n-1) latencies per bucket."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    buckets = math.ceil(nbytes / bucket_bytes) if bucket_bytes else 1
    return 2.0 * (n - 1) / n * nbytes / bw_bytes_per_s + 2.0 * (n - 1) * latency_s * buckets


def reduce_scatter_time(nbytes: float, n: int, bw_bytes_per_s: float, latency_s: float = 0.0,
                        bucket_bytes: float | None = None) -> float:
    """Ring reduce-scatter or all-gather of a ``nbytes`` buffer: (n-1)/n x bytes / bw, plus
    (n-1) latencies per bucket (collective)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    buckets = math.ceil(nbytes / bucket_bytes) if bucket_bytes else 1
    return (n - 1) / n * nbytes / bw_bytes_per_s + (n - 1) * latency_s * buckets


all_gather_time = reduce_scatter_time


def pp_bubble_fraction(pp: int, micro_batches: int, virtual: int = 1) -> float:
    """Idle fraction of a 1F1B / GPipe schedule: (pp - 1) / (m + pp - 1); with ``virtual`` model
    chunks per rank (interleaved 1F1B) the bubble shrinks ``virtual``-fold: (pp - 1) / v against m
    micro-batch times (Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on
    GPU Clusters Using Megatron-LM', section 2.2.2)."""
    if pp <= 1:
        return 0.0
    b = (pp - 1) / max(1, virtual)
    return b / (micro_batches + b)


class _Links(NamedTuple):
    dp_bw: float  # B/s per GPU for data-parallel collectives
    hop_latency: float  # average ring-step latency of a data-parallel collective
    intra_bw: float  # B/s per GPU inside the node (tensor/pipeline parallel)
    intra_latency: float


def _links(gpu: Any, layout: Layout, offer: Any | None, eff: Efficiency) -> _Links:
    name = str(getattr(gpu, "name", "")).lower()
    if name in eff.no_p2p_gpus and layout.gpus_per_node > 1:
        pcie = getattr(gpu, "pcie_bw_gbps", None) or getattr(gpu, "intra_node_bw_gbps", 0)
        intra = float(pcie or 0) * 1e9 * eff.host_bounce_factor * eff.bus_efficiency
    else:
        bw_for = getattr(gpu, "intra_node_bw_for", None)
        gbs = bw_for(layout.gpus_per_node) if callable(bw_for) else getattr(gpu, "intra_node_bw_gbps", 0)
        intra = float(gbs or 0) * 1e9 * eff.bus_efficiency
    if intra <= 0:
        intra = 1e9  # unknown link: assume a slow one rather than a free one
    lat_i = eff.latency_hop_intra_s
    if layout.nodes <= 1:
        return _Links(intra, lat_i, intra, lat_i)
    gbps = getattr(offer, "inter_node_gbps", None) if offer is not None else None
    if not gbps:
        raise ConfigError(
            f"{layout.nodes} nodes need an inter-node network bandwidth",
            "price it on an offer with an inter-node network, or use one node (`nodes=1`)",
            field="nodes",
        )
    # NCCL runs one ring per channel, each crossing the network once per node through a
    # different GPU's NIC: a node's GPUs together push (n-1)/n x the buffer through the node's
    # whole network bandwidth while each GPU pushes the same through its own intra-node link, so
    # a collective runs at min(intra-node per GPU, inter-node per node) "bus" bandwidth
    per_node = float(gbps) / 8.0 * 1e9 * eff.bus_efficiency
    # a ring over n GPUs on N nodes: N of its n steps cross the network
    n = layout.world_size
    hop = (lat_i * (n - layout.nodes) + eff.latency_hop_inter_s * layout.nodes) / n
    return _Links(min(intra, per_node), hop, intra, lat_i)


class _Comm(NamedTuple):
    raw_s: float  # all data-parallel communication of one step
    per_micro_batch_s: float  # the part that runs during every micro-batch (ZeRO-3/FSDP, ZeRO-2)
    last_backward_s: float  # the part that overlaps the last micro-batch's backward (DDP, ZeRO-1)
    after_step_s: float  # the part after the optimizer step (ZeRO-1/2 parameter all-gather)
    units: int  # collectives per pass (FSDP units = layers + 1)


def dp_comm(st: Any, model: ModelSpec, job: Job, layout: Layout, links: _Links, eff: Efficiency) -> _Comm:
    """Data-parallel communication of one step on one GPU (bandwidth + ring latency per collective).

    With expert parallelism (``layout.ep > 1``) the routed experts' bytes move in their own group
    instead: ``1 / ep`` of them over the ``dp x tp / ep`` ranks that hold the same experts
    (:mod:`ftplan.expert_parallel`); the rest of the model over the data-parallel group."""
    dp = layout.dp
    if dp <= 1 and layout.ep <= 1:
        return _Comm(0.0, 0.0, 0.0, 0.0, 1)
    mp = layout.tp * layout.pp
    units = max(1, math.ceil(model.num_layers / layout.pp)) + 1
    grads = st.gradients
    if job.method == "full":
        gather = st.params_trainable * float(dtype_bytes(compute_dtype(job)))
        upd = gather
        if layout.shards_params:  # FSDP2 float8 all-gather: converted weights travel in FP8
            gather -= _fp8_gather_saving(model, job)
    else:
        # an fp32-loaded LoRA base travels in the compute dtype (FSDP's param_dtype, DeepSpeed's
        # bf16 module)
        base = st.frozen_weights * (float(dtype_bytes(PRECISIONS[job.precision]["frozen"]))
                                    / float(dtype_bytes(job.frozen_dtype))) if job.method == "lora" else st.frozen_weights
        gather = base + st.trainable_weights
        upd = st.trainable_weights
    if layout.ep <= 1:
        return _dp_collectives(gather / mp, grads / mp, upd / mp, dp, units, job, layout, links, eff)
    ge, gre, ue = _expert_comm_bytes(model, job)
    ep = layout.ep
    rest = _dp_collectives(max(0.0, gather - ge) / mp, max(0.0, grads - gre) / mp, max(0.0, upd - ue) / mp,
                           dp, units, job, layout, links, eff)
    pe = layout.pp * ep
    ex = _dp_collectives(ge / pe, gre / pe, ue / pe, dp * layout.tp // ep, units, job, layout, links, eff)
    return _Comm(rest.raw_s + ex.raw_s, rest.per_micro_batch_s + ex.per_micro_batch_s,
                 rest.last_backward_s + ex.last_backward_s, rest.after_step_s + ex.after_step_s, rest.units)


def _expert_comm_bytes(model: ModelSpec, job: Job) -> tuple[float, float, float]:
    """Whole-model bytes of the routed experts that data-parallel collectives move: (gathered
    weights, gradients, updated weights). Frozen experts (LoRA/QLoRA) only gather, in their
    storage dtype (QLoRA's fused 3-D experts are not quantized and are upcast to fp32)."""
    n = float(model.params.experts or 0)
    if job.method == "full":
        c = n * float(dtype_bytes(compute_dtype(job)))
        return c, n * float(dtype_bytes(PRECISIONS[job.precision]["grad"])), c
    w = float(dtype_bytes(job.unquantized_dtype)) if job.method == "qlora" else \
        float(dtype_bytes(PRECISIONS[job.precision]["frozen"]))  # gathered / cast in the compute dtype
    return n * w, 0.0, 0.0


def _dp_collectives(gather: float, grads: float, upd: float, n: int, units: int, job: Job, layout: Layout,
                    links: _Links, eff: Efficiency) -> _Comm:
    """The strategy's collectives of per-GPU ``gather`` / ``grads`` / ``upd`` bytes over ``n`` ranks."""
    if n <= 1:
        return _Comm(0.0, 0.0, 0.0, 0.0, units)
    m = job.grad_accum
    bw, lat = links.dp_bw, links.hop_latency
    s = layout.strategy

    def coll(nbytes: float, n_coll: int) -> float:  # ring all-gather / reduce-scatter
        return (n - 1) / n * nbytes / bw + (n - 1) * lat * n_coll if nbytes > 0 else 0.0

    if s == "ddp":
        buckets = max(1, math.ceil(grads / eff.ddp_bucket_bytes))
        ar = 2.0 * coll(grads, buckets)
        return _Comm(ar, 0.0, ar, 0.0, buckets)
    if s == "zero1":
        rs = coll(grads, units)
        ag = coll(upd, units)
        return _Comm(rs + ag, 0.0, rs, ag, units)
    if s == "zero2":
        rs = coll(grads, units)
        ag = coll(upd, units)
        return _Comm(m * rs + ag, rs, 0.0, ag, units)
    if s in ("zero3", "fsdp"):
        mb = 2.0 * coll(gather, units) + coll(grads, units)
        return _Comm(m * mb, mb, 0.0, 0.0, units)
    return _Comm(0.0, 0.0, 0.0, 0.0, units)


def _exposed(comm_s: float, compute_s: float, eff: Efficiency, first_s: float) -> float:
    """Communication not hidden behind ``compute_s`` of concurrent GPU work: what exceeds it, the
    share overlap costs the compute (NCCL kernels use SMs), and a part that cannot overlap."""
    if comm_s <= 0:
        return 0.0
    hidden = min(comm_s, compute_s)
    return max(comm_s - compute_s, 0.0) + (1.0 - eff.overlap_efficiency) * hidden + first_s


def tp_comm(model: ModelSpec, job: Job, layout: Layout, tokens: float, links: _Links) -> float:
    """Tensor-parallel all-reduces of one micro-batch (2 per layer forward, 2 backward, 2 more in
    the recompute): activation bytes over the node's links, on the critical path."""
    tp = layout.tp
    if tp <= 1:
        return 0.0
    act = tokens * model.hidden_size * float(dtype_bytes(compute_dtype(job)))
    n_ar = (4.0 + 2.0 * recompute_fractions(job, None, model).matmul) * model.num_layers / layout.pp
    return n_ar * all_reduce_time(act, tp, links.intra_bw, links.intra_latency)


def pp_comm(model: ModelSpec, job: Job, layout: Layout, tokens: float, links: _Links) -> float:
    """Pipeline point-to-point sends of one micro-batch: activations forward, gradients back, once
    per model chunk of the rank (an interleaved schedule with ``pp_virtual`` chunks sends
    ``pp_virtual`` times as much: Narayanan et al. 2021, section 2.2.2)."""
    if layout.pp <= 1:
        return 0.0
    act = tokens * model.hidden_size * float(dtype_bytes(compute_dtype(job)))
    bw = links.dp_bw if layout.nodes > 1 else links.intra_bw
    return 2.0 * layout.pp_virtual * (act / bw + links.hop_latency)


def ep_comm(model: ModelSpec, job: Job, layout: Layout, tokens: float, links: _Links,
            rc: Recompute | None = None) -> float:
    """Expert-parallel all-to-alls of one micro-batch of ``tokens`` tokens on the busiest rank,
    on the critical path: per MoE layer ``a2a_per_moe_layer_forward`` (dispatch and combine) in
    the forward, as many in backward, and again for the recomputed share under checkpointing;
    each moves the rows the busiest rank's experts receive (``ep_rows_per_rank``: tokens x top_k
    x the worst-rank load factor of catalog/data/moe.json) of the hidden size in the compute
    dtype, over NVLink when the EP group fits in a node (:mod:`ftplan.expert_parallel`)."""
    ep = layout.ep
    if ep <= 1:
        return 0.0
    from .catalog.hostdata import moe_constants
    from .expert_parallel import all_to_all_time, ep_rows_per_rank

    rc = rc or recompute_fractions(job, None, model)
    inside = ep <= layout.gpus_per_node
    bw = links.intra_bw if inside else links.dp_bw
    lat = links.intra_latency if inside else links.hop_latency
    c = float(dtype_bytes(compute_dtype(job)))
    per_pass = moe_constants().a2a_per_moe_layer_forward
    passes = 2.0 + rc.matmul
    total = 0.0
    for g in model.groups:
        if g.moe is None:
            continue
        rows = ep_rows_per_rank(int(tokens), g.moe)
        total += g.count / layout.pp * passes * per_pass * all_to_all_time(rows * model.hidden_size * c, ep, bw, lat)
    return total


# ---------------------------------------------------------------------------------------------
# the estimate
# ---------------------------------------------------------------------------------------------
class _Static(NamedTuple):
    """Everything of an estimate that does not depend on the micro-batch size or accumulation."""

    model: ModelSpec  # identity check for the id()-keyed cache
    gpu: Any
    eff: Efficiency
    rates: Rates
    f: FlopsPerToken
    st: Any
    lins: tuple
    params_gpu: float
    attn_per_token_s: float
    ew_per_token_s: float
    dequant_s: float
    host_s: float
    host_forward_share: float
    links: _Links
    quant_per_token_s: float
    quant_fixed_s: float
    tp_per_token_s: float
    tp_latency_s: float
    pp_per_token_s: float
    pp_latency_s: float
    optimizer_s: float
    rc: Recompute
    offload_xfer_s: float
    offload_gather_bytes: float
    host_bytes_per_s: float  # offload transfers (host_link_bytes_per_s)
    startup_hours: float


_STATIC_CACHE: dict[tuple, _Static] = {}


def _job_static_key(job: Job) -> tuple:
    return tuple(getattr(job, f) for f in job.__dataclass_fields__ if f not in _PER_CALL_FIELDS)


#: Job fields an estimate's static part does not depend on
_PER_CALL_FIELDS = frozenset({"micro_batch", "grad_accum", "dataset_tokens", "epochs"})


def _static(model: ModelSpec, job: Job, layout: Layout, gpu: Any, offer: Any | None, eff: Efficiency) -> _Static:
    bw = getattr(offer, "inter_node_gbps", None) if offer is not None else None
    key = (id(model), id(gpu), id(eff), _job_static_key(job), layout, bw)
    hit = _STATIC_CACHE.get(key)
    if hit is not None and hit.model is model and hit.gpu is gpu and hit.eff is eff:
        return hit
    rates = rates_for(gpu, job, eff)
    mp = layout.tp * layout.pp
    st = _states(model, job)
    params_gpu = st.params_trainable / mp / (layout.dp if layout.shards_params else 1)
    links = _links(gpu, layout, offer, eff)
    share = (model.params.experts or 0) / max(1, model.params.total) if layout.ep > 1 else 0.0
    host_bw = host_link_bytes_per_s(gpu, eff)
    opt, xfer = optimizer_time(st, job, layout, rates, eff, share, host_bw)
    rc = recompute_fractions(job, eff, model)
    gather = 0.0
    if layout.offload_params:  # FSDP CPUOffload: each GPU's shard goes up for forward and backward
        gather = ((st.params_trainable * float(dtype_bytes(compute_dtype(job)))) if job.method == "full"
                  else (st.frozen_weights + st.trainable_weights))
    # both are (bytes proportional to tokens) / bandwidth + latency: two points give the line
    tp1, tp2 = tp_comm(model, job, layout, 1.0, links), tp_comm(model, job, layout, 2.0, links)
    pp1, pp2 = pp_comm(model, job, layout, 1.0, links), pp_comm(model, job, layout, 2.0, links)
    tp0, pp0 = 2.0 * tp1 - tp2, 2.0 * pp1 - pp2
    res = _Static(
        model=model, gpu=gpu, eff=eff, rates=rates, f=flops_per_token(model, job), st=st,
        lins=_linear_profile(model, job, layout.tp, layout.pp, fp32_expert_gemms(model, job, layout)),
        params_gpu=params_gpu,
        attn_per_token_s=attention_time(model, job, layout, 1.0, rates, eff),
        ew_per_token_s=_elementwise_bytes_per_token(model, job, layout, eff) / rates.hbm_bytes_per_s,
        dequant_s=dequant_time(model, job, layout, rates, eff),
        quant_per_token_s=quantize_time(model, job, layout, 1.0, rates) - quantize_time(model, job, layout, 0.0, rates),
        quant_fixed_s=quantize_time(model, job, layout, 0.0, rates),
        host_s=host_time(model, job, layout, eff),
        host_forward_share=_host_forward_share(model, job, layout, eff),
        links=links,
        tp_per_token_s=tp2 - tp1, tp_latency_s=tp0, pp_per_token_s=pp2 - pp1, pp_latency_s=pp0,
        optimizer_s=opt, rc=rc, offload_xfer_s=xfer, offload_gather_bytes=gather, host_bytes_per_s=host_bw,
        startup_hours=(eff.startup_fixed_s + _params_total(model) * 2.0 / eff.startup_load_bytes_per_s) / 3600.0,
    )
    if len(_STATIC_CACHE) > 4096:
        _STATIC_CACHE.clear()
    _STATIC_CACHE[key] = res
    return res


def estimate_runtime(model: ModelSpec, job: Job, layout: Layout, gpu: Any, *, offer: Any | None = None,
                     eff: Efficiency | None = None) -> RuntimeEstimate:
    """Per-step times and the job's hours on ``layout`` of ``gpu`` (``offer`` gives the network)."""
    eff = eff or efficiency()
    job, _ = planned_attention(model, job)
    sx = _static(model, job, layout, gpu, offer, eff)
    rates, f, st, links = sx.rates, sx.f, sx.st, sx.links
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    mp = tp * pp
    world = layout.world_size
    m = job.grad_accum
    tok = float(job.micro_batch * job.seq_len)

    # -- GPU work of one micro-batch on one GPU
    t_mm, t_mm_low, t_mm_fp32 = _matmul_seconds(sx.lins, tok, rates)
    t_q = tok * sx.quant_per_token_s + sx.quant_fixed_s
    t_attn = tok * sx.attn_per_token_s
    t_ew = tok * sx.ew_per_token_s + _weight_traffic_bytes(model, job, layout, eff, sx.params_gpu, 1.0 / m,
                                                           sx.rc) / rates.hbm_bytes_per_s
    t_dq = sx.dequant_s
    t_tp = tok * sx.tp_per_token_s + sx.tp_latency_s if tp > 1 else 0.0
    t_ppc = tok * sx.pp_per_token_s + sx.pp_latency_s if pp > 1 else 0.0
    t_ep = ep_comm(model, job, layout, tok, links, sx.rc) if layout.ep > 1 else 0.0
    gpu_mb = t_mm + t_attn + t_ew + t_dq + t_q
    host_mb = sx.host_s

    # -- data-parallel communication and how much of it compute hides
    comm = dp_comm(st, model, job, layout, links, eff)
    first = comm.per_micro_batch_s / (3.0 * comm.units) if comm.per_micro_batch_s else 0.0
    exposed_mb = _exposed(comm.per_micro_batch_s, gpu_mb, eff, first)
    bwd_share = 2.0 / 3.0  # the backward is about two thirds of a micro-batch's GPU work
    tail = min(comm.last_backward_s, 2.0 * eff.ddp_bucket_bytes / links.dp_bw) if comm.last_backward_s else 0.0
    exposed_step = _exposed(comm.last_backward_s, bwd_share * gpu_mb, eff, tail) + comm.after_step_s

    busy_mb = gpu_mb + exposed_mb + t_tp + t_ppc + t_ep
    if loss_syncs(job):
        # the forward and the backward each take the longer of their GPU and host parts (the
        # forward's share of the GPU work by FLOPs, of the host work by passes)
        g_f = busy_mb * f.forward / f.hardware if f.hardware > 0 else 0.0
        h_f = host_mb * sx.host_forward_share
        mb_time = max(g_f, h_f) + max(busy_mb - g_f, host_mb - h_f)
    else:
        mb_time = max(busy_mb, host_mb)
    compute = m * gpu_mb
    bubble = (pp - 1) * mb_time / layout.pp_virtual if pp > 1 else 0.0  # pp_bubble_fraction

    opt = sx.optimizer_s
    offload_s = sx.offload_xfer_s + (m * 2.0 * sx.offload_gather_bytes / mp / dp / sx.host_bytes_per_s
                                     if sx.offload_gather_bytes else 0.0)
    fixed = step_overhead(eff)
    step = m * mb_time + bubble + exposed_step + opt + offload_s + fixed

    tokens_per_step = int(tok) * m * dp
    tps = tokens_per_step / step
    mfu = f.model * tps / (world * rates.peak_flops)
    matmul_flops = tok * (f.base_matmul + f.adapters) * (3.0 if job.method == "full" else 2.0) / mp
    achieved = matmul_flops / (t_mm * rates.peak_flops) if t_mm > 0 else 0.0

    lo, hi = math.exp(eff.band_log_low), math.exp(eff.band_log_high)
    dp_raw = comm.raw_s
    rt = RuntimeEstimate(
        step_time_s=step,
        compute_time_s=compute,
        comm_time_s=dp_raw + m * (t_tp + t_ppc + t_ep),
        exposed_comm_s=m * exposed_mb + exposed_step + m * (t_tp + t_ppc + t_ep),
        optimizer_time_s=opt,
        dequant_time_s=m * t_dq,
        tokens_per_s=tps,
        mfu=mfu,
        flops_per_token=f.model,
        total_tokens=None,
        steps=None,
        hours=None,
        startup_hours=sx.startup_hours,
        tokens_per_step=tokens_per_step,
        efficiency=achieved,
        breakdown={
            "compute_s": compute,
            "matmul_s": m * t_mm,
            "attention_s": m * t_attn,
            "elementwise_s": m * t_ew,
            "dequant_s": m * t_dq,
            "low_precision_matmul_s": m * t_mm_low,
            # routed experts' GEMMs at the FP32 rate (fp32_expert_gemms; part of matmul_s)
            "fp32_expert_matmul_s": m * t_mm_fp32,
            "quantize_s": m * t_q,
            "host_per_micro_batch_s": host_mb,
            "gpu_per_micro_batch_s": gpu_mb,
            "pp_bubble_s": bubble,
            "dp_comm_s": dp_raw,
            "dp_comm_exposed_s": m * exposed_mb + exposed_step,
            "tp_comm_s": m * t_tp,
            "pp_comm_s": m * t_ppc,
            "ep_all_to_all_s": m * t_ep,
            "optimizer_s": opt,
            "offload_transfer_s": offload_s,
            "step_overhead_s": fixed,
            "hardware_flops_per_token": f.hardware,
            "peak_tflops": rates.peak_flops / 1e12,
            "low_precision_tflops": rates.lp_flops / 1e12,
            "clock_factor": rates.clock,
        },
        step_time_s_low=step * lo,
        step_time_s_high=step * hi,
        tokens_per_s_low=tokens_per_step / (step * hi),
        tokens_per_s_high=tokens_per_step / (step * lo),
        hours_low=None,
        hours_high=None,
        band_quantiles=eff.band_quantiles,
        host_bound=host_mb > busy_mb,
    )
    return for_dataset(rt, job.dataset_tokens, job.epochs)


def job_totals(dataset_tokens: int | None, epochs: float, tokens_per_step: int,
               step_time_s: float) -> tuple[int | None, int | None, float | None]:
    """(total tokens, optimizer steps, training hours) of a job whose step takes ``step_time_s``
    for ``tokens_per_step`` tokens; all None without a dataset size."""
    if not dataset_tokens:
        return None, None, None
    total = math.ceil(dataset_tokens * epochs)
    steps = math.ceil(total / tokens_per_step)
    return total, steps, steps * step_time_s / 3600.0


def for_dataset(rt: RuntimeEstimate, dataset_tokens: int | None, epochs: float) -> RuntimeEstimate:
    """``rt`` (the estimate of a step, which does not depend on the data size) with the totals of
    ``dataset_tokens x epochs`` tokens."""
    total, steps, hours = job_totals(dataset_tokens, epochs, rt.tokens_per_step, rt.step_time_s)
    if (total, steps, hours) == (rt.total_tokens, rt.steps, rt.hours):
        return rt
    lo = rt.step_time_s_low / rt.step_time_s if rt.step_time_s_low is not None else None
    hi = rt.step_time_s_high / rt.step_time_s if rt.step_time_s_high is not None else None
    return replace(rt, total_tokens=total, steps=steps, hours=hours,
                   hours_low=None if hours is None or lo is None else hours * lo,
                   hours_high=None if hours is None or hi is None else hours * hi)


_STATES_CACHE: dict[tuple, Any] = {}
_PARAMS_CACHE: dict[int, tuple[ModelSpec, int]] = {}


def _params_total(model: ModelSpec) -> int:
    hit = _PARAMS_CACHE.get(id(model))
    if hit is None or hit[0] is not model:
        if len(_PARAMS_CACHE) > 256:
            _PARAMS_CACHE.clear()
        hit = _PARAMS_CACHE[id(model)] = (model, model.params.total)
    return hit[1]
_QPARAMS_CACHE: dict[tuple, int] = {}


def _states(model: ModelSpec, job: Job):
    key = (model, job.method, job.precision, job.optimizer, job.lora, job.quant, job.gradient_checkpointing,
           job.low_precision, job.base_dtype)
    hit = _STATES_CACHE.get(key)
    if hit is None:
        if len(_STATES_CACHE) > 1024:
            _STATES_CACHE.clear()
        hit = _STATES_CACHE[key] = model_states(model, job)
    return hit


def _quantized_params(model: ModelSpec, job: Job) -> int:
    key = (model, job.quant.skip_modules)
    hit = _QPARAMS_CACHE.get(key)
    if hit is None:
        skip = set(job.quant.skip_modules)
        hit = sum(lin.count * lin.in_features * lin.out_features for lin in model.linears()
                  if lin.is_module and lin.module not in skip)
        _QPARAMS_CACHE[key] = hit
    return hit
