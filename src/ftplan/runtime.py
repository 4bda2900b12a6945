"""Step time, throughput and wall-clock hours of a fine-tuning job:
``estimate_runtime(model, job, layout, gpu, *, offer=None) -> RuntimeEstimate``.

Pure arithmetic, no I/O beyond the lazily loaded constants of ``catalog/data/efficiency.json``.

Model (per optimizer step, seen from one GPU):

* compute: hardware FLOPs of the micro-batches / (dense peak of the compute dtype x efficiency);
  FLOPs per token = forward (2 x matmul weights a token passes through, lm_head included, plus
  causal attention 2 x ctx x (q_dim + v_dim) per layer) + backward (2x forward for full
  fine-tuning; frozen LoRA/QLoRA bases need only input gradients: 1x for base matmuls, 2x for
  attention and adapters) + one forward recompute under gradient checkpointing;
* pipeline bubble (pp - 1) / (m + pp - 1) with m = gradient-accumulation micro-batches;
* QLoRA dequantization: 4-bit weights read + bf16 written per forward, backward and recompute
  pass, bound by HBM bandwidth;
* optimizer step: bytes of weights, master, gradients and states read/written / HBM bandwidth
  (CPU Adam + PCIe when the optimizer is offloaded);
* communication, alpha-beta: DDP gradient all-reduce, ZeRO/FSDP reduce-scatter + all-gather
  (ZeRO-3/FSDP gather parameters in forward and backward of every micro-batch), tensor-parallel
  activation all-reduces (2 per layer forward, 2 backward), pipeline point-to-point sends;
  intra-node bandwidth from the GPU, inter-node from the offer; data-parallel traffic overlaps
  with compute by the fraction in the data file, TP/PP traffic does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .actflops import loss_extra_flops_per_token, recompute_flops_per_token
from .catalog.efficiency import Efficiency, efficiency
from .errors import ConfigError
from .job import PRECISIONS, Job, Layout, lora_targets
from .memory import model_states
from .model import ModelSpec
from .units import dtype_bytes

__all__ = [
    "RuntimeEstimate",
    "FlopsPerToken",
    "estimate_runtime",
    "flops_per_token",
    "attention_context",
    "all_reduce_time",
    "reduce_scatter_time",
    "pp_bubble_fraction",
    "compute_dtype",
]


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
    compute_time_s: float  # matmul/attention work of one step (without the pipeline bubble)
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

    @property
    def total_hours(self) -> float | None:
        return None if self.hours is None else self.hours + self.startup_hours


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------
def compute_dtype(job: Job) -> str:
    if job.method == "qlora":
        return job.quant.compute_dtype
    return PRECISIONS[job.precision]["compute"]


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
# communication (alpha-beta)
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
    """Ring reduce-scatter or all-gather of a ``nbytes`` buffer: (n-1)/n x bytes / bw."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    buckets = math.ceil(nbytes / bucket_bytes) if bucket_bytes else 1
    return (n - 1) / n * nbytes / bw_bytes_per_s + (n - 1) * latency_s * buckets


all_gather_time = reduce_scatter_time


