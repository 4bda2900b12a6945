"""Hand-computed checks of the runtime model (no torch)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from ftplan.catalog.efficiency import efficiency
from ftplan.job import Job, Layout
from ftplan.model import model_from_config
from ftplan.runtime import (
    all_reduce_time,
    attention_context,
    estimate_runtime,
    flops_per_token,
    pp_bubble_fraction,
    reduce_scatter_time,
)

CFG = dict(model_type="llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
           num_attention_heads=16, num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False)


def gpu(**kw):
    d = dict(name="fake", vendor="nvidia", arch="hopper", memory_bytes=80 * 10**9, mem_bw_tbps=3.0,
             intra_node_bw_gbps=400.0, tdp_w=700, supports_bitsandbytes=True, supports_flash_attention=True,
             max_gpus_per_node=8)
    d.update(kw)
    return SimpleNamespace(peak_tflops=lambda dt: 1000.0, **d)


@pytest.fixture(scope="module")
def model():
    return model_from_config(CFG, name="tiny")


def _matmul_params(m):
    h, i, L = 1024, 4096, 4
    q, kv = 16 * 64, 4 * 64
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    return L * per_layer + h * 32000  # + lm_head


def test_full_flops_is_6n_plus_attention(model):
    s = 2048
    f = flops_per_token(model, Job(seq_len=s, gradient_checkpointing=False, loss="hf"))
    n = _matmul_params(model)
    # causal attention: 4 * s * d_attn per layer per token, halved, 4 layers
    attn = 4 * 4 * (s / 2) * 16 * 64
    assert f.forward == pytest.approx(2 * n + attn)
    assert f.model == pytest.approx(6 * n + 3 * attn)
    assert f.recompute == 0
    g = flops_per_token(model, Job(seq_len=s, gradient_checkpointing=True, loss="hf"))
    assert g.recompute == pytest.approx(2 * (n - 1024 * 32000) + attn)


def test_lora_backward_saves_weight_gradients(model):
    s = 1024
    full = flops_per_token(model, Job(seq_len=s))
    lora = flops_per_token(model, Job(method="lora", seq_len=s))
    n = _matmul_params(model)
    attn = 4 * 4 * (s / 2) * 16 * 64  # 4 layers x 4 s d_attn / 2
    r = 16
    h, i = 1024, 4096
    q, kv = 16 * 64, 4 * 64
    adapters = 4 * 2 * r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    assert lora.adapters == pytest.approx(adapters)
    assert lora.forward == pytest.approx(2 * n + attn + adapters)
    assert lora.backward == pytest.approx(2 * n + 2 * attn + 2 * adapters)  # base: input grads only
    # base matmuls: 1x forward in backward instead of 2x -> about 2/3 of full's FLOPs
    assert lora.model < 0.75 * full.model


def test_sliding_window_bounded_only_with_flash():
    assert attention_context(8192, 4096, "flash") == pytest.approx(4096 - 4096**2 / (2 * 8192))
    assert attention_context(8192, 4096, "sdpa") == 8192
    assert attention_context(2048, 4096, "flash") == 1024
    assert attention_context(2048, None, "eager") == 2048


def test_comm_formulas():
    assert all_reduce_time(1e9, 8, 1e11) == pytest.approx(2 * 7 / 8 * 1e9 / 1e11)
    assert reduce_scatter_time(1e9, 4, 1e10) == pytest.approx(3 / 4 * 1e9 / 1e10)
    assert all_reduce_time(1e9, 1, 1e10) == 0
    assert all_reduce_time(1e6, 2, 1e10, latency_s=1e-5, bucket_bytes=5e5) == pytest.approx(
        1e6 / 1e10 + 2 * 1e-5 * 2)


def test_pp_bubble():
    assert pp_bubble_fraction(1, 8) == 0
    assert pp_bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert pp_bubble_fraction(2, 1) == pytest.approx(1 / 2)


def test_runtime_shape(model):
    j = Job(seq_len=2048, micro_batch=4, dataset_tokens=10_000_000)
    r = estimate_runtime(model, j, Layout(), gpu())
    assert r.tokens_per_step == 4 * 2048
    assert r.steps == math.ceil(10_000_000 / (4 * 2048))
    assert r.hours == pytest.approx(r.steps * r.step_time_s / 3600)
    assert 0 < r.mfu < 1
    assert r.comm_time_s == 0 and r.dequant_time_s == 0
    d = estimate_runtime(model, j, Layout(8, 1, "ddp"), gpu())
    assert d.comm_time_s > 0 and d.tokens_per_s > 6 * r.tokens_per_s
    # bandwidth terms only (the ring latency differs: DDP pays it per 25 MiB bucket, ZeRO-3 per
    # layer collective): full bf16-mixed ZeRO-3 gathers bf16 params twice and reduce-scatters fp32
    # grads = the bytes of DDP's fp32 all-reduce
    eff0 = dataclasses.replace(efficiency(), latency_hop_intra_s=0.0, latency_hop_inter_s=0.0)
    d0 = estimate_runtime(model, j, Layout(8, 1, "ddp"), gpu(), eff=eff0)
    z3 = estimate_runtime(model, j, Layout(8, 1, "zero3"), gpu(), eff=eff0)
    assert z3.comm_time_s == pytest.approx(d0.comm_time_s)
    ja = j.with_(grad_accum=4)  # ZeRO-3 communicates per micro-batch, DDP once per step
    assert (estimate_runtime(model, ja, Layout(8, 1, "zero3"), gpu(), eff=eff0).comm_time_s
            == pytest.approx(4 * z3.comm_time_s, rel=1e-6))
    assert estimate_runtime(model, ja, Layout(8, 1, "ddp"), gpu(), eff=eff0).comm_time_s == pytest.approx(d0.comm_time_s)
    q = estimate_runtime(model, j.with_(method="qlora"), Layout(), gpu())
    assert q.dequant_time_s > 0
    # 1F1B with m = 4 micro-batches over 2 stages: one micro-batch stage time idles, (pp - 1) / m of
    # the micro-batches' time. With a free host the stage time is its compute and its activation send
    free = dataclasses.replace(efficiency(), dispatch_s_per_op=0.0, checkpoint_ops_per_layer=0.0)
    pp = estimate_runtime(model, j.with_(grad_accum=4), Layout(2, 1, "single", pp=2), gpu(), eff=free)
    b = pp.breakdown
    assert b["pp_bubble_s"] == pytest.approx((pp.compute_time_s + b["pp_comm_s"]) / 4)
    # a stage whose forward waits on its host (TRL's fused head syncs between forward and backward)
    # idles for its whole micro-batch time, host included: never less than the GPU-only bubble
    pph = estimate_runtime(model, j.with_(grad_accum=4), Layout(2, 1, "single", pp=2), gpu())
    assert pph.breakdown["pp_bubble_s"] >= (pph.compute_time_s + pph.breakdown["pp_comm_s"]) / 4 * (1 - 1e-9)


def test_multinode_needs_offer_network(model):
    from ftplan.errors import ConfigError

    j = Job(seq_len=512, dataset_tokens=10**6)
    with pytest.raises(ConfigError):
        estimate_runtime(model, j, Layout(8, 2, "ddp"), gpu())
    offer = SimpleNamespace(inter_node_gbps=400.0)
    slow = estimate_runtime(model, j, Layout(8, 2, "ddp"), gpu(), offer=offer)
    one = estimate_runtime(model, j, Layout(8, 1, "ddp"), gpu())
    assert slow.comm_time_s > one.comm_time_s
