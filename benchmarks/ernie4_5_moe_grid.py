"""ERNIE 4.5 MoE (``ernie4_5_moe``) against real PyTorch on CPU, by hand: the whole grid.

    PYTHONPATH=src python benchmarks/ernie4_5_moe_grid.py [--no-ep] [--no-engines]

CI (tests/test_ernie4_5_moe.py and the generic tests parametrized over ``TINY_CONFIGS``) keeps the
model states, the saved-activation grid (full / LoRA, autocast and pure bf16, checkpointing on/off,
b = 1/2), torchtitan's SAC and PEFT's targets. This script adds what costs too much for CI: eager
attention, every checkpointing variant with LoRA and full, QLoRA under both recipes with and without
checkpointing, a variant config (MoE on every other layer, no shared expert, untied), and the
expert-parallel run (2 gloo ranks, FSDP + EP 2: the per-rank parameter / gradient / optimizer bytes
and each MoE block's saved bytes given the rows the rank received) and the engines (2 gloo ranks:
FSDP2 full / LoRA / QLoRA, ZeRO-1/2/3 full, ZeRO-3 LoRA, through tests/test_distributed_memory.py's
checks). Prints one line a case (ftplan minus measured, bytes; 0 is exact); exits 1 if any case
differs. ``--no-ep`` / ``--no-engines`` leave the gloo runs out.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

FAM = "ernie4_5_moe"


def main() -> int:
    warnings.simplefilter("ignore")
    import test_checkpointing_vs_torch as C
    from test_memory_vs_torch import _run, _run_qlora

    import ftplan.measure.torchref as TR
    from ftplan.memory import _autocast_weight_elems, activation_parts, model_states, saved_activation_bytes

    bad = 0

    def report(name: str, *diffs: int) -> None:
        nonlocal bad
        ok = all(d == 0 for d in diffs)
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: {diffs}", flush=True)

    variant = {**TR.TINY_CONFIGS[FAM], "num_hidden_layers": 4, "moe_layer_interval": 2, "moe_num_shared_experts": 0,
               "tie_word_embeddings": False}
    for label, cfg in (("tiny", None), ("every-other-layer", variant)):
        for method in ("full", "lora"):
            spec, job, r, casts = _run(FAM, method, False, 2, 24, cfg=cfg)
            st = model_states(spec, job)
            report(f"{label} states {method}", st.trainable_weights - r.trainable_param_bytes,
                   st.gradients - r.grad_bytes, st.optimizer_states - r.optimizer_state_bytes,
                   st.frozen_weights - r.frozen_param_bytes, st.n_trainable_tensors - r.n_trainable_tensors,
                   (2 * _autocast_weight_elems(spec, backend="cpu") if method == "full" else st.master_weights)
                   - casts)
            for attn in ("sdpa", "eager"):
                for ck in (False, True):
                    for b, s in ((2, 24), (1, 40)):
                        spec, job, r, casts = _run(FAM, method, ck, b, s, attn=attn, cfg=cfg)
                        report(f"{label} saved {method} {attn} ckpt={ck} b={b} s={s}",
                               saved_activation_bytes(spec, job, backend="cpu") - (r.saved_activation_bytes - casts))
        for ck in (False, True):
            spec, job, r, casts = _run(FAM, "full", ck, 2, 24, precision="bf16", cfg=cfg)
            report(f"{label} saved pure bf16 ckpt={ck}",
                   saved_activation_bytes(spec, job, backend="cpu") - (r.saved_activation_bytes - casts))
    for method in ("full", "lora"):
        for mode in ("selective", "selective-attention", "full-reentrant", "every-k"):
            spec, r = C._measure(FAM, method, mode)
            job = C._job(FAM, method, mode, 2, 24, "hf")
            p = activation_parts(spec, job, backend="cpu")
            report(f"checkpointing {method} {mode}",
                   saved_activation_bytes(spec, job, backend="cpu") - (r.device_bytes - r.weight_copy_bytes),
                   p.sac_cache_bytes - r.sac_cache_bytes, p.checkpointed_layers - r.n_checkpointed)
    for recipe in ("peft", "trl"):
        for ck in (False, True):
            spec, job, r = _run_qlora(FAM, ck, recipe, dropout=0.0)
            st = model_states(spec, job)
            # PEFT's fp32 adapters: their autocast copies are ftplan's master weights; TRL's bf16
            # ones make none (the router's delta weight upcasts them: activations, as ftplan counts)
            casts = sum(x.nbytes for x in r.records if x.param_copy) if recipe == "peft" else 0
            report(f"qlora {recipe} ckpt={ck}", st.frozen_weights - r.frozen_param_bytes,
                   st.trainable_weights - r.trainable_param_bytes, st.gradients - r.grad_bytes,
                   st.optimizer_states - r.optimizer_state_bytes,
                   saved_activation_bytes(spec, job, backend="cpu") - (r.saved_activation_bytes - casts))
    if "--no-ep" not in sys.argv:
        bad += _expert_parallel()
    if "--no-engines" not in sys.argv:
        bad += _engines()
    print("all exact" if not bad else f"{bad} case(s) differ")
    return 1 if bad else 0


def _expert_parallel() -> int:
    """As tests/test_expert_parallel.py::test_ep_memory_matches_the_gloo_run, for ernie4_5_moe."""
    import ftplan.measure.torchref as TR
    from ftplan.job import Job, Layout
    from ftplan.measure.ep_run import run_ep
    from ftplan.memory import estimate_memory, moe_block_saved_bytes
    from ftplan.model import model_from_config

    ranks = run_ep([FAM], world=2, ep=2, batch=2, seq=32)[FAM]
    if isinstance(ranks, str):
        print("BAD ep run:", ranks)
        return 1
    cfg = TR.TINY_CONFIGS[FAM]
    model = model_from_config(cfg)
    job = Job(method="full", precision="bf16", micro_batch=2, seq_len=32)
    mem = estimate_memory(model, job, Layout(2, 1, "fsdp", ep=2))
    moe = next(g.moe for g in model.groups if g.moe is not None)
    n_tensors = sum(1 for _ in TR.build_model(cfg, device="meta").parameters())
    bad = 0
    for i, r in enumerate(ranks):
        frozen = r.param_bytes - mem.components["trainable_weights"]  # the frozen bias: on rank 0 (dim 0 is 1)
        diffs = (r.local_experts - moe.num_experts // 2, frozen - (4 * moe.num_experts if i == 0 else 0),
                 r.grad_bytes - mem.components["gradients"], r.expert_param_bytes - model.params.experts,
                 int(not 0 <= r.optimizer_bytes - mem.components["optimizer_states"] <= 4 * n_tensors),
                 *(moe_block_saved_bytes(model, job, ep=2, ep_rows=rows, backend="cpu") - saved
                   for rows, saved in zip(r.rows, r.moe_saved)))
        ok = all(d == 0 for d in diffs)
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} expert parallel rank {i} (rows {r.rows}): {diffs}", flush=True)
    return bad


def _engines() -> int:
    """2-rank gloo runs of tests/test_distributed_memory.py's harness (``by_hand.run_engines``):
    FSDP2 full / LoRA / QLoRA, DeepSpeed ZeRO-1/2/3 full and ZeRO-3 LoRA."""
    from by_hand import run_engines

    from ftplan.measure.distributed import Case

    cases = [Case(family=FAM, engine="fsdp2"), Case(family=FAM, engine="fsdp2", method="lora"),
             Case(family=FAM, engine="fsdp2", method="qlora"), Case(family=FAM, engine="deepspeed", zero_stage=1),
             Case(family=FAM, engine="deepspeed", zero_stage=2),
             Case(family=FAM, engine="deepspeed", zero_stage=3, steps=2),
             Case(family=FAM, engine="deepspeed", zero_stage=3, method="lora", steps=2)]
    return run_engines(cases, ok="ok ", bad="BAD")


if __name__ == "__main__":
    sys.exit(main())
