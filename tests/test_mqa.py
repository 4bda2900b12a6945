"""Multi-query attention (one kv head) and unrepeated kv heads: what attention saves of k and v.

transformers' ``repeat_kv`` (``expand`` then ``reshape``) copies k and v to every query head, except
with one kv head (MQA: Gemma 3 1B, Falcon-style models, any GQA model under tensor parallelism with
one kv head per rank), where the reshape is a view with a 0 stride over the heads, and without
repetition (``num_key_value_heads == num_attention_heads``), where it returns its input. What the
kernel then saves:

* eager: ``torch.matmul`` of 4-D tensors folds (batch, heads) into one dim with ``reshape``: a view
  at micro-batch 1 (so k and v stay one head), a copy at micro-batch 2 (every head). Measured on the
  tiny llama with one kv head before the fix: ftplan +4,608 B (full) / +9,216 B (LoRA) at b = 1,
  exact at b = 2;
* sdpa after ``repeat_kv`` (a mask: sliding window shorter than the row): the views at any batch;
* a view keeps what it views: k after the rope, v's projection output (phi3: the whole fused qkv
  output, also under sdpa's native GQA), unless k or v is not in the compute dtype: autocast's cast
  of a 0-stride view is a dense copy of every head. Under HF Trainer's autocast full fine-tuning
  keeps an fp32 residual stream, so the rope promotes k to fp32 and only v stays a view (why full
  fine-tuning was off by half of LoRA); OLMo's fp32 rope and Llama 4's complex rope cast k back,
  smollm3's NoPE layers have no rope: k stays a view there too.

Byte equality against autograd's saved tensors on CPU (``test_memory_vs_torch._run``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import ftplan.measure.torchref as TR  # noqa: E402
from ftplan.memory import saved_activation_bytes  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_memory_vs_torch import _check_qlora, _run, _run_fp32_base  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread is ~10x faster than two on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _mqa(family: str, kv_heads: int = 1) -> dict:
    cfg = {**TR.TINY_CONFIGS[family], "num_key_value_heads": kv_heads}
    if "num_global_key_value_heads" in cfg:  # gemma4's full-attention layers
        cfg["num_global_key_value_heads"] = kv_heads
    return cfg


def _check(family, method, ckpt, batch, seq, attn, precision="bf16-mixed", kv_heads=1):
    spec, job, r, casts = _run(family, method, ckpt, batch, seq, attn=attn, precision=precision,
                               cfg=_mqa(family, kv_heads))
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


# s = 24: gemma3's sliding layers (window 16) mask, its full layer does not (sdpa: repeat_kv + the
# kernel vs native GQA in one model); mistral's window 16 masks every layer
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "mistral"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_mqa_saved_activations_exact(family, attn, method, ckpt, batch):
    """One kv head, HF Trainer's autocast: eager keeps k/v views at b = 1 only, sdpa after
    repeat_kv at every batch; checkpointing on and off."""
    _check(family, method, ckpt, batch, 24, attn)


@pytest.mark.parametrize("family,attn,batch", [
    ("llama", "eager", 1), ("gemma3_text", "eager", 1), ("mistral", "sdpa", 2)])
def test_mqa_pure_bf16(family, attn, batch):
    """Pure bf16 full fine-tuning: the rope keeps k in bf16, so k and v both stay views."""
    _check(family, "full", False, batch, 24, attn, precision="bf16")


@pytest.mark.parametrize("family,method,attn", [
    ("qwen2", "lora", "eager"),
    ("olmo2", "full", "eager"),  # fp32 rope cast back to bf16: k a view under autocast too
    ("smollm3", "full", "eager"),  # NoPE layer 1 of 3: k a view there, the rope layers' fp32 k copied
    ("gpt_oss", "lora", "eager"),  # sinks
    ("llama4_text", "full", "sdpa"),  # complex rope; chunked layers masked, NoPE layers native GQA
    ("gemma4", "full", "eager"),  # k_eq_v and v_norm on the full layers, one kv head in both kinds
    ("qwen3_5", "lora", "eager"),  # gated attention in a hybrid model
])
def test_mqa_other_families(family, method, attn):
    _check(family, method, False, 1, 24, attn)


@pytest.mark.parametrize("kv_heads,attn,seq,batch", [
    (1, "eager", 24, 1),  # MQA: v a view of the fused qkv output
    (4, "eager", 24, 1),  # MHA (no repeat): the same at b = 1
    (4, "eager", 24, 2),  # ... a copy at b = 2
    (4, "sdpa", 12, 2),  # no mask (12 < window 16): native GQA passes v as the slice
    (2, "sdpa", 12, 1),  # GQA without a mask: the same
    (1, "sdpa", 24, 2),  # masked: repeat_kv's view
])
def test_phi3_fused_qkv_v_view(kv_heads, attn, seq, batch):
    """phi3 slices q, k, v from one qkv projection: a saved v view keeps that whole output alive
    (``(heads + 2 kv_heads) * head_dim`` features a token), also under sdpa's native GQA."""
    _check("phi3", "lora", False, batch, seq, attn, kv_heads=kv_heads)


def test_llama_mha_eager_b1():
    """No repeat (kv heads = heads): the saved views have the repeated size anyway."""
    _check("llama", "full", False, 1, 24, "eager", kv_heads=4)


@pytest.mark.parametrize("recipe", ["peft", "trl"])
def test_mqa_qlora(recipe):
    """PEFT's kbit recipe: Linear4bit returns fp32, autocast copies k and v; TRL's: bf16 views."""
    pytest.importorskip("bitsandbytes")
    _check_qlora("llama", False, recipe, batch=1, attn="eager", cfg=_mqa("llama"))


def test_mqa_fp32_lora_base():
    """An fp32 LoRA base: the rope promotes k to the fp32 stream (copied), v stays a view."""
    spec, job, r, casts = _run_fp32_base("llama", False, 1, 24, attn="eager", cfg=_mqa("llama"))
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
