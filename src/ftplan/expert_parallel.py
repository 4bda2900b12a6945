"""MoE expert parallelism (EP): memory per rank, all-to-all time, layouts.

How it runs (transformers 5 ``DistributedConfig(fsdp_size, ep_size)`` with the all-to-all
``AllToAllEP``, torchtitan's EP, Megatron's ``MoEAlltoAllTokenDispatcher``): the routed experts
of every MoE layer are split over ``ep`` ranks of the data-parallel group (``num_experts / ep``
whole experts each); every rank routes its own tokens, sends each (token, expert) row to the
expert's rank with an all-to-all, runs its local experts on the rows it receives, and sends the
outputs back with a second all-to-all, where the routing weights are applied. The rest of the
model (attention, dense MLPs, shared experts, routers, embeddings) is sharded by the layout's
strategy over the data-parallel group; the experts by the same strategy over the
``dp x tp / ep`` ranks that hold the same experts ("expert FSDP", transformers' ``efsdp``).

Memory per rank (``ep_rank_states``, ``ep_experts_saved``, ``ep_dispatch_transient_bytes``):

* states: the expert share of each state is divided by ``ep`` x (``dp x tp / ep`` when the
  strategy shards that state, else 1): with FSDP / ZeRO-3 the per-rank bytes equal plain FSDP's,
  with DDP / ZeRO-1/2 the replicated expert weights (and gradients) shrink by ``ep``;
* ZeRO-3 / FSDP gather only the rank's ``num_experts / ep`` experts of a layer, not all of them;
* activations: the experts run on the rows this rank *receives*: ``t x top_k`` on average,
  ``t x top_k x worst_rank_load_factor`` on the busiest rank (``catalog/data/moe.json``), with
  the EP path's own saved tensors (dispatch / combine orders, the received rows, the unit
  weights, the combined outputs and routing weights: held byte-exact against a gloo run);
* transient: the send and receive buffers of one all-to-all.

LoRA adapters on the experts (PEFT ParamWrapper) are taken as replicated, not split by EP
(not measured: PEFT does not wrap DTensor experts).
"""

from __future__ import annotations

import math
from typing import Any

from .catalog.hostdata import moe_constants
from .job import PRECISIONS, Job, Layout
from .model import ModelSpec, MoeSpec
from .units import dtype_bytes

__all__ = [
    "ep_rows_per_rank",
    "ep_experts_saved",
    "ep_runtime",
    "expert_state_bytes",
    "ep_rank_states",
    "ep_dispatch_transient_bytes",
    "all_to_all_time",
    "ep_comm_time_s",
    "ep_degrees",
]


def ep_rows_per_rank(tokens: int, moe: MoeSpec, load_factor: float | None = None) -> int:
    """(token, expert) rows the busiest rank's experts receive per micro-batch."""
    f = moe_constants().worst_rank_load_factor if load_factor is None else load_factor
    return math.ceil(tokens * moe.top_k * f)


def ep_experts_saved(m: MoeSpec, t: int, rows: int, h: int, dt: Any, ep: int, w_bytes: int) -> int:
    """Bytes the expert-parallel experts path of one MoE layer saves for backward on a rank that
    routes ``t`` tokens and receives ``rows`` (token, expert) rows (transformers ``AllToAllEP``
    around the ``grouped_mm`` experts):

    * dispatch: the gather index of the sent rows (``t x top_k`` int64);
    * experts on the received rows (top-1, unit weights): the sort and inverse-sort indices
      (2 x rows int64), the off-rank sentinel mask (rows bool), the per-expert offsets (int32),
      the gathered rows, the gate_up output, the activation output and the product (the experts'
      activation dtype), the unit weights (rows, in the hidden states' dtype);
    * combine: the scatter index (``t x top_k`` int64), the returned outputs and the routing
      weights they are multiplied by.
    """
    e = dt.expert
    i = m.expert_intermediate_size
    tk = t * m.top_k
    local = m.num_experts // ep
    out = 2 * tk * 8 + 2 * rows * 8 + rows + local * 4
    out += rows * e * (h + 2 * i + i + i) + rows * dt.norm_out
    out += tk * h * e + tk * w_bytes
    return out


