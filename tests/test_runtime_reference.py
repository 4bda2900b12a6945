"""The runtime model held against published throughput (catalog/data/runtime_reference.json), its
terms against hand-computed and published values, and its invariants (hypothesis). No torch.

Tolerances are stated where they are asserted; the accuracy figures are those of
``benchmarks/runtime_accuracy.py`` (README 'Runtime model').
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ftplan.catalog.efficiency import FITTED_KEYS, efficiency, load_efficiency_data, parse_efficiency
from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.models import resolve_model
from ftplan.catalog.runtime_reference import quantile, error_stats, evaluate, load_reference, ratio_checks
from ftplan.cost import estimate_cost
from ftplan.errors import CatalogError
from ftplan.job import Job, LoraSpec, Layout
from ftplan.model import model_from_config
from ftplan.runtime import (
    Rates,
    attention_time,
    clock_factor,
    dequant_time,
    estimate_runtime,
    gemm_time,
    host_time,
    loss_bytes_per_token,
    matmul_time,
    recompute_fractions,
)

HYP = settings(max_examples=int(__import__("os").environ.get("FTPLAN_HYP_EXAMPLES", 40)), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _J(**kw) -> Job:
    """A Job with the settings these hand computations assume (no checkpointing, transformers'
    loss, 2048 tokens), whatever ftplan's defaults are (TRL's: checkpointing on, fused head)."""
    return Job(**{"gradient_checkpointing": False, "loss": "hf", "seq_len": 2048, **kw})


@pytest.fixture(scope="module")
def refs():
    return load_reference()


@pytest.fixture(scope="module")
def outcomes(refs):
    return evaluate(refs)


# ---------------------------------------------------------------------------------------------
# the data file
# ---------------------------------------------------------------------------------------------
def test_reference_file_is_complete_and_split_by_source(refs):
    data = load_reference.__globals__["json"].loads(load_reference.__globals__["_path"]().read_text())
    scored = [r for r in refs if not r.exclude]
    assert len(scored) >= 30
    # every source has a URL and one split: a publication never feeds both the fit and the check
    for name, s in data["sources"].items():
        assert s["url"].startswith("https://") and s["split"] in ("calibration", "holdout", "constant"), name
    cal = {r.source for r in scored if r.split == "calibration"}
    hold = {r.source for r in scored if r.split == "holdout"}
    assert cal and hold and not (cal & hold)
    for r in refs:
        assert r.reported.strip() and r.measured_tps_per_gpu > 0
        assert r.exclude is None or len(r.exclude) > 30, r.id  # an exclusion says why
    # the GPUs the issue names are all represented
    gpus = {r.gpu for r in scored}
    assert {"a100-80gb-sxm", "a100-40gb-sxm", "h100-sxm", "l40s", "rtx-4090", "rtx-3090"} <= gpus
    methods = {r.job.get("method") for r in scored}
    assert methods == {"full", "lora", "qlora"}
    counts = {r.layout.get("gpus_per_node", 1) * r.layout.get("nodes", 1) for r in scored}
    assert 1 in counts and 8 in counts and 128 in counts


def test_reference_rejects_bad_records():
    with pytest.raises(CatalogError):
        load_reference({"sources": {}, "records": [{"id": "x", "source": "nowhere"}]})
    ok_src = {"s": {"url": "https://example.org", "split": "holdout"}}
    rec = {"id": "x", "source": "s", "model": {}, "job": {}, "layout": {}, "gpu": "h100-sxm",
           "measured": {"tokens_per_s_per_gpu": 0, "reported": "r"}}
    with pytest.raises(CatalogError):
        load_reference({"sources": ok_src, "records": [rec]})


# ---------------------------------------------------------------------------------------------
# accuracy (issue 15's targets)
# ---------------------------------------------------------------------------------------------
def test_holdout_accuracy(outcomes):
    held = [o for o in outcomes if o.ref.split == "holdout"]
    cal = [o for o in outcomes if o.ref.split == "calibration"]
    assert len(held) >= 20 and len(cal) >= 15
    # target: held-out median |error| <= 15 % (today 5.9 %); in-sample <= 10 % (today 4.1 %)
    assert error_stats(held)["median_abs"] <= 0.15
    assert error_stats(cal)["median_abs"] <= 0.10
    # target: no case predicted more than 25 % faster than measured. Today four held-out records
    # miss it (was six before the 3090 box's host link was modelled); each carries its analysis in
    # "miss_note". Any other record over 25 % fails here, and so does a fifth (the count may only go down).
    over = [o for o in outcomes if o.error > 0.25]
    assert all(o.ref.raw.get("miss_note") for o in over), [o.ref.id for o in over if not o.ref.raw.get("miss_note")]
    assert len(over) <= 4
    # nothing is under-predicted by more than 25 % (too slow costs money too)
    assert min(o.error for o in outcomes) >= -0.25


def test_ratios(outcomes):
    ratios = ratio_checks(outcomes)
    kinds = {r["kind"] for r in ratios}
    assert {"gpu", "lora-vs-full", "scale", "qlora-vs-lora"} <= kinds
    miss = [r for r in ratios if abs(r["error"]) > 0.15]
    # target: within 15 %. Four GPU-vs-GPU pairs miss today, each with a note (three are the
    # Answer.AI 3090 box's slow PCIe lanes); the count may only go down
    assert all(r["note"] for r in miss) and len(miss) <= 4
    # the scaling ratios (8 -> 64/128 GPUs) and LoRA vs full hold within 15 %
    for r in ratios:
        if r["kind"] in ("scale", "lora-vs-full", "compile", "strategy"):
            assert abs(r["error"]) <= 0.15, r


def test_calibration_written_matches_the_data(refs, outcomes):
    """efficiency.json's fitted constants and band were written from the current reference file."""
    data = load_efficiency_data()
    cal = data["calibration"]
    now_cal = sorted(r.id for r in refs if r.split == "calibration" and not r.exclude)
    now_hold = sorted(r.id for r in refs if r.split == "holdout" and not r.exclude)
    assert sorted(i for i in cal["calibration_records"] if not i.startswith("measure-")) == now_cal
    assert sorted(cal["holdout_records"]) == now_hold
    # the GPU measurement records the fit used / held out are the split file's, by model
    from pathlib import Path

    from ftplan.catalog.runtime_reference import load_gpu_records

    gpu = load_gpu_records(Path(__file__).resolve().parents[1] / "benchmarks" / "measurements")
    assert sorted(i for i in cal["calibration_records"] if i.startswith("measure-")) == sorted(
        r.id for r in gpu if r.split == "calibration")
    assert sorted(cal["gpu_holdout_records"]) == sorted(r.id for r in gpu if r.split == "holdout")
    for key in FITTED_KEYS:
        cur = data
        for part in key.split("."):
            cur = cur[part]
        assert cur["status"] == "calibrated" and "prior" in cur, key
    # the band is the 10th/90th percentile of the held-out log(measured / predicted step time)
    lrs = [o.log_ratio for o in outcomes if o.ref.split == "holdout"]
    u = data["uncertainty"]
    assert u["log_low"] == pytest.approx(quantile(lrs, 0.1), abs=2e-3)
    assert u["log_high"] == pytest.approx(quantile(lrs, 0.9), abs=2e-3)
    assert u["n"] == len(lrs)


