"""MoE expert parallelism (``ftplan.expert_parallel``) held against transformers' own EP engine.

Two gloo processes on CPU load tiny real mixtral, qwen3_moe, deepseek_v3, gpt_oss, glm4_moe,
glm4_moe_lite, mistral4 and minimax_m2 models with
``DistributedConfig(fsdp_size=2, ep_size=2)`` (FSDP2 + expert parallelism with all-to-all
token dispatch), route their own tokens, run forward, backward and an AdamW step
(:mod:`ftplan.measure.ep_run`). Per rank: parameter and gradient bytes are exact, optimizer
states within the per-tensor ``step`` scalars, every MoE block's saved activations byte-exact
given the rows the rank received, and the rows add up to every rank's tokens x top_k.
"""

from __future__ import annotations

import math

import pytest

from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.models import resolve_model
from ftplan.errors import ConfigError
from ftplan.expert_parallel import (
    all_to_all_time,
    ep_degrees,
    ep_rows_per_rank,
)
from ftplan.job import Job, Layout, validate_job
from ftplan.memory import estimate_memory
from ftplan.runtime import estimate_runtime

import family_checks as F

FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "glm4_moe", "glm4_moe_lite", "mistral4",
            "minimax_m2")


#: full fine-tuning of every family, in the session's one gloo spawn (conftest.ep_gloo_runs)
EP_GLOO_CASES = {f: {"family": f} for f in FAMILIES}


@pytest.fixture(scope="module")
def ep_runs(ep_gloo_runs):
    return ep_gloo_runs


@pytest.mark.torch
@pytest.mark.parametrize("family", FAMILIES)
def test_ep_memory_matches_the_gloo_run(ep_runs, family):
    import ftplan.measure.torchref as TR
    from ftplan.model import model_from_config

    ranks = ep_runs[family]
    # per rank: local experts, states (exact; optimizer within the 4-byte steps), each MoE block's
    # saved bytes given its rows; every routed row on exactly one rank
    F.check_ep_ranks(family, ranks)
    model = model_from_config(TR.TINY_CONFIGS[family])
    moe = next(g.moe for g in model.groups if g.moe is not None)
    for r in ranks:  # bf16 experts split in two by EP
        assert r.expert_param_bytes == model.params.experts * 2 // 2
    spread = max(max(r.rows) for r in ranks) / (ranks[0].tokens * moe.top_k)
    print(f"{family}: busiest rank received {spread:.2f} x the balanced rows")


def test_validation_of_ep_layouts():
    moe = resolve_model("qwen3-30b-a3b")  # 128 experts
    dense = resolve_model("llama-3.1-8b")
    job = Job()
    validate_job(moe, job, Layout(8, 1, "fsdp", ep=8))
    bad = [
        (dense, Layout(8, 1, "fsdp", ep=2), "mixture-of-experts"),
        (moe, Layout(8, 1, "fsdp", ep=3), "divide the 128 experts"),
        (moe, Layout(4, 1, "fsdp", ep=8), "divide dp x tp"),
        (moe, Layout(8, 1, "zero1", pp=2, ep=2), "pipeline"),
        (moe, Layout(8, 1, "zero3", ep=2, offload_optimizer=True), "offload"),
    ]
    for model, lay, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            validate_job(model, job, lay)
    assert ep_degrees(moe, 8, 8) == [2, 4, 8]
    assert ep_degrees(resolve_model("mixtral-8x7b"), 16, 8) == [2, 4, 8]
    assert ep_degrees(dense, 8, 8) == []


