"""Checks of the families added in session 16 (olmoe, exaone4, dots1, hunyuan_v1_dense) held by hand,
out of CI for time.

Usage: ``PYTHONPATH=src python benchmarks/families2_by_hand.py [family ...]`` (default: all four;
about 3 minutes on 2 cores, of which ~25 s per MoE family for the gloo run)

For each family named, runs the cases its test file lists in ``VARIANTS_BY_HAND`` (saved
activations against one real step, byte-exact) and ``QLORA_BY_HAND`` (bitsandbytes QLoRA: model
states and saved activations exact), and for an MoE family the 2-rank gloo expert-parallel run of
tests/test_expert_parallel.py (transformers' EP engine: per-rank states and every MoE block's
saved bytes exact). Prints one line per case; exits 1 on the first failure.
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
    for r in ranks:
        assert r.local_experts == moe.num_experts // 2
        assert r.param_bytes == mem.components["trainable_weights"]
        assert r.grad_bytes == mem.components["gradients"]
        assert 0 <= r.optimizer_bytes - mem.components["optimizer_states"] <= 4 * n_tensors
        assert len(r.moe_saved) == len(r.rows) > 0
        for rows, saved in zip(r.rows, r.moe_saved):
            assert moe_block_saved_bytes(model, job, ep=2, ep_rows=rows, backend="cpu") == saved
    for layer in range(len(ranks[0].rows)):
        assert sum(r.rows[layer] for r in ranks) == sum(r.tokens for r in ranks) * moe.top_k


def main(families: list[str]) -> int:
    import warnings

    warnings.simplefilter("ignore")
    from ftplan.model import model_from_config
    import ftplan.measure.torchref as TR

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
                print(f"FAIL {name}: {e}")
                return 1
            print(f"ok   {name} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["olmoe", "exaone4", "dots1", "hunyuan_v1_dense"]))
