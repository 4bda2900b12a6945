"""DeepSpeed ZeRO-3 when the gathered parameters exceed ``stage3_max_live_parameters``: the per-rank
transient against real 2-rank gloo runs (``ftplan.measure.distributed``), with the limits lowered
under the tiny models' size, the regime every real model (7B and up) is in under ftplan's 1e9.

What DeepSpeed 0.19 does there (``runtime/zero/partitioned_param_coordinator.py``, traced on the
ranks; ``sharding._ds_capped_gather_elems``): ``fetch_sub_module`` gathers the running module's own
parameters whatever the limit (a leaf MoE block whole, a fused-experts module, a 128k-vocabulary
lm_head); the limit stops only the prefetch, past its last parameter; and the gathered experts
whose views autograd saved (transformers 5's fused experts) outlive DeepSpeed's release until each
layer's backward. The formula is an upper bound: it counts max_live, the largest module fetch and
every view-held expert tensor at once; the measured peak is above ``predicted - (max_live + largest
fetch)`` on every case (SLACK below). The by-hand sweep over llama / qwen2 / mixtral, full and
LoRA, at 20k / 50k / 100k elements: ``benchmarks/notes/zero3_live_limit.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ftplan.catalog.constants import memory_constants  # noqa: E402
from ftplan.measure import torchref as TR  # noqa: E402
from ftplan.measure.distributed import Case, run_cases  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402
from ftplan.sharding import _ds_largest_fetch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_distributed_memory import BOUNDS, DS_LIVE_CASES, TWO_RANK_RESULTS, _predict  # noqa: E402

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"),
              pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft is not installed")]

#: mixtral LoRA (test_distributed_memory.DS_LIVE_CASES): its MoE block is one of DeepSpeed's default
#: leaf modules (gathered whole, 117,504 elements against a 20,000 limit) and PEFT's expert adapters
#: of both layers stay alive through the views torch.baddbmm saved; measured 448,516 B per rank
#: where the former min(gathered, max_live) formula gave 170,252 B
CASES = DS_LIVE_CASES


def slack(case: Case) -> int:
    """How far above the measured peak the upper bound may be (bytes): max_live + the largest
    module fetch, in bf16 (the formula counts both next to the view-held experts and the group)."""
    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    return 2 * (case.max_live + _ds_largest_fetch(spec, case.job(), memory_constants()))


def check(case: Case, ranks) -> list[str]:
    bad = []
    p = float(_predict(case, 2)["transient"])
    for m in ranks:
        over = p - m.engine_transient_peak
        if not -BOUNDS["ds_scalars"] <= over <= slack(case):
            bad.append(f"{case.label} rank {m.rank}: transient measured {m.engine_transient_peak}, "
                       f"predicted {p:.0f} (upper bound, slack {slack(case)})")
    return bad


def test_zero3_transient_above_max_live():
    # run with test_distributed_memory's 2-rank process group when it ran in this session (one
    # spawn for all: the imports dominate); else on its own (about 20 s on 2 cores)
    if all(c in TWO_RANK_RESULTS for c in CASES):
        results = [TWO_RANK_RESULTS[c] for c in CASES]
    else:
        results = run_cases(CASES, 2, timeout_s=600)
    bad = []
    for case, res in zip(CASES, results):
        assert not isinstance(res, str), res
        bad += check(case, res)
    assert not bad, "\n".join(bad)


def test_capped_formula_terms():
    """The capped gather on the tiny models: mixtral's leaf block and view-held experts."""
    from ftplan.job import Job, Layout, LoraSpec
    from ftplan.sharding import _ds_capped_gather_elems, _ds_gatherable_elems, _ds_view_held_elems

    consts = memory_constants()
    spec = model_from_config(TR.TINY_CONFIGS["mixtral"])
    lora = Job(method="lora", lora=LoraSpec(r=8, alpha=16, dropout=0.0), gradient_checkpointing=False)
    full = Job(method="full", gradient_checkpointing=False)
    assert _ds_largest_fetch(spec, lora, consts) == 117_504  # gate_up, down, 4 expert adapters
    assert _ds_largest_fetch(spec, full, consts) == 92_160
    assert _ds_view_held_elems(spec, lora, consts) == 2 * 25_344  # the expert adapters of both layers
    assert _ds_view_held_elems(spec, full, consts) == 2 * 92_160  # both layers' expert weights
    layout = Layout(2, 1, "zero3", ds_max_live_parameters=20_000, ds_max_reuse_distance=20_000)
    assert _ds_capped_gather_elems(spec, lora, consts, layout) == 20_000 + 117_504 + 50_688
    # a reuse distance left at 1e9 keeps every parameter the trace uses again: all of them
    gatherable = _ds_capped_gather_elems(spec, lora, consts, Layout(2, 1, "zero3", ds_max_live_parameters=20_000))
    assert gatherable == _ds_gatherable_elems(spec, lora, consts) + 50_688
    # a checkpointed layer saves no view of its experts (every layer; every-k: layers 0, k, ...)
    assert _ds_view_held_elems(spec, full.with_(gradient_checkpointing=True), consts) == 0
    assert _ds_view_held_elems(spec, full.with_(gradient_checkpointing=True, checkpointing="every-k",
                                                checkpoint_every=2), consts) == 92_160
    llama = model_from_config(TR.TINY_CONFIGS["llama"])
    assert _ds_view_held_elems(llama, full, consts) == 0
    assert _ds_largest_fetch(llama, full, consts) == 32_768  # the lm_head


def test_limits_are_layout_options_and_exported():
    """The three ZeRO-3 limits are layout options: validated (ZeRO-3 only), written as given by the
    DeepSpeed export, and what the formula uses."""
    from ftplan.errors import ConfigError
    from ftplan.export.deepspeed import deepspeed_config
    from ftplan.job import Job, Layout, validate_job
    from ftplan.memory import model_states
    from ftplan.sharding import layout_memory

    spec = model_from_config(TR.TINY_CONFIGS["llama"])
    job = Job(method="full", gradient_checkpointing=False)
    lay = Layout(2, 1, "zero3", ds_max_live_parameters=20_000, ds_max_reuse_distance=30_000,
                 ds_prefetch_bucket_size=5_000)
    zo = deepspeed_config(lay, job)["zero_optimization"]
    assert (zo["stage3_max_live_parameters"], zo["stage3_max_reuse_distance"],
            zo["stage3_prefetch_bucket_size"]) == (20_000, 30_000, 5_000)
    zo = deepspeed_config(Layout(2, 1, "zero3"), job)["zero_optimization"]
    assert (zo["stage3_max_live_parameters"], zo["stage3_prefetch_bucket_size"]) == (1_000_000_000, "auto")
    with pytest.raises(ConfigError) as e:
        validate_job(spec, job, Layout(2, 1, "zero2", ds_max_live_parameters=20_000))
    assert "ds_max_live_parameters" in str(e.value.problems)
    consts, st = memory_constants(), model_states(spec, job)
    # the tiny llama (136,192 gathered elements) whole under ftplan's 1e9; above a 20,000 limit:
    # the larger of the limit and the reuse distance (what the trace may keep) + the lm_head's own
    # fetch, then 2 x the largest gradient (bf16)
    assert layout_memory(spec, job, Layout(2, 1, "zero3"), st, consts, "cpu").transient == 2 * 136_192 + 4 * 32_768
    assert layout_memory(spec, job, lay, st, consts, "cpu").transient == 2 * (30_000 + 32_768) + 4 * 32_768
