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

LoRA (measured on gloo: ``tests/test_ep_lora.py``, ``benchmarks/ep_lora_cpu.py``): the EP engine
is transformers' load-time sharding, and PEFT wraps the model after it. On the experts that does
not run (``job.validate_job`` refuses it): PEFT's ParamWrapper makes plain-tensor adapters for
every expert next to the DTensor expert shards, and its merge fails in the first forward ("mixed
torch.Tensor and DTensor"); QLoRA fails in PEFT's bitsandbytes dispatch on FSDP2's DTensors. On the
attention the adapters stay plain fp32 tensors outside FSDP and EP, replicated on every rank (HF
Trainer broadcasts them and averages their gradients): ``ep_rank_states`` gives each rank the whole
adapter states and autocast's copies, and the activations are those of one GPU under HF Trainer's
autocast (``memory.estimate_memory``), the frozen experts keeping neither their gathered rows nor
down's input (``ep_experts_saved``).
"""

from __future__ import annotations

import math
from typing import Any

from .catalog.hostdata import moe_constants
from .job import PRECISIONS, Job, Layout
from .model import ModelSpec, MoeSpec
from .units import dtype_bytes

__all__ = [
    "all_to_all_time",
    "ep_degrees",
    "ep_dispatch_transient_bytes",
    "ep_experts_saved",
    "ep_rank_states",
    "ep_rows_per_rank",
    "expert_state_bytes",
]


def ep_rows_per_rank(tokens: int, moe: MoeSpec, load_factor: float | None = None) -> int:
    """(token, expert) rows the busiest rank's experts receive per micro-batch."""
    f = moe_constants().worst_rank_load_factor if load_factor is None else load_factor
    return math.ceil(tokens * moe.top_k * f)


def ep_experts_saved(m: MoeSpec, t: int, rows: int, h: int, dt: Any, ep: int, w_bytes: int,
                     train: bool | None = None) -> int:
    """Bytes the expert-parallel experts path of one MoE layer saves for backward on a rank that
    routes ``t`` tokens and receives ``rows`` (token, expert) rows (transformers ``AllToAllEP``
    around the ``grouped_mm`` experts):

    * dispatch: the gather index of the sent rows (``t x top_k`` int64);
    * experts on the received rows (top-1, unit weights): the sort and inverse-sort indices
      (2 x rows int64), the off-rank sentinel mask (rows bool), the per-expert offsets (int32),
      the gate_up output and the activation output (the experts' activation dtype), the unit
      weights (rows, in the hidden states' dtype); with trainable experts (``train``, default
      ``dt.full``) also the gathered rows and the product (down's input): a grouped_mm saves its
      input only for its weight gradient, so frozen experts (LoRA on the attention only) keep
      neither (held byte-exact against a gloo run, ``tests/test_ep_lora.py``);
    * combine: the scatter index (``t x top_k`` int64), the returned outputs and the routing
      weights they are multiplied by.

    gpt_oss (biased experts, clamped SwiGLU, ``MoeSpec.router == "gpt_oss"``): the gate_up output,
    the clamped gate, its sigmoid, up + 1 and the product are saved, the gathered rows and down's
    input only with trainable experts, and with trainable biases the sorted expert ids their
    gathers keep (rows int64); its routing weights are the router's softmax output itself, already
    counted with the router.
    """
    e = dt.expert
    i = m.expert_intermediate_size
    tk = t * m.top_k
    train = dt.full if train is None else train
    local = m.num_experts // ep
    out = 2 * tk * 8 + 2 * rows * 8 + rows + local * 4
    if m.router == "gpt_oss":
        out += rows * e * (2 * i + 4 * i + ((h + i) if train else 0)) + rows * dt.norm_out
        out += (rows * 8 if train else 0) + tk * h * e
        return out
    out += rows * e * (2 * i + i + ((h + i) if train else 0)) + rows * dt.norm_out
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
        n_tensors = sum((4 if g.moe.bias else 2) * g.count for g in model.groups if g.moe is not None)
        if job.optimizer == "adamw":
            out["opt"] = float(2 * pb * n + 4 * n_tensors)
        elif job.optimizer == "sgd":
            out["opt"] = float(pb * n)
        else:  # 8-bit / Adafactor: the experts' share of the states, by parameter count
            out["opt"] = st.optimizer_states * n / max(1, st.params_trainable)
        if prec["compute"] != prec["trainable"]:
            out["master"] = float(n * dtype_bytes(prec["compute"]))
    elif job.method == "lora":
        out["frozen"] = float(n * dtype_bytes(job.frozen_dtype))
    else:  # qlora: fused 3-D experts are not quantized; prepare_model_for_kbit_training upcasts them
        out["frozen"] = float(n * dtype_bytes(job.unquantized_dtype))
    return out


def ep_rank_states(model: ModelSpec, job: Job, layout: Layout, st: Any, frozen: float, trainable: float,
                   master: float, grads: float, opt: float, *,
                   master_outside_only: bool = False) -> tuple[float, float, float, float, float]:
    """Per-rank state bytes with EP, from the per-rank bytes the layout's engine gives without it
    (``master_outside_only``: the memory model holds only the lm_head's compute copy).

    The experts' part of each per-rank component is taken in the proportion the experts have of
    the whole-model component (so it follows how the engine stores it: DeepSpeed's bf16 module,
    FSDP's fp32 shards), then re-split: by ``pp x ep`` (and the expert-data-parallel group
    ``dp x tp / ep`` where the component is sharded) instead of ``tp x pp`` (and ``dp``)."""
    ep, tp, pp = layout.ep, layout.tp, layout.pp
    mp = tp * pp
    x = expert_state_bytes(model, job, st)
    if master_outside_only:
        x["master"] = 0.0  # only the lm_head copy is held: no expert share
    whole = {"frozen": st.frozen_weights, "trainable": st.trainable_weights, "master": st.master_weights,
             "grads": st.gradients, "opt": st.optimizer_states}
    shard = {
        "frozen": layout.shards_params,
        "trainable": layout.shards_params,
        "master": layout.shards_params or (layout.shards_optimizer and bool(st.master_weights)),
        "grads": layout.shards_grads,
        "opt": layout.shards_optimizer,
    }
    cur = {"frozen": frozen, "trainable": trainable, "master": master, "grads": grads, "opt": opt}
    if job.uses_lora:
        # transformers shards the base at load time (FSDP2 + EP) and PEFT adds its adapters after:
        # plain tensors FSDP never sees, replicated on every rank (HF Trainer broadcasts them and
        # all-reduces their gradients), fp32, with autocast's compute-dtype copies of them saved as
        # on one GPU (``master_weights``): each rank holds the whole adapter states
        cur.update(trainable=float(st.trainable_weights), master=float(st.master_weights),
                   grads=float(st.gradients), opt=float(st.optimizer_states))
    for k, v in x.items():
        if not v or not whole[k] or not cur[k]:
            continue
        before = float(cur[k]) * min(1.0, v / float(whole[k]))
        # sharded: 1/(mp * d1) -> 1/(pp * ep * d1 * tp / ep), the same; replicated: x tp / ep
        after = before if shard[k] else before * mp / (pp * ep)
        cur[k] = max(0.0, float(cur[k]) - before + after)
    return cur["frozen"], cur["trainable"], cur["master"], cur["grads"], cur["opt"]


def _hidden_bytes(job: Job) -> int:
    prec = PRECISIONS[job.precision]
    if job.method == "full":
        return int(dtype_bytes(prec["trainable"]))
    return int(dtype_bytes(job.unquantized_dtype)) if job.method == "qlora" else int(dtype_bytes(job.frozen_dtype))


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


def ep_degrees(model: ModelSpec, dp: int, gpus_per_node: int) -> list[int]:
    """EP degrees worth searching: powers of two > 1 dividing every MoE layer's experts and the
    data-parallel degree, within one node (all-to-all stays on NVLink)."""
    if not model.is_moe or any(g.moe is not None and (g.moe.dense_dispatch or g.moe.router == "granitemoe")
                               for g in model.groups):
        return []  # (Llama 4, Granite MoE: no expert-parallel plan in transformers)
    experts = {g.moe.num_experts for g in model.groups if g.moe is not None}
    out = []
    k = 2
    while k <= min(dp, gpus_per_node):
        if dp % k == 0 and all(e % k == 0 for e in experts):
            out.append(k)
        k *= 2
    return out


