"""Qwen3.5 dense (``qwen3_5``): the hybrid Gated DeltaNet / gated-attention layers against
transformers 5.24 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2, SAC) picks the tiny qwen3_5 up from ``TINY_CONFIGS``; this
file adds what is particular to it: the layer layout transformers derives from
``full_attention_interval``, the image-text config loading as ``Qwen3_5ForCausalLM``, PEFT's
``all-linear`` targets (the depthwise Conv1d is no Linear), the chunked delta rule over more than
one 64-token chunk (the sequence is padded to a multiple of 64), QLoRA through bitsandbytes, eager
attention, an fp32 LoRA base, and the estimate's notes and FLOPs.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.job import Job, Layout
from ftplan.memory import estimate_memory, saved_activation_bytes
from ftplan.model import layer_group_order, model_from_config
from ftplan.runtime import delta_rule_flops_per_token, flops_per_token

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

TEXT = {
    "model_type": "qwen3_5_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 120,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": True},
}


@pytest.mark.parametrize("extra", [{}, {"full_attention_interval": 3},
                                   {"layer_types": ["full_attention", "linear_attention"] * 4}])
def test_layer_layout_matches_transformers(extra):
    """Which layers are Gated DeltaNet: transformers' Qwen3_5TextConfig fills layer_types from
    full_attention_interval (default 4) when the config has none."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    cfg = {**TEXT, **extra}
    hf = Qwen3_5TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = model_from_config({"model_type": "qwen3_5", "text_config": cfg})
    kinds = ["linear_attention" if spec.groups[i].is_linear else "full_attention" for i in layer_group_order(spec)]
    assert kinds == hf.layer_types


@pytest.mark.torch
def test_image_text_config_loads_the_text_causal_lm():
    """AutoModelForCausalLM on a qwen3_5 (image-text) config builds Qwen3_5ForCausalLM from
    text_config alone: no vision tower, the text config's tie_word_embeddings (the outer one is
    ignored); ftplan's counts equal it category by category."""
    pytest.importorskip("torch")
    from transformers.models.qwen3_5 import Qwen3_5Config

    from ftplan.measure.accounting import params_by_category

    text = {**TEXT, "tie_word_embeddings": True}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    hf = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    real = F.meta_model(hf)
    assert type(real).__name__ == "Qwen3_5ForCausalLM"
    assert not any("visual" in n for n, _ in real.named_parameters())
    spec = model_from_config({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                              "text_config": text, "vision_config": vision, "tie_word_embeddings": False})
    assert spec.tie_word_embeddings
    assert spec.params.by_category() == params_by_category(real)


@pytest.mark.torch
def test_peft_all_linear_targets():
    """PEFT 0.21's all-linear wraps the DeltaNet's five projections and the gated attention's
    four, not the depthwise Conv1d (and never the lm_head)."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR
    from ftplan.job import LoraSpec
    from ftplan.job import lora_targets

    spec = model_from_config(TR.TINY_CONFIGS["qwen3_5"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(TR.TINY_CONFIGS["qwen3_5"], dtype="bf16"), r=4, alpha=8, dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj",
        "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.torch
@pytest.mark.parametrize("method,precision,batch,seq,ckpt", [
    ("full", "bf16-mixed", 1, 70, False),  # two chunks, padded to 128
    ("lora", "bf16-mixed", 2, 130, False),  # three chunks: the state S_1 saved in fp32, its copies
    ("full", "bf16", 1, 130, False),  # no autocast: the delta rule's matmuls in fp32 on the tensors
    ("lora", "bf16-mixed", 1, 70, True),
])
def test_saved_activations_over_several_chunks(method, precision, batch, seq, ckpt):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("qwen3_5", method, ckpt, batch, seq, precision=precision)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", False), ("peft", True)])
def test_qlora_exact(recipe, ckpt):
    """bitsandbytes nf4 on CPU. Under PEFT's kbit upcast the projections return fp32: the gate's
    sigmoid and beta are fp32, and q_norm's .float() is no copy, so it keeps a view of the whole
    [query | gate] projection."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora("qwen3_5", recipe, ckpt)