# ---------------------------------------------------------------------------------------------
# terms against published / hand-computed values
# ---------------------------------------------------------------------------------------------
def _rates(gpu_name: str, eff=None) -> Rates:
    from ftplan.runtime import rates_for

    return rates_for(load_gpus()[gpu_name], _J(), eff or efficiency())


def test_gemm_term_reproduces_the_cublas_table():
    """Azure ND A100 v4 cuBLASLt FP16 (A100-SXM4-80GB): 1024^3 119.4, 2048^3 221.8, 4096^3 228.0,
    8192^3 253.7 TFLOPS. The GEMM term (torch.matmul's best rate, a fixed launch time per GEMM, no
    training scale) lands within 15 % (the table's 4096^3 point dips below its neighbours)."""
    eff = dataclasses.replace(efficiency(), gemm_training_scale=1.0)
    r = _rates("a100-80gb-sxm", eff)
    for n, published in ((1024, 119.4), (2048, 221.8), (4096, 228.0), (8192, 253.7)):
        tflops = 2.0 * n ** 3 / gemm_time(n, n, n, r) / 1e12
        assert tflops == pytest.approx(published, rel=0.15), n


def test_gemm_roofline_memory_bound_for_skinny_gemms():
    r = _rates("h100-sxm")
    # a rank-16 LoRA A matmul on 4096 tokens x 4096 features: bytes dominate -> traffic / BW + launch
    m, k, n = 4096, 4096, 16
    traffic = 2.0 * (m * k + k * n + m * n)
    assert gemm_time(m, k, n, r) == pytest.approx(traffic / r.hbm_bytes_per_s + r.gemm_launch_s)
    assert 2.0 * m * k * n / (r.peak_flops * r.gemm_fraction) < traffic / r.hbm_bytes_per_s