def expert_state_bytes(model: ModelSpec, job: Job, st: Any) -> dict[str, float]:
    """Whole-model bytes of the routed experts in each state component (``st``: model_states)."""
    n = model.params.experts
    prec = PRECISIONS[job.precision]
    out = dict.fromkeys(("frozen", "trainable", "master", "grads", "opt"), 0.0)
    if not n:
        return out
    if job.method == "full":
        pb = dtype_bytes(prec["trainable"])
        out["trainable"] = float(n * pb)
        out["grads"] = float(n * dtype_bytes(prec["grad"]))
        n_tensors = 2 * sum(g.count for g in model.groups if g.moe is not None)
        if job.optimizer == "adamw":
            out["opt"] = float(2 * pb * n + 4 * n_tensors)
        elif job.optimizer == "sgd":
            out["opt"] = float(pb * n)
        else:  # 8-bit / Adafactor: the experts' share of the states, by parameter count
            out["opt"] = st.optimizer_states * n / max(1, st.params_trainable)
        if prec["compute"] != prec["trainable"]:
            out["master"] = float(n * dtype_bytes(prec["compute"]))
    elif job.method == "lora":
        out["frozen"] = float(n * dtype_bytes(prec["frozen"]))
    else:  # qlora: fused 3-D experts are not quantized; prepare_model_for_kbit_training upcasts them
        out["frozen"] = float(n * 4)
    return out


def ep_rank_states(model: ModelSpec, job: Job, layout: Layout, st: Any, frozen: float, trainable: float,
                   master: float, grads: float, opt: float, *,
                   master_outside_only: bool = False) -> tuple[float, float, float, float, float]:
    """Per-rank state bytes with EP, from the per-rank bytes the layout gives without it
    (``master_outside_only``: the memory model holds only the lm_head's compute copy)."""
    ep, dp, tp, pp = layout.ep, layout.dp, layout.tp, layout.pp
    mp = tp * pp
    x = expert_state_bytes(model, job, st)
    if master_outside_only:
        x["master"] = 0.0  # only the lm_head copy is held: no expert share
    shard = {
        "frozen": layout.shards_params,
        "trainable": layout.shards_params,
        "master": layout.shards_params or (layout.shards_optimizer and bool(st.master_weights)),
        "grads": layout.shards_grads,
        "opt": layout.shards_optimizer,
    }
    cur = {"frozen": frozen, "trainable": trainable, "master": master, "grads": grads, "opt": opt}
    edp = dp * tp // ep
    for k, v in x.items():
        if not v:
            continue
        before = v / (mp * (dp if shard[k] else 1))
        after = v / (pp * ep * (edp if shard[k] else 1))
        cur[k] = max(0.0, cur[k] - before + after)
    return cur["frozen"], cur["trainable"], cur["master"], cur["grads"], cur["opt"]


def _hidden_bytes(job: Job) -> int:
    prec = PRECISIONS[job.precision]
    if job.method == "full":
        return int(dtype_bytes(prec["trainable"]))
    return 4 if job.method == "qlora" else int(dtype_bytes(prec["frozen"]))


def ep_dispatch_transient_bytes(model: ModelSpec, job: Job, layout: Layout) -> int:
    """One all-to-all's send and receive buffers on the busiest rank: ``t x top_k`` rows out,
    the received rows in (hidden size, the hidden states' dtype)."""
    t = job.micro_batch * job.seq_len
    best = 0
    for g in model.groups:
        if g.moe is not None:
            rows = ep_rows_per_rank(t, g.moe)
            best = max(best, (t * g.moe.top_k + rows) * model.hidden_size * _hidden_bytes(job))
    return best


