"""Checks of the families added in session 17 (gemma, qwen2_moe, glm4) held by hand,
out of CI for time.

Usage: ``PYTHONPATH=src python benchmarks/families3_by_hand.py [family ...] [--engines]`` (default: all
three; about 2 minutes on 2 cores, of which ~25 s for qwen2_moe's gloo EP run; ``--engines`` adds the
2-rank gloo FSDP2 / DeepSpeed ZeRO-3 runs, full and LoRA, of tests/test_distributed_memory.py's
harness, several minutes more)

For each family named, runs the cases its test file lists in ``VARIANTS_BY_HAND`` (saved
activations against one real step, byte-exact) and ``QLORA_BY_HAND`` (bitsandbytes QLoRA: model
states and saved activations exact), and for an MoE family the 2-rank gloo expert-parallel run of
tests/test_expert_parallel.py (transformers' EP engine: per-rank states and every MoE block's
saved bytes exact; qwen2_moe's 1-row shared_expert_gate lives on rank 0 alone under FSDP2: the
other rank holds exactly its states less). Prints one line per case; exits 1 when any case fails (all are run).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _ep_check(family: str) -> None:
    import ftplan.measure.torchref as TR
    from ftplan.job import Job, Layout
    from ftplan.measure.ep_run import run_ep
    from ftplan.memory import estimate_memory, moe_block_saved_bytes
    from ftplan.model import model_from_config

    ranks = run_ep([family], world=2, ep=2, batch=2, seq=32)[family]
    assert not isinstance(ranks, str), ranks
    cfg = TR.TINY_CONFIGS[family]
    model = model_from_config(cfg)
    job = Job(method="full", precision="bf16", micro_batch=2, seq_len=32)
    mem = estimate_memory(model, job, Layout(2, 1, "fsdp", ep=2))
    moe = next(g.moe for g in model.groups if g.moe is not None)
    n_tensors = sum(1 for _ in TR.build_model(cfg, device="meta").parameters())
    # FSDP2 shards every parameter on dim 0: qwen2_moe's (1, hidden) shared_expert_gate lives whole on
    # rank 0 and not at all on rank 1, whose states are exactly that tensor's less (bf16 weight and
    # gradient, two bf16 AdamW states); ftplan's per-rank figure is rank 0's, the busiest (as
    # tests/test_distributed_memory.py's BOUNDS["fsdp2_one_row_states"])
    one_row = model.hidden_size * sum(g.count for g in model.groups if g.moe is not None and g.moe.shared_gate)
    for rank, r in enumerate(ranks):
        less = one_row if rank > 0 else 0
        assert r.local_experts == moe.num_experts // 2
        assert r.param_bytes == mem.components["trainable_weights"] - 2 * less, (r.param_bytes, rank)
        assert r.grad_bytes == mem.components["gradients"] - 2 * less, (r.grad_bytes, rank)
        assert 0 <= r.optimizer_bytes + 4 * less - mem.components["optimizer_states"] <= 4 * n_tensors
        assert len(r.moe_saved) == len(r.rows) > 0
        for rows, saved in zip(r.rows, r.moe_saved):
            assert moe_block_saved_bytes(model, job, ep=2, ep_rows=rows, backend="cpu") == saved
    for layer in range(len(ranks[0].rows)):
        assert sum(r.rows[layer] for r in ranks) == sum(r.tokens for r in ranks) * moe.top_k


def _engines(families: list[str]) -> int:
    """2-rank gloo runs of tests/test_distributed_memory.py's harness (its checks: per-rank
    parameters, gradients, optimizer states, buffers, transients, saved activations): FSDP2 full /
    LoRA, DeepSpeed ZeRO-3 full / LoRA, per family. As that test does, a failing case runs once
    more in a fresh process group (gloo's asynchronous frees depend on the ranks' timing)."""
    import test_distributed_memory as D

    from ftplan.measure.distributed import Case, run_cases

    cases = [c for fam in families for c in (
        Case(family=fam, engine="fsdp2"), Case(family=fam, engine="fsdp2", method="lora"),
        Case(family=fam, engine="deepspeed", zero_stage=3, steps=2),
        Case(family=fam, engine="deepspeed", zero_stage=3, method="lora", steps=2))]
    failures = D._failures(cases, 2, run_cases(cases, 2, timeout_s=900))
    if failures:
        retry = [c for c in cases if any(f.startswith((c.label + " rank", c.label + ":")) for f in failures)]
        failures = D._failures(retry, 2, run_cases(retry, 2, timeout_s=900))
    for c in cases:
        mine = [f for f in failures if f.startswith((c.label + " rank", c.label + ":"))]
        print(f"{'FAIL' if mine else 'ok  '} engine {c.label}: {mine}", flush=True)
    return len({f.split(" rank")[0].split(":")[0] for f in failures})


def main(families: list[str]) -> int:
    import warnings

    warnings.simplefilter("ignore")
    from ftplan.model import model_from_config
    import ftplan.measure.torchref as TR

    failed = 0
    for family in families:
        mod = importlib.import_module(f"test_{family}")
        cases = [(f"{family} saved {case}", mod.check_variant, case) for case in getattr(mod, "VARIANTS_BY_HAND", [])]
        cases += [(f"{family} qlora {case}", mod.check_qlora, case) for case in getattr(mod, "QLORA_BY_HAND", [])]
        if model_from_config(TR.TINY_CONFIGS[family]).is_moe:
            cases.append((f"{family} expert parallel (2 gloo ranks)", _ep_check, (family,)))
        for name, fn, args in cases:
            t0 = time.perf_counter()
            try:
                fn(*args)
            except AssertionError as e:
                print(f"FAIL {name}: {str(e).splitlines()[0] if str(e) else 'assertion'}", flush=True)
                failed += 1
                continue
            print(f"ok   {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    if "--engines" in sys.argv:
        failed += _engines(families)
    return 1 if failed else 0


if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit(main(names or ["gemma", "qwen2_moe", "glm4"]))