def test_matmul_time_is_the_sum_of_its_gemms():
    """matmul_time (written out inline for speed) equals the GEMMs it stands for, by hand."""
    model = model_from_config({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
                               "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
                               "vocab_size": 1000, "tie_word_embeddings": False}, name="tiny")
    r = _rates("a100-80gb-sxm")
    t = 3000.0
    lay = Layout()
    # full, no checkpointing: forward, dgrad, wgrad of every weight
    want = 0.0
    for k, n, c in ((512, 512, 4 * 2), (512, 1024, 2 * 2), (1024, 512, 2), (512, 1000, 1)):
        want += c * (gemm_time(t, k, n, r) + gemm_time(t, n, k, r) + gemm_time(k, t, n, r))
    assert matmul_time(model, _J(), lay, t, r) == pytest.approx(want, rel=1e-12)
    # LoRA r=8 on q_proj only, checkpointing: frozen weights lose the wgrad, q_proj gains 6 skinny GEMMs
    job = _J(method="lora", lora=LoraSpec(r=8, target_modules=("q_proj",)), gradient_checkpointing=True)
    want = 0.0
    for k, n, c, rc in ((512, 512, 4 * 2, 1), (512, 1024, 2 * 2, 1), (1024, 512, 2, 1), (512, 1000, 1, 0)):
        want += c * (gemm_time(t, k, n, r) * (1 + rc) + gemm_time(t, n, k, r))
    a = (gemm_time(t, 512, 8, r) + gemm_time(t, 8, 512, r)) * 2 + gemm_time(t, 512, 8, r) + gemm_time(t, 8, 512, r) \
        + gemm_time(512, t, 8, r) + gemm_time(8, t, 512, r)
    want += 2 * a
    assert matmul_time(model, job, lay, t, r) == pytest.approx(want, rel=1e-12)


def test_dequant_term_reproduces_litgpt():
    """litgpt resource tables (A100-SXM4-40GB, bitsandbytes 0.41.1, micro-batch 1, no
    checkpointing): bnb.nf4 minus no quantization = 79 ms per iteration for Llama-2-7B and 191 ms
    for Llama-2-13B. The dequantization term (2 passes; its constant is the mean over 3B/7B/13B,
    which spread -15..+18 % around it) lands within 20 %."""
    cfg7 = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}
    cfg13 = dict(cfg7, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                 num_attention_heads=40, num_key_value_heads=40)
    r = _rates("a100-40gb-sxm")
    job = _J(method="qlora", quant=dataclasses.replace(_J().quant, double_quant=False))
    for cfg, ms in ((cfg7, 79.2), (cfg13, 191.4)):
        t = dequant_time(model_from_config(cfg, name="l2"), job, Layout(), r, efficiency())
        assert t * 1e3 == pytest.approx(ms, rel=0.20)