@pytest.mark.torch
@pytest.mark.parametrize("method", ["full", "lora"])
def test_eager_attention_exact(method):
    """Eager gated attention: the output's contiguous copy is what the gate multiplies."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("qwen3_5", method, False, 2, 24, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
def test_fp32_base_lora_exact():
    """An fp32 LoRA base under autocast: the conv weight's bf16 cast is saved with the layer (no
    leaf: autocast does not cache it), like the frozen projections' copies."""
    from test_memory_vs_torch import _check_fp32_base

    _check_fp32_base("qwen3_5")


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("lora", "selective"), ("full", "selective-attention"),
                                         ("lora", "every-k")])
def test_checkpointing_variants_exact(method, mode):
    """SAC caches the projections' mm outputs (the delta rule's matmuls are bmm); the attention
    kernel only in the full-attention layer; every-k over non-adjacent layer kinds."""
    pytest.importorskip("trl")
    F.check_checkpointing_variant("qwen3_5", method, mode)


def test_qwen3_5_27b_estimate():
    """The catalog's 27B: 48 Gated DeltaNet and 16 gated-attention layers; its delta rule is priced
    from the chunked form (164k FLOPs per token and value head at dk = dv = 128, C = 64); the answer
    bounds what the CUDA kernels would save less."""
    spec = get_model("qwen3.5-27b").spec()
    assert [g.count for g in spec.groups] == [48, 16] and spec.groups[0].is_linear
    la = spec.groups[0].linear_attention
    assert delta_rule_flops_per_token(la, 1024) == 48 * (64 * (5 * 128 + 3 * 128) + 6 * 128 * 128)
    # the sequence is padded to a multiple of the chunk: 1000 tokens cost the FLOPs of 1024
    assert delta_rule_flops_per_token(la, 1000) == pytest.approx(delta_rule_flops_per_token(la, 1024) * 1024 / 1000)
    job = Job(method="lora", micro_batch=1, seq_len=1024)
    f = flops_per_token(spec, job)
    attn = 16 * 2.0 * 512 * 24 * 512 + 48 * delta_rule_flops_per_token(la, 1024)
    assert f.attention == pytest.approx(attn)
    mem = estimate_memory(spec, job, Layout())
    assert any(n.startswith("Gated DeltaNet layers (48)") for n in mem.notes)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["qwen3.5-27b", "qwen3.5-4b"])
def test_tiny_config_of_the_catalog_entries(name):
    """``ftplan measure --tiny``: the DeltaNet shrinks too, one layer of each kind, mrope sections
    that fit the tiny head's rotary features; counts equal transformers' on meta."""
    pytest.importorskip("torch")
    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.hf import build_model

    tiny = tiny_config(get_model(name).config)
    spec = model_from_config(tiny)
    assert [g.is_linear for g in spec.groups] == [True, False]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = build_model(tiny, device="meta")
    assert spec.params.by_category() == params_by_category(real)


def test_text_model_counts_against_published_figures():
    """Qwen3.5-9B: the GGUF of the text model reports 8.95B parameters (untied lm_head; tied would
    be 7.94B). The 27B's and 4B's cards round the whole image-text checkpoint (vision tower
    included), which ftplan does not count: its text models are 26.90B and 4.21B."""
    assert round(get_model("qwen3.5-9b").spec().params.total / 1e9, 2) == 8.95
    assert get_model("qwen3.5-27b").spec().params.total == 26_895_998_464
    assert get_model("qwen3.5-4b").spec().params.total == 4_205_751_296


def test_exported_setup_asks_for_a_transformers_with_qwen3_5():
    """transformers' models/qwen3_5 first ships in 5.2.0 (the 5.1.0 wheel has none): the exported
    packages and train.py's install line ask for it; other families keep 5.0 (5.17 for TP loading)."""
    from ftplan.catalog.models import resolve_model
    from ftplan.export.script import render_train_script
    from ftplan.export.skypilot import setup_packages, transformers_floor
    from ftplan.job import Job, Layout

    assert "transformers>=5.2" in setup_packages(Job(method="lora"), "single", "qwen3_5")
    assert "transformers>=5.0" in setup_packages(Job(method="lora"), "single", "llama")
    assert transformers_floor("tp", "qwen3_5") == "5.17" and transformers_floor("fsdp") == "5.0"
    src = render_train_script(resolve_model("qwen3.5-4b"), Job(method="lora"), Layout(), model_ref="Qwen/Qwen3.5-4B")
    assert '"transformers>=5.2"' in src