def test_ep_memory_properties():
    model = resolve_model("deepseek-v3")
    job = Job(method="full", seq_len=4096, gradient_checkpointing=True)
    f = estimate_memory(model, job, Layout(8, 1, "fsdp"))
    fe = estimate_memory(model, job, Layout(8, 1, "fsdp", ep=8))
    # FSDP + EP: the same state bytes per rank, a smaller gathered layer
    # (FSDP2 without EP walks its step moment by moment: its gradients component is the shards made
    # by the peak's moment, gradients_total_bytes all of them)
    def whole(m, k):
        return m.gradients_total_bytes if k == "gradients" and m.gradients_total_bytes is not None else m.components[k]

    for k in ("trainable_weights", "gradients", "optimizer_states", "master_weights"):
        assert whole(fe, k) == pytest.approx(whole(f, k), rel=1e-9, abs=8)
    assert fe.components["transient"] < f.components["transient"]
    # ZeRO-2 + EP: the replicated expert weights shrink by ep
    z = estimate_memory(model, job, Layout(8, 1, "zero2"))
    ze = estimate_memory(model, job, Layout(8, 1, "zero2", ep=8))
    # DeepSpeed's bf16 mode keeps the module itself in bf16 (the fp32 copy is the partitioned
    # master: tests/test_distributed_memory.py)
    expert_w = model.params.experts * 2
    assert z.components["trainable_weights"] - ze.components["trainable_weights"] == pytest.approx(
        expert_w * (1 - 1 / 8), rel=1e-9)
    # the busiest rank: more rows, more activation memory
    j1 = Job(method="full", seq_len=2048)
    a = estimate_memory(model, j1, Layout(8, 1, "fsdp", ep=8)).components["activations"]
    assert a > estimate_memory(model, j1, Layout(8, 1, "fsdp")).components["activations"] * 0.9
    moe = next(g.moe for g in model.groups if g.moe is not None)
    assert ep_rows_per_rank(4096, moe) == math.ceil(4096 * moe.top_k * 1.25)


def test_all_to_all_time():
    assert all_to_all_time(1e9, 1, 1e11) == 0.0
    t2, t8 = all_to_all_time(1e9, 2, 1e11), all_to_all_time(1e9, 8, 1e11)
    assert t2 == pytest.approx(0.5e9 / 1e11) and t8 == pytest.approx(7 / 8 * 1e9 / 1e11)
    model = resolve_model("qwen3-30b-a3b")
    job = Job(method="full", micro_batch=1, seq_len=4096, grad_accum=2, gradient_checkpointing=False)
    lay = Layout(8, 1, "fsdp", ep=8)
    gpu = load_gpus()["h100-sxm"]

    def a2a(j, layout=lay):
        return estimate_runtime(model, j, layout, gpu).breakdown["ep_all_to_all_s"]

    base = a2a(job)
    assert base > 0
    # full checkpointing recomputes the forward: its 2 all-to-alls per MoE layer once more
    assert a2a(job.with_(gradient_checkpointing=True, checkpointing="full")) == pytest.approx(base * 1.5)
    assert a2a(job.with_(grad_accum=4)) == pytest.approx(base * 2)
    assert a2a(job, Layout(8, 1, "fsdp")) == 0.0


def test_planner_offers_ep_layouts_where_cheaper():
    """The planner searches EP layouts and ranks them with the runtime model's own EP terms
    (``runtime.ep_comm``: the all-to-alls; ``runtime.dp_comm``: the experts' traffic in their own
    group). EP wins where the experts' data-parallel traffic is exposed (DeepSeek-V3's 256 experts;
    full fine-tuning's gradients; short micro-batches) and loses where FSDP hides the expert
    gathers behind compute while the all-to-all bytes grow with tokens x top_k (Qwen3-30B-A3B LoRA
    at micro-batch 32: ~2 s of all-to-alls per ~10 s step, the gathers ~0.3 s and hidden)."""
    from ftplan.catalog.gpus import load_gpus
    from ftplan.catalog.offers import load_offers
    from ftplan.planner import recommend
    from ftplan.runtime import estimate_runtime

    offers = load_offers()
    # (LoRA on the attention: PEFT cannot adapt EP experts, ftplan refuses that: tests/test_ep_lora.py)
    attention = {"qwen3-30b-a3b": ("q_proj", "k_proj", "v_proj", "o_proj"),
                 "deepseek-v3": ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")}
    for name in ("qwen3-30b-a3b", "deepseek-v3"):
        model = resolve_model(name)
        job = Job(method="lora", seq_len=4096, dataset_tokens=50_000_000,
                  lora=Job().lora.__class__(dropout=0.0, target_modules=attention[name]))
        # (target=None: every layout ranked; no export target sets EP up, so by default they are left out)
        ps = recommend(model, job, offers, gpus=["h200", "b200"], target=None)
        ep = [p for p in ps.plans if p.layout.ep > 1]
        assert ep, name
        assert all(p.runtime.breakdown["ep_all_to_all_s"] > 0 for p in ep)
    assert any("+ep" in p.strategy_label for p in ps.plans[:10])  # deepseek-v3
    m = resolve_model("qwen3-30b-a3b")
    h100 = load_gpus()["h100-sxm"]

    def step(method: str, mb: int, strategy: str, ep: int) -> float:
        j = Job(method=method, seq_len=2048, micro_batch=mb,
                lora=Job().lora.__class__(dropout=0.0, target_modules=attention["qwen3-30b-a3b"]))
        return estimate_runtime(m, j, Layout(8, 1, strategy, ep=ep), h100).step_time_s

    for strategy in ("ddp", "zero2", "fsdp"):  # full fine-tuning: the experts' gradients dominate
        assert step("full", 1, strategy, 8) < step("full", 1, strategy, 1), strategy
    assert step("lora", 1, "fsdp", 8) < step("lora", 1, "fsdp", 1)  # short micro-batch: gathers exposed
    assert step("lora", 32, "fsdp", 8) > step("lora", 32, "fsdp", 1)  # long: the all-to-alls cost more


def _fsdp1_around_a_bf16_deepseek(tmp_path) -> tuple[set[str], str]:
    """FSDP1 (``transformer_auto_wrap_policy`` on the decoder layers, flat parameters) around a bf16
    tiny DeepSeek-V3 in a one-rank gloo group of this process (a file store in ``tmp_path``;
    destroyed after): (the router weights' dtypes, ``"wrapped"`` or ``"refused: <error>"``). In
    process: a subprocess spent ~8 s importing torch and transformers again."""
    import functools

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    import ftplan.measure.torchref as TR
    from ftplan.measure.distributed import _decoder_layers

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=(tmp_path / "pg").as_uri(), rank=0, world_size=1)
    try:
        model = TR.build_model(TR.TINY_CONFIGS["deepseek_v3"], dtype="bf16")
        router = {str(m.weight.dtype) for n, m in model.named_modules() if n.endswith("mlp.gate")}
        policy = functools.partial(transformer_auto_wrap_policy,
                                   transformer_layer_cls={type(layer) for layer in _decoder_layers(model)})
        try:
            FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=False)
            outcome = "wrapped"
        except ValueError as e:
            outcome = f"refused: {e}"
    finally:
        dist.destroy_process_group()
    return router, outcome