def test_attention_term_by_hand():
    model = resolve_model("llama-3.1-8b")
    eff = efficiency()
    r = _rates("h100-sxm")
    job = _J(seq_len=8192, gradient_checkpointing=True)
    # causal flash: 32 layers x 2 x (s/2) keys x 32 heads x (128 + 128) per token, forward;
    # backward 2.5x, recompute 1x; at peak x flash fraction x fitted scale
    fwd = 32 * 2 * 4096 * 32 * 256
    want = 1000 * fwd * (1 + 2.5 + 1) / (989.4e12 * 0.33 * eff.flash_scale)
    assert attention_time(model, job, Layout(), 1000, r, eff) == pytest.approx(want, rel=1e-9)


def test_host_time_by_hand():
    model = resolve_model("llama-3.1-8b")
    eff = efficiency()
    lora = _J(method="lora", lora=LoraSpec(target_modules=("q_proj", "v_proj")))
    # 32 layers x 55 ops + 64 wrapped modules x 9 ops, forward + 1.5x backward (no checkpointing)
    want = (32 * 55 + 64 * 9) * 2.5 * eff.dispatch_s_per_op
    assert host_time(model, lora, Layout(), eff) == pytest.approx(want)


def test_power_cap_clock_factor():
    eff = efficiency()
    h100 = load_gpus()["h100-sxm"]
    assert clock_factor(h100, eff) == 1.0
    capped = SimpleNamespace(power_limit_w=500, tdp_w=700)
    assert clock_factor(capped, eff) == pytest.approx((500 / 700) ** 0.33)


def test_recompute_fractions():
    assert recompute_fractions(_J()) == (0, 0, 0)
    assert recompute_fractions(_J(gradient_checkpointing=True)) == (1, 1, 1)
    sel = recompute_fractions(_J(gradient_checkpointing=True, checkpointing="selective"))
    assert sel.matmul == 0.5 and sel.attention == 0
    k = recompute_fractions(_J(gradient_checkpointing=True, checkpointing="every-k", checkpoint_every=4))
    assert k == (0.25, 0.25, 0.25)


def test_recompute_fractions_of_a_model_by_hand():
    """With the model: Llama-3.1-8B (32 layers; q 4096x4096, k/v 4096x1024, o 4096x4096, gate/up/down
    4096x14336). every-k with k=3 checkpoints layers 0, 3, ..., 30 = 11 of 32 (transformers'
    every_n_layers); torchtitan's selective policy caches the 1st, 3rd, 5th, 7th mm (q, v, gate,
    down), so k, o and up are recomputed: (1024 + 4096 + 14336) / (4096 + 2048 + 4096 + 3 x 14336)
    of the matmul FLOPs; eager attention is no single op to cache, so it is recomputed."""
    m = resolve_model("llama-3.1-8b")
    k3 = recompute_fractions(_J(gradient_checkpointing=True, checkpointing="every-k", checkpoint_every=3), None, m)
    assert k3.matmul == pytest.approx(11 / 32) and k3.attention == pytest.approx(11 / 32)
    assert k3.elementwise == pytest.approx(11 / 32)
    sel = recompute_fractions(_J(gradient_checkpointing=True, checkpointing="selective"), None, m)
    assert sel.matmul == pytest.approx(19456 / 53248) and sel.attention == 0 and sel.elementwise == 1
    eager = recompute_fractions(_J(gradient_checkpointing=True, checkpointing="selective", attn_impl="eager"), None, m)
    assert eager.attention == 1
    assert recompute_fractions(_J(gradient_checkpointing=True, checkpointing="selective-attention"), None, m) == (1, 0, 1)


