"""LoRA under MoE expert parallelism, held against transformers' own EP engine on gloo.

The only engine that trains a Hugging Face MoE expert-parallel is transformers' load-time
sharding (``from_pretrained(distributed_config=DistributedConfig(fsdp_size, ep_size))``: EP over
the experts, FSDP2 over the rest); PEFT wraps the model after that load (TRL / Trainer scripts),
:mod:`ftplan.measure.ep_run` does the same on two CPU processes. What it shows (transformers
5.24, peft 0.21.2, torch 2.13):

* LoRA on the experts (``all-linear`` on a fused-experts MoE: PEFT's ParamWrapper on
  ``gate_up_proj`` / ``down_proj``) does not run: the adapters are plain tensors for every
  expert next to the DTensor expert shards, and the first forward fails in the merge
  (``aten.baddbmm.default got mixed torch.Tensor and DTensor``). ftplan refuses the combination.
  QLoRA does not get that far (PEFT's bitsandbytes dispatch on FSDP2's DTensor shards:
  ``'DTensor' object has no attribute 'compress_statistics'``, measured by hand) and is refused too.
* LoRA on the attention runs. The adapters are replicated (fp32, not sharded by FSDP or EP:
  Trainer broadcasts them and averages their gradients), autocast saves its compute-dtype copies
  of them as on one GPU, the frozen experts keep neither the gathered rows nor down's input.
  Model states, autocast's copies and every saved byte of the forward are byte-exact per rank,
  with and without gradient checkpointing (mixtral here; mixtral, qwen3_moe and olmoe by hand:
  ``benchmarks/ep_lora_cpu.py``).
"""

from __future__ import annotations

import pytest

from ftplan.catalog.models import resolve_model
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, validate_job
from ftplan.memory import estimate_memory, moe_block_saved_bytes

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def predicted(family: str, checkpointing: bool, rows: list[int]) -> dict[str, int]:
    """ftplan's per-rank bytes for the gloo run's job (bf16-mixed LoRA r=4 on the attention, 2 x 32
    tokens, transformers' loss, FSDP + ep=2 on two ranks), the MoE blocks at the rows the rank
    received (the plan itself takes the busiest rank's)."""
    import ftplan.measure.torchref as TR
    from ftplan.model import model_from_config

    model = model_from_config(TR.TINY_CONFIGS[family])
    job = Job(method="lora", micro_batch=2, seq_len=32, gradient_checkpointing=checkpointing, loss="hf",
              lora=LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=ATTENTION))
    c = estimate_memory(model, job, Layout(2, 1, "fsdp", ep=2), backend="cpu").components
    saved = c["activations"] + c["logits_and_loss"]
    if not checkpointing:
        n_moe = sum(g.count for g in model.groups if g.moe is not None)
        saved += sum(moe_block_saved_bytes(model, job, ep=2, ep_rows=r, backend="cpu") for r in rows)
        saved -= n_moe * moe_block_saved_bytes(model, job, ep=2, backend="cpu")
    return {"frozen_bytes": c["frozen_weights"], "trainable_bytes": c["trainable_weights"],
            "grad_bytes": c["gradients"], "optimizer_bytes": c["optimizer_states"],
            "weight_copy_bytes": c["master_weights"], "saved_bytes": saved}


def measured(r) -> dict[str, int]:
    return {k: getattr(r, k) for k in ("frozen_bytes", "trainable_bytes", "grad_bytes", "optimizer_bytes",
                                       "weight_copy_bytes", "saved_bytes")}


#: run in the session's one gloo spawn (conftest.ep_gloo_runs) with tests/test_expert_parallel.py's
EP_GLOO_CASES = {
    "lora:experts": {"family": "mixtral", "method": "lora"},  # all-linear: ParamWrapper on the experts
    "lora:attention": {"family": "mixtral", "method": "lora", "lora_targets": list(ATTENTION), "autocast": True},
    "lora:attention+ckpt": {"family": "mixtral", "method": "lora", "lora_targets": list(ATTENTION),
                            "autocast": True, "checkpointing": True},
}


@pytest.mark.torch
def test_lora_under_expert_parallelism_matches_the_gloo_run(ep_gloo_runs):
    pytest.importorskip("peft")
    runs = ep_gloo_runs
    err = runs["lora:experts"]
    assert isinstance(err, str) and "mixed torch.Tensor and DTensor" in err, err
    for label, ckpt in (("lora:attention", False), ("lora:attention+ckpt", True)):
        ranks = runs[label]
        assert not isinstance(ranks, str), ranks
        for r in ranks:
            # (checkpointing: the recompute dispatches the same rows again, logged after the forward's)
            rows = r.rows[: len(r.rows) // (2 if ckpt else 1)]
            assert measured(r) == predicted("mixtral", ckpt, rows), (label, r.rank)
        # the adapters are whole on every rank (replicated), the experts split
        assert ranks[0].trainable_bytes == ranks[1].trainable_bytes > 0
        assert ranks[0].local_experts == 2


def test_lora_on_experts_with_ep_is_refused():
    moe = resolve_model("qwen3-30b-a3b")
    mla = resolve_model("deepseek-v3")
    lay = Layout(8, 1, "fsdp", ep=8)
    for model, names in ((moe, "q_proj,k_proj,v_proj,o_proj"),
                         (mla, "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj")):
        job = Job(method="lora", lora=LoraSpec(dropout=0.0))
        with pytest.raises(ConfigError) as e:
            validate_job(model, job, lay)
        (p,) = e.value.problems
        assert p.field == "lora_targets" and "`lora_targets=all-linear`" in p.message and "`ep=8`" in p.message
        assert p.hint == f"leave the experts frozen with `lora_targets={names}`, or use `ep=1`"
        # either change of the hint runs
        validate_job(model, job.with_(lora=LoraSpec(dropout=0.0, target_modules=tuple(names.split(",")))), lay)
        validate_job(model, job, Layout(8, 1, "fsdp"))
    with pytest.raises(ConfigError, match="QLoRA with expert parallelism") as e:
        validate_job(moe, Job(method="qlora", lora=LoraSpec(dropout=0.0, target_modules=ATTENTION)), lay)
    assert e.value.problems[0].field == "method" and e.value.problems[0].hint == "use `method=lora`, or `ep=1`"


def test_replicated_adapters_per_rank():
    """Under EP each rank holds the whole adapter states (what one GPU holds), whatever the
    data-parallel degree; without EP FSDP shards them."""
    model = resolve_model("mixtral-8x7b")
    job = Job(method="lora", seq_len=4096, gradient_checkpointing=False,
              lora=LoraSpec(dropout=0.0, target_modules=ATTENTION))
    one = estimate_memory(model, job).components
    fsdp = estimate_memory(model, job, Layout(8, 1, "fsdp")).components
    ep = estimate_memory(model, job, Layout(8, 1, "fsdp", ep=8)).components
    for k in ("trainable_weights", "gradients", "optimizer_states", "master_weights"):
        assert ep[k] == one[k], k
    assert fsdp["trainable_weights"] * 8 == pytest.approx(one["trainable_weights"], rel=1e-6)
    # the experts' base is split 8 ways by EP (FSDP already shards it 8 ways: the same bytes)
    assert ep["frozen_weights"] == pytest.approx(fsdp["frozen_weights"], rel=1e-9)