@pytest.mark.torch
def test_fsdp1_refuses_the_fp32_router_of_a_bf16_deepseek_and_ftplan_says_so(tmp_path):
    """transformers >= 5.24 keeps DeepSeek-V3's router weight in fp32: a bf16 model then mixes
    dtypes inside a decoder layer, which FSDP1's flat parameter refuses; ftplan's answer says so
    (and not for a family without an fp32 router)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import ftplan.measure.torchref as TR
    from ftplan.model import model_from_config

    router, outcome = _fsdp1_around_a_bf16_deepseek(tmp_path)
    assert router == {"torch.float32"}, (router, outcome)
    assert outcome.startswith("refused:") and "uniform dtype" in outcome, outcome
    job = Job(method="full", precision="bf16", micro_batch=1, seq_len=32)
    notes = estimate_memory(model_from_config(TR.TINY_CONFIGS["deepseek_v3"]), job,
                            Layout(2, 1, "fsdp", fsdp_version=1)).notes
    assert any("FSDP1's flat parameters refuse" in n for n in notes), notes
    for family in ("mixtral", "llama"):
        notes = estimate_memory(model_from_config(TR.TINY_CONFIGS[family]), job,
                                Layout(2, 1, "fsdp", fsdp_version=1)).notes
        assert not any("flat parameters refuse" in n for n in notes), (family, notes)


def test_exports_refuse_expert_parallel_layouts():
    """No exported launch sets up transformers' load-time expert sharding
    (``DistributedConfig(ep_size=...)``): an EP plan would run as plain FSDP2 / DeepSpeed and hold
    other bytes than its answer. Every target refuses it in one line and the default search (the
    accelerate target) leaves EP layouts out with a note."""
    from ftplan.catalog.offers import load_offers
    from ftplan.export.targets import TARGETS, exportable
    from ftplan.planner import recommend

    model = resolve_model("qwen3-30b-a3b")
    job = Job(method="full", seq_len=1024, dataset_tokens=10_000_000)
    for target in TARGETS:
        for strategy in ("fsdp", "zero3", "ddp"):
            ok, why = exportable(Layout(8, 1, strategy, ep=2), job, target, model)
            assert not ok and "expert parallelism (`ep` > 1)" in why and "`ep=1`" in why, (target, strategy, why)
        assert exportable(Layout(8, 1, "fsdp"), job, target, model)[0] or target != "accelerate"
    ps = recommend(model, job, load_offers(), gpus=["h200"])
    assert ps.plans and all(p.layout.ep == 1 for p in ps.plans)
    assert any("expert parallelism" in n for n in ps.notes), ps.notes