def test_loss_path_terms_by_hand():
    """transformers' loss moves 40 B per logit (fp32 upcast, log-softmax and its backward), Liger's
    fused kernel 6; TRL's fused head runs the LM head's forward GEMM once more in backward, so its
    matmul time exceeds transformers' by exactly one (tokens x hidden x vocab) GEMM."""
    eff = efficiency()
    m = resolve_model("llama-3.2-1b")  # tied embeddings: the head is the 2048 x 128256 embedding
    lay = Layout()
    assert loss_bytes_per_token(m, _J(), lay, eff) == pytest.approx(128256 * 40)
    assert loss_bytes_per_token(m, _J(loss="liger"), lay, eff) == pytest.approx(128256 * 6)
    r = _rates("h100-sxm")
    t = 4096.0
    extra = matmul_time(m, _J(loss="trl"), lay, t, r) - matmul_time(m, _J(), lay, t, r)
    assert extra == pytest.approx(gemm_time(t, 2048, 128256, r), rel=1e-9)
    assert matmul_time(m, _J(loss="liger"), lay, t, r) == pytest.approx(matmul_time(m, _J(), lay, t, r))


def test_ep_all_to_all_by_hand():
    """Qwen3-30B-A3B (48 MoE layers, hidden 2048, top-8) on 8 H100 with EP 8, one micro-batch of
    4096 tokens, no checkpointing: per layer 2 all-to-alls forward and 2 backward, each of the
    busiest rank's 4096 x 8 x 1.25 = 40960 rows x 2048 x 2 B, 7/8 of it over NVLink at the bus
    efficiency, plus 7 hop latencies (ring-free pairwise exchange)."""
    eff = efficiency()
    m = resolve_model("qwen3-30b-a3b")
    gpu = load_gpus()["h100-sxm"]
    job = _J(method="full", micro_batch=1, seq_len=4096)
    plain = estimate_runtime(m, job, Layout(8, 1, "fsdp"), gpu)
    ep = estimate_runtime(m, job, Layout(8, 1, "fsdp", ep=8), gpu)
    bw = gpu.intra_node_bw_for(8) * 1e9 * eff.bus_efficiency
    one = 7 / 8 * 40960 * 2048 * 2 / bw + 7 * eff.latency_hop_intra_s
    assert ep.breakdown["ep_all_to_all_s"] == pytest.approx(48 * 4 * one, rel=1e-9)
    assert plain.breakdown["ep_all_to_all_s"] == 0
    # the experts' gathers move in their own group with 1/8 of the bytes: less FSDP traffic
    assert ep.breakdown["dp_comm_s"] < plain.breakdown["dp_comm_s"] / 4


def test_fsdp_two_nodes_comm_by_hand():
    """FSDP over 2 nodes x 8 GPUs, 3200 Gb/s per node: a layer's collectives run at min(NVLink,
    node network) = 400 GB/s x bus efficiency; three per layer-unit per micro-batch."""
    model = resolve_model("llama-3.1-8b")
    eff = dataclasses.replace(efficiency(), latency_hop_intra_s=0.0, latency_hop_inter_s=0.0)
    job = _J(seq_len=2048)
    offer = SimpleNamespace(inter_node_gbps=3200)
    r = estimate_runtime(model, job, Layout(8, 2, "fsdp"), load_gpus()["h100-sxm"], offer=offer, eff=eff)
    n = model.params.total
    bw = min(450e9, 400e9) * eff.bus_efficiency
    want = 15 / 16 * (2 * 2 * n + 4 * n) / bw  # 2 bf16 gathers + fp32 reduce-scatter
    assert r.breakdown["dp_comm_s"] == pytest.approx(want, rel=1e-9)


def test_geforce_without_p2p_bounces_through_the_host():
    model = resolve_model("llama-3.2-1b")
    job = _J(seq_len=1024)
    gpus = load_gpus()
    r = estimate_runtime(model, job, Layout(2, 1, "ddp"), gpus["rtx-4090"])
    eff = efficiency()
    bw = 31.5e9 * eff.host_bounce_factor * eff.bus_efficiency
    grads = 4 * model.params.total
    buckets = math.ceil(grads / eff.ddp_bucket_bytes)
    want = 2 * (grads / 2 / bw + 1 * eff.latency_hop_intra_s * buckets)
    assert r.breakdown["dp_comm_s"] == pytest.approx(want, rel=1e-9)