def pp_bubble_fraction(pp: int, micro_batches: int) -> float:
    """Idle fraction of a 1F1B / GPipe schedule: (pp - 1) / (m + pp - 1)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (micro_batches + pp - 1)


def _links(gpu: Any, layout: Layout, offer: Any | None, eff: Efficiency) -> tuple[float, float, float]:
    """(data-parallel bandwidth B/s, its latency, intra-node bandwidth B/s)."""
    bw_for = getattr(gpu, "intra_node_bw_for", None)
    gbs = bw_for(layout.gpus_per_node) if callable(bw_for) else getattr(gpu, "intra_node_bw_gbps", 0)
    intra = float(gbs or 0) * 1e9 * eff.bus_efficiency
    if intra <= 0:
        intra = 1e9  # unknown link: assume a slow one rather than a free one
    if layout.nodes <= 1:
        return intra, eff.latency_intra_s, intra
    gbps = getattr(offer, "inter_node_gbps", None) if offer is not None else None
    if not gbps:
        raise ConfigError(
            f"{layout.nodes} nodes need an inter-node network bandwidth",
            "pass an offer with inter_node_gbps, or use one node",
        )
    per_gpu = float(gbps) / 8.0 * 1e9 / layout.gpus_per_node * eff.bus_efficiency
    return min(intra, per_gpu), eff.latency_inter_s, intra


# ---------------------------------------------------------------------------------------------
# the estimate
# ---------------------------------------------------------------------------------------------
def estimate_runtime(model: ModelSpec, job: Job, layout: Layout, gpu: Any, *, offer: Any | None = None,
                     eff: Efficiency | None = None) -> RuntimeEstimate:
    """Per-step times and the job's hours on ``layout`` of ``gpu`` (``offer`` gives the network)."""
    eff = eff or efficiency()
    dt = compute_dtype(job)
    peak = gpu.peak_tflops(dt)
    if not peak:
        raise ConfigError(f"{getattr(gpu, 'name', gpu)} has no {dt} tensor throughput",
                          "pick another --precision (e.g. fp16-mixed) or another GPU")
    peak_flops = float(peak) * 1e12
    hbm = float(gpu.mem_bw_tbps) * 1e12 * eff.hbm_efficiency
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    mp = tp * pp
    world = layout.world_size
    m = job.grad_accum
    tok_mb = job.micro_batch * job.seq_len
    cbytes = float(dtype_bytes(dt))

    f = flops_per_token(model, job)
    e = eff.matmul_efficiency(getattr(gpu, "arch", None), getattr(gpu, "vendor", None), job.method,
                              model.hidden_size, tok_mb)
    stage_mb_s = tok_mb * f.hardware / mp / (peak_flops * e)  # one micro-batch on one stage
    compute = m * stage_mb_s
    bubble = (pp - 1) * stage_mb_s if pp > 1 else 0.0

    st = _states(model, job)
    bw_dp, lat_dp, bw_intra = _links(gpu, layout, offer, eff)
    bucket = eff.bucket_bytes

    # -- data-parallel communication
    grads = st.gradients / mp
    if job.method == "full":
        gather = st.params_trainable * cbytes / mp
    else:
        gather = (st.frozen_weights + st.trainable_weights) / mp
    upd_params = (st.params_trainable * cbytes if job.method == "full" else st.trainable_weights) / mp
    s = layout.strategy
    dp_comm = 0.0
    if dp > 1:
        if s == "ddp":
            dp_comm = all_reduce_time(grads, dp, bw_dp, lat_dp, bucket)
        elif s == "zero1":
            dp_comm = (reduce_scatter_time(grads, dp, bw_dp, lat_dp, bucket)
                       + all_gather_time(upd_params, dp, bw_dp, lat_dp, bucket))
        elif s == "zero2":
            dp_comm = (m * reduce_scatter_time(grads, dp, bw_dp, lat_dp, bucket)
                       + all_gather_time(upd_params, dp, bw_dp, lat_dp, bucket))
        elif s in ("zero3", "fsdp"):
            dp_comm = m * (2 * all_gather_time(gather, dp, bw_dp, lat_dp, bucket)
                           + reduce_scatter_time(grads, dp, bw_dp, lat_dp, bucket))
    overlap = eff.overlap.get(s, 0.0)
    dp_exposed = max(dp_comm * (1.0 - overlap), dp_comm - compute) if dp_comm else 0.0

    # -- tensor / pipeline parallel communication (on the critical path)
    act = tok_mb * model.hidden_size * cbytes
    tp_comm = 0.0
    if tp > 1:
        n_ar = (4 + (2 if job.gradient_checkpointing else 0)) * model.num_layers / pp
        tp_comm = m * n_ar * all_reduce_time(act, tp, bw_intra, eff.latency_intra_s)
    pp_comm = 0.0
    if pp > 1:
        bw_pp = bw_dp if layout.nodes > 1 else bw_intra
        pp_comm = m * 2.0 * (act / bw_pp + lat_dp)

    # -- QLoRA dequantization (HBM bound): 0.5 B read + 2 B written per weight per pass
    dequant = 0.0
    if job.method == "qlora":
        passes = 2 + (1 if job.gradient_checkpointing else 0)
        dequant = m * passes * _quantized_params(model, job) / mp * 2.5 / hbm

    # -- optimizer step
    shard = dp if layout.shards_optimizer else 1
    offload_s = 0.0
    if layout.offload_optimizer:
        n_shard = st.params_trainable / mp / shard
        opt_time = n_shard / eff.cpu_adam_params_per_s
        offload_s = (grads / (dp if layout.shards_grads else 1) + upd_params / shard) / eff.pcie_bytes_per_s
    else:
        opt_bytes = (2.0 * (st.trainable_weights + st.master_weights + st.optimizer_states)
                     + st.gradients) / mp / shard
        opt_time = opt_bytes / hbm
    if layout.offload_params:
        offload_s += m * 2.0 * gather / dp / eff.pcie_bytes_per_s  # own shard up, fwd + bwd

    comm = dp_comm + tp_comm + pp_comm
    exposed = dp_exposed + tp_comm + pp_comm
    step = compute + bubble + dequant + exposed + opt_time + offload_s
    tokens_per_step = tok_mb * m * dp
    tps = tokens_per_step / step
    mfu = f.model * tps / (world * peak_flops)

    total = steps = hours = None
    if job.dataset_tokens:
        total = math.ceil(job.dataset_tokens * job.epochs)
        steps = math.ceil(total / tokens_per_step)
        hours = steps * step / 3600.0
    startup = (eff.startup_fixed_s + model.params.total * 2.0 / eff.startup_load_bytes_per_s) / 3600.0
    return RuntimeEstimate(
        step_time_s=step,
        compute_time_s=compute,
        comm_time_s=comm,
        exposed_comm_s=exposed,
        optimizer_time_s=opt_time,
        dequant_time_s=dequant,
        tokens_per_s=tps,
        mfu=mfu,
        flops_per_token=f.model,
        total_tokens=total,
        steps=steps,
        hours=hours,
        startup_hours=startup,
        tokens_per_step=tokens_per_step,
        efficiency=e,
        breakdown={
            "compute_s": compute,
            "pp_bubble_s": bubble,
            "dequant_s": dequant,
            "dp_comm_s": dp_comm,
            "dp_comm_exposed_s": dp_exposed,
            "tp_comm_s": tp_comm,
            "pp_comm_s": pp_comm,
            "optimizer_s": opt_time,
            "offload_transfer_s": offload_s,
            "hardware_flops_per_token": f.hardware,
            "peak_tflops": float(peak),
        },
    )


_STATES_CACHE: dict[tuple, Any] = {}
_QPARAMS_CACHE: dict[tuple, int] = {}


def _states(model: ModelSpec, job: Job):
    key = (model, job.method, job.precision, job.optimizer, job.lora, job.quant)
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