# ---------------------------------------------------------------------------------------------
# communication
# ---------------------------------------------------------------------------------------------
def all_to_all_time(nbytes: float, n: int, bw_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """All-to-all of ``nbytes`` per rank over ``n`` ranks: ``(n - 1) / n`` of the buffer leaves
    the rank (pairwise exchange), plus ``n - 1`` latencies."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / bw_bytes_per_s + (n - 1) * latency_s


def ep_comm_time_s(model: ModelSpec, job: Job, layout: Layout, bw_bytes_per_s: float,
                   latency_s: float = 0.0) -> float:
    """All-to-all seconds of one optimizer step on the busiest rank (``grad_accum`` micro-batches):
    per MoE layer 2 all-to-alls forward (dispatch, combine), 2 backward, 2 more when the layer is
    recomputed under checkpointing; each moves the busiest rank's routed rows of the hidden size
    in the compute dtype (what the experts' autocast runs in)."""
    ep = layout.ep
    if ep <= 1:
        return 0.0
    c = float(dtype_bytes(_compute_dtype(job)))
    per_fwd = moe_constants().a2a_per_moe_layer_forward
    passes = 2 + (1 if job.gradient_checkpointing else 0)
    t = job.micro_batch * job.seq_len
    total = 0.0
    for g in model.groups:
        if g.moe is None:
            continue
        rows = ep_rows_per_rank(t, g.moe)
        total += g.count * passes * per_fwd * all_to_all_time(rows * model.hidden_size * c, ep, bw_bytes_per_s,
                                                               latency_s)
    return job.grad_accum * total


def _compute_dtype(job: Job) -> str:
    return job.quant.compute_dtype if job.method == "qlora" else PRECISIONS[job.precision]["compute"]


def ep_degrees(model: ModelSpec, dp: int, gpus_per_node: int) -> list[int]:
    """EP degrees worth searching: powers of two > 1 dividing every MoE layer's experts and the
    data-parallel degree, within one node (all-to-all stays on NVLink)."""
    if not model.is_moe:
        return []
    experts = {g.moe.num_experts for g in model.groups if g.moe is not None}
    out = []
    k = 2
    while k <= min(dp, gpus_per_node):
        if dp % k == 0 and all(e % k == 0 for e in experts):
            out.append(k)
        k *= 2
    return out


def ep_runtime(rt: Any, model: ModelSpec, job: Job, layout: Layout, gpu: Any, *, offer: Any | None = None,
               eff: Any | None = None) -> Any:
    """``rt`` (``estimate_runtime`` of the same job and layout, which does not know EP) with
    expert parallelism: the data-parallel traffic of the routed experts moves from the
    ``dp`` group to the ``dp x tp / ep`` ranks that hold the same experts, with ``1 / ep`` of the
    bytes; the all-to-alls (``ep_comm_time_s``, on the critical path, over NVLink within a node)
    are added; an unsharded optimizer updates only the rank's experts. A stop-gap until the
    runtime model takes the term itself (runtime.py is being rewritten into named terms)."""
    import dataclasses

    from .catalog.efficiency import efficiency

    ep = layout.ep
    if ep <= 1:
        return rt
    eff = eff or efficiency()
    n_exp = model.params.experts
    if not n_exp:
        return rt
    prec = PRECISIONS[job.precision]
    c = float(dtype_bytes(_compute_dtype(job)))
    mp = layout.tp * layout.pp
    dp, m = layout.dp, job.grad_accum
    edp = dp * layout.tp // ep
    if job.method == "full":
        gather = n_exp * c
        grads = n_exp * float(dtype_bytes(prec["grad"]))
        upd = n_exp * c
    else:
        gather = n_exp * (4.0 if job.method == "qlora" else float(dtype_bytes(prec["frozen"])))
        grads = upd = 0.0
    bw_dp, lat_dp, bw_intra = _links(gpu, layout, offer, eff)
    bucket = eff.bucket_bytes
    all_gather_time = reduce_scatter_time = _ring_half
    all_reduce_time = _ring_full

    def dp_comm(g: float, gr: float, up: float, n: int) -> float:
        s = layout.strategy
        if n <= 1:
            return 0.0
        if s == "ddp":
            return all_reduce_time(gr, n, bw_dp, lat_dp, bucket)
        if s == "zero1":
            return reduce_scatter_time(gr, n, bw_dp, lat_dp, bucket) + all_gather_time(up, n, bw_dp, lat_dp, bucket)
        if s == "zero2":
            return m * reduce_scatter_time(gr, n, bw_dp, lat_dp, bucket) + all_gather_time(up, n, bw_dp, lat_dp, bucket)
        if s in ("zero3", "fsdp"):
            return m * (2 * all_gather_time(g, n, bw_dp, lat_dp, bucket) + reduce_scatter_time(gr, n, bw_dp, lat_dp, bucket))
        return 0.0

    old = dp_comm(gather / mp, grads / mp, upd / mp, dp)
    new = dp_comm(gather / (layout.pp * ep), grads / (layout.pp * ep), upd / (layout.pp * ep), edp)
    b = dict(rt.breakdown)
    compute = rt.compute_time_s
    dp_total = max(0.0, b.get("dp_comm_s", 0.0) - old + new)
    overlap = eff.overlap.get(layout.strategy, 0.0)
    dp_exposed = max(dp_total * (1.0 - overlap), dp_total - compute) if dp_total else 0.0
    a2a_bw = bw_intra if ep <= layout.gpus_per_node else bw_dp
    a2a_lat = eff.latency_intra_s if ep <= layout.gpus_per_node else lat_dp
    a2a = ep_comm_time_s(model, job, layout, a2a_bw, a2a_lat)
    opt_time = rt.optimizer_time_s
    if not layout.shards_optimizer and job.method == "full":
        f = n_exp / model.params.total
        opt_time *= (1.0 - f) + f / ep
    step = (rt.step_time_s - b.get("dp_comm_exposed_s", 0.0) + dp_exposed + a2a
            - rt.optimizer_time_s + opt_time)
    tps = rt.tokens_per_step / step
    world = layout.world_size
    peak = b.get("peak_tflops", 0.0) * 1e12
    hours = None if rt.steps is None else rt.steps * step / 3600.0
    b.update(dp_comm_s=dp_total, dp_comm_exposed_s=dp_exposed, ep_all_to_all_s=a2a, optimizer_s=opt_time)
    return dataclasses.replace(
        rt, step_time_s=step, comm_time_s=rt.comm_time_s - rt.breakdown.get("dp_comm_s", 0.0) + dp_total + a2a,
        exposed_comm_s=rt.exposed_comm_s - rt.breakdown.get("dp_comm_exposed_s", 0.0) + dp_exposed + a2a,
        optimizer_time_s=opt_time, tokens_per_s=tps,
        mfu=rt.flops_per_token * tps / (world * peak) if peak else rt.mfu, hours=hours, breakdown=b)


# the alpha-beta collectives and links of ftplan.runtime (same formulas; kept here until the
# runtime model takes the EP term itself, so that this module imports neither runtime nor memory)
def _ring_full(nbytes: float, n: int, bw: float, latency: float = 0.0, bucket: float | None = None) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    buckets = math.ceil(nbytes / bucket) if bucket else 1
    return 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * latency * buckets


def _ring_half(nbytes: float, n: int, bw: float, latency: float = 0.0, bucket: float | None = None) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    buckets = math.ceil(nbytes / bucket) if bucket else 1
    return (n - 1) / n * nbytes / bw + (n - 1) * latency * buckets


def _links(gpu: Any, layout: Layout, offer: Any | None, eff: Any) -> tuple[float, float, float]:
    bw_for = getattr(gpu, "intra_node_bw_for", None)
    gbs = bw_for(layout.gpus_per_node) if callable(bw_for) else getattr(gpu, "intra_node_bw_gbps", 0)
    intra = float(gbs or 0) * 1e9 * eff.bus_efficiency
    if intra <= 0:
        intra = 1e9
    if layout.nodes <= 1:
        return intra, eff.latency_intra_s, intra
    gbps = getattr(offer, "inter_node_gbps", None) if offer is not None else None
    per_gpu = float(gbps or 0) / 8.0 * 1e9 / layout.gpus_per_node * eff.bus_efficiency
    return (min(intra, per_gpu) if per_gpu > 0 else intra), eff.latency_inter_s, intra
