"""FLOPs terms of the activation side: what checkpointing recomputes and what the loss path adds.

Small pure functions the runtime model calls (``runtime.flops_per_token``), kept apart from it so
the memory-side choices (``Job.checkpointing``, ``Job.loss``) have one owner:

* :func:`recompute_flops_per_token`: the forward FLOPs the backward re-executes under the job's
  checkpointing variant: every checkpointed layer's matmuls and attention (``full``), minus the
  attention kernel (``selective-attention``: its outputs are cached), minus the attention kernel
  and the cached (odd-numbered) ``mm`` outputs (``selective``, torchtitan's op policy; biased
  projections run ``addmm`` and routed experts ``grouped_mm``, both recomputed), only the layers
  ``every-k`` checkpoints.
* :func:`loss_extra_flops_per_token`: TRL's fused LM head recomputes each logits tile in backward
  (one more ``2 V h`` per scored token); Liger computes the logits gradient inside the forward and
  transformers' loss keeps the logits: nothing extra.

Padding-free / packed rows change no linear FLOPs per real token; attention then spans each
document instead of the row, which ftplan does not know, so the runtime keeps ``seq_len`` as the
span (an upper bound; equal for rows of one sequence).
"""

from __future__ import annotations

from .job import Job, lora_targets, lora_wraps_experts
from .model import LayerGroup, ModelSpec

__all__ = ["recompute_flops_per_token", "loss_extra_flops_per_token"]


def _layer_mm_flops(g: LayerGroup, model: ModelSpec, job: Job) -> tuple[float, float]:
    """(all matmul FLOPs per token of one layer, FLOPs of the mm outputs torchtitan's policy
    caches: the 1st, 3rd, ... ``aten.mm`` of the layer)."""
    from .memory import layer_linears

    h = model.hidden_size
    r = job.lora.r
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    mms: list[float] = []  # FLOPs of each aten.mm in order
    other = 0.0  # addmm (biased) and grouped_mm experts: never cached
    lins = {lin.module: lin for lin in layer_linears(model, g)}
    a = g.attention
    if g.short_conv is not None:  # LFM2's short convolution: its two projections (the conv is no mm)
        order = ["in_proj", "out_proj"]
    elif a is None:  # Gated DeltaNet: the projections (its delta rule's matmuls are bmm, never cached)
        order = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba", "out_proj"]
    else:
        order = (["q_a_proj", "q_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"] if a.is_mla
                 else ["qkv_proj", "q_proj", "k_proj", "v_proj"]) + [a.o_name]
    mlp = g.mlp
    if g.moe is not None and g.mlp is None:  # (gemma4 keeps a dense MLP beside its experts)
        mlp = g.moe.shared
    mlp_names = ["gate_up_proj", *(mlp.names if mlp is not None else ("gate_proj", "up_proj", "down_proj"))]

    def proj(name: str) -> None:
        nonlocal other
        lin = lins.get(name)
        if lin is None:
            return
        f = 2.0 * lin.in_features * lin.out_features
        if lin.bias:
            other += f
        else:
            mms.append(f)
        if name in targets:
            mms.extend((2.0 * lin.in_features * r, 2.0 * r * lin.out_features))

    for name in order:
        proj(name)
    if g.moe is not None:
        m = g.moe
        if m.shared_gate and m.shared is not None:
            # qwen2_moe's block (qwen3_5_moe, qwen3_next): the shared expert runs before the router
            for name in mlp_names:
                proj(name)
        mms.append(2.0 * h * m.num_experts)  # router
        other += m.computed_experts * 3 * 2.0 * h * m.expert_intermediate_size  # routed experts (llama4: bmm on every expert)
        if job.uses_lora and lora_wraps_experts(model, job.lora):
            other += m.top_k * 2.0 * r * (3 * h + 3 * m.expert_intermediate_size)
        if m.shared_gate:  # then its sigmoid gate
            proj("shared_expert_gate")
            mlp = None
    if mlp is not None:
        for name in mlp_names:
            proj(name)
    total = sum(mms) + other
    cached = sum(f for i, f in enumerate(mms) if i % 2 == 0)
    return total, cached


def recompute_flops_per_token(model: ModelSpec, job: Job, attention_flops_per_token: float) -> float:
    """Forward FLOPs per token re-executed in backward under ``job.ac_mode``.

    ``attention_flops_per_token``: the attention-score and attention-value FLOPs of the whole model
    as the runtime counts them (spread over the layers in proportion to their count)."""
    mode = job.ac_mode
    if mode == "none":
        return 0.0
    from .memory import checkpointed_layer_counts

    counts = checkpointed_layer_counts(model, job)
    attn_per_layer = attention_flops_per_token / max(1, model.num_layers)
    out = 0.0
    for g, n in zip(model.groups, counts):
        if not n:
            continue
        mm, cached = _layer_mm_flops(g, model, job)
        if mode == "selective":  # the attention kernel is cached too (not with eager: no single op)
            per = mm - cached + (attn_per_layer if job.attn_impl == "eager" else 0.0)
        elif mode == "selective-attention" and job.attn_impl != "eager":
            per = mm
        else:
            per = mm + attn_per_layer
        out += n * per
    return out


def loss_extra_flops_per_token(model: ModelSpec, job: Job) -> float:
    """FLOPs per token the loss path adds to forward + backward: TRL's fused head recomputes the
    logits tile by tile in backward (``2 V h``)."""
    if job.loss == "trl":
        return 2.0 * model.vocab_size * model.hidden_size
    return 0.0