def test_band_and_cost_band():
    model = resolve_model("llama-3.1-8b")
    job = _J(method="lora", seq_len=2048, micro_batch=4, dataset_tokens=50_000_000)
    r = estimate_runtime(model, job, Layout(), load_gpus()["h100-sxm"])
    eff = efficiency()
    assert r.step_time_s_low == pytest.approx(r.step_time_s * math.exp(eff.band_log_low))
    assert r.step_time_s_high == pytest.approx(r.step_time_s * math.exp(eff.band_log_high))
    assert r.tokens_per_s_low <= r.tokens_per_s <= r.tokens_per_s_high
    assert r.hours_low <= r.hours <= r.hours_high and r.total_hours_low <= r.total_hours <= r.total_hours_high
    offer = SimpleNamespace(usd_per_instance_hour=3.0, gpus_per_instance=1, billing_granularity_s=1)
    c = estimate_cost(r, offer, Layout(), None)
    assert c.usd_low <= c.usd <= c.usd_high
    assert c.usd_high == pytest.approx(3.0 * r.total_hours_high, rel=1e-3)


def test_parse_efficiency_validates():
    data = load_efficiency_data()
    bad = load_reference.__globals__["json"].loads(load_reference.__globals__["json"].dumps(data))
    del bad["gemm"]["peak_fraction"]["hopper"]["source"]
    with pytest.raises(CatalogError):
        parse_efficiency(bad)
    bad = load_reference.__globals__["json"].loads(load_reference.__globals__["json"].dumps(data))
    bad["uncertainty"]["log_low"], bad["uncertainty"]["log_high"] = 0.3, -0.3
    with pytest.raises(CatalogError):
        parse_efficiency(bad)


# ---------------------------------------------------------------------------------------------
# invariants
# ---------------------------------------------------------------------------------------------
_MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "mistral-7b", "qwen3-30b-a3b")
_GPUS = ("h100-sxm", "a100-80gb-sxm", "l40s", "rtx-4090", "mi300x")


@HYP
@given(model=hs.sampled_from(_MODELS), gpu=hs.sampled_from(_GPUS), method=hs.sampled_from(("full", "lora", "qlora")),
       seq=hs.sampled_from((256, 1024, 4096)), mb=hs.integers(1, 16), ga=hs.integers(1, 8),
       gc=hs.booleans(), strategy=hs.sampled_from(("single", "ddp", "fsdp", "zero2")), n=hs.sampled_from((2, 4, 8)))
def test_invariants(model, gpu, method, seq, mb, ga, gc, strategy, n):
    m = resolve_model(model)
    g = load_gpus()[gpu]
    if method == "qlora" and not g.supports_bitsandbytes:
        return
    lay = Layout() if strategy == "single" else Layout(n, 1, strategy)
    job = _J(method=method, seq_len=seq, micro_batch=mb, grad_accum=ga, gradient_checkpointing=gc,
              lora=LoraSpec(r=16, dropout=0.0))
    r = estimate_runtime(m, job, lay, g)
    assert r.step_time_s > 0 and 0 < r.mfu < 1
    # a larger micro-batch never lowers the throughput per GPU
    bigger = estimate_runtime(m, job.with_(micro_batch=mb + 1), lay, g)
    assert bigger.tokens_per_s >= r.tokens_per_s * (1 - 1e-9)
    # checkpointing never makes a step faster
    if not gc:
        assert estimate_runtime(m, job.with_(gradient_checkpointing=True), lay, g).step_time_s >= r.step_time_s
    # LoRA is not much slower per token than full fine-tuning on the same layout (rank 16, all
    # linear layers). It can be slower: PEFT runs the adapters unfused (skinny GEMMs, scale and add
    # passes on every wrapped module, fp32 adapters under autocast), which costs HBM traffic that
    # grows with the tokens while the weight-gradient FLOPs it saves shrink with the hidden size;
    # measured on the H100 (h100-sxm-campaign1/throughput1.jsonl), llama-3.1-8b LoRA at 1 x 2048
    # tokens with checkpointing ran at 0.74x the tokens/s of pure-bf16 full fine-tuning. A grid over
    # these models, GPUs (the L40S's low HBM bandwidth is the worst), layouts, micro-batches 1-16 and
    # sequences 256-4096 gives LoRA/full tokens/s >= 0.908 at hidden 4096, >= 0.862 at 3072, >= 0.828
    # at 2048 and >= 0.724 at 896 (Qwen2.5-0.5B, L40S, 16 x 1024, checkpointing): bounded at 0.85
    # from hidden 4096 and 0.7 below. In host-bound steps PEFT's extra launches per module cost more
    # than the work saved (down to 0.56 for Qwen2.5-0.5B at micro-batch 1 x 256 tokens), so those are
    # left out
    if method == "full":
        lo = estimate_runtime(m, job.with_(method="lora"), lay, g)
        if not lo.host_bound:
            floor = 0.85 if m.hidden_size >= 4096 else 0.7
            assert lo.tokens_per_s >= r.tokens_per_s * floor * (1 - 1e-9)
    # QLoRA never faster than LoRA (it adds dequantization; FSDP moves 4-bit weights though)
    if method == "qlora" and strategy not in ("fsdp",):
        assert estimate_runtime(m, job.with_(method="lora"), lay, g).tokens_per_s >= r.tokens_per_s * (1 - 1e-9)
    # torch.compile never slower
    assert estimate_runtime(m, job.with_(torch_compile=True), lay, g).step_time_s <= r.step_time_s * (1 + 1e-9)
    # the band brackets the estimate
    assert r.step_time_s_low <= r.step_time_s <= r.step_time_s_high


@HYP
@given(model=hs.sampled_from(_MODELS), gpu=hs.sampled_from(_GPUS), method=hs.sampled_from(("full", "lora")),
       mb=hs.integers(1, 8), strategy=hs.sampled_from(("ddp", "fsdp", "zero3", "zero2")))
def test_more_gpus_in_a_node_never_fewer_tokens_per_s(model, gpu, method, mb, strategy):
    """Within one node more data-parallel GPUs never lower the job's tokens/s unless the step is
    communication-bound, and then the communication explains it: what is not exposed
    communication never grows with the GPU count (per-GPU work is the same, sharding only
    shrinks the optimizer's share)."""
    m = resolve_model(model)
    g = load_gpus()[gpu]
    job = _J(method=method, seq_len=2048, micro_batch=mb)
    prev = estimate_runtime(m, job, Layout(), g)
    for n in (2, 4, 8):
        cur = estimate_runtime(m, job, Layout(n, 1, strategy), g)
        if cur.tokens_per_s < prev.tokens_per_s * (1 - 1e-9):
            assert cur.exposed_comm_s > 0, n
        assert cur.step_time_s - cur.exposed_comm_s <= prev.step_time_s - prev.exposed_comm_s + 1e-9, n
        prev = cur


def test_power_cap_never_faster_and_slower_network_never_faster():
    m = resolve_model("llama-3.1-8b")
    job = _J(seq_len=4096, micro_batch=2)
    h = load_gpus()["h100-sxm"]

    class Capped:
        def __init__(self, base, cap):
            self._b, self.power_limit_w = base, cap

        def __getattr__(self, k):
            return getattr(self._b, k)

    assert estimate_runtime(m, job, Layout(), Capped(h, 500)).tokens_per_s < estimate_runtime(m, job, Layout(), h).tokens_per_s
    fast = estimate_runtime(m, job, Layout(8, 4, "fsdp"), h, offer=SimpleNamespace(inter_node_gbps=3200))
    slow = estimate_runtime(m, job, Layout(8, 4, "fsdp"), h, offer=SimpleNamespace(inter_node_gbps=100))
    assert slow.tokens_per_s < fast.tokens_per_s
    assert statistics.fmean([fast.mfu, slow.mfu]) < 1
