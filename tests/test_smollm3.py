"""SmolLM3 (``smollm3``) against transformers 5.24 on CPU.

SmolLM3 is llama's decoder with NoPE layers: ``no_rope_layers[i] == 0`` (or, without the list,
every ``no_rope_layer_interval``-th layer) skips the rotary embedding. The generic grid (model
states, saved activations under autocast and pure bf16, full and LoRA, checkpointing on/off, SAC)
runs the tiny smollm3 (layer 1 of 3 NoPE) from ``TINY_CONFIGS``; this file holds the layout
against SmolLM3Config, the optional sliding windows (``use_sliding_window``: the NoPE layers slide),
eager attention, the checkpointing variants, QLoRA, an fp32 LoRA base and the catalog entry.

A NoPE layer saves what a RoPE layer saves (q and k reach the kernel as views of the projections
instead of the rotated copies: the same bytes); only the shared cos/sin tables depend on rope
layers existing at all.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.errors import ConfigError
from ftplan.memory import saved_activation_bytes
from ftplan.model import layer_group_order, model_from_config, nope_layer_count

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 120,
         "num_hidden_layers": 6, "vocab_size": 512, "pad_token_id": None}


@pytest.mark.torch
def test_defaults_are_the_config_class_defaults():
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from ftplan.measure.torchref import params_by_category

    tfc = AutoConfig.for_model("smollm3")
    F.assert_defaults_are("smollm3", tfc, absent=("head_dim",))
    real = F.meta_model(tfc)
    spec = model_from_config({"model_type": "smollm3"})
    assert spec.params.by_category() == params_by_category(real)
    assert spec.tie_word_embeddings and nope_layer_count(spec) == 9


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {}, {"no_rope_layer_interval": 2}, {"no_rope_layers": [1, 0, 0, 1, 1, 0]},
    {"use_sliding_window": True, "sliding_window": 16},
    {"use_sliding_window": True, "sliding_window": 16, "no_rope_layer_interval": 3},
    {"use_sliding_window": False, "sliding_window": 16},  # a window only with use_sliding_window
])
def test_layout_matches_transformers(extra):
    """NoPE layers and windows as SmolLM3Config derives them: the NoPE layers are the sliding ones
    when use_sliding_window is set (layer_types), and each attention's sliding_window."""
    from transformers.models.smollm3 import SmolLM3Config

    cfg = {**SMALL, **extra}
    hf = SmolLM3Config(**cfg)
    spec = model_from_config({"model_type": "smollm3", **cfg})
    assert nope_layer_count(spec) == hf.no_rope_layers.count(0)
    windows = [spec.groups[i].window for i in layer_group_order(spec)]
    want = [hf.sliding_window if hf.use_sliding_window and t == "sliding_attention" else None for t in hf.layer_types]
    assert windows == want


def test_bad_no_rope_layers_is_one_config_error():
    with pytest.raises(ConfigError, match="no_rope_layers must be a list of 6 entries"):
        model_from_config({"model_type": "smollm3", **SMALL, "no_rope_layers": [1, 0]})


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq,attn", [
    ("full", False, 2, 24, "eager"), ("lora", True, 1, 40, "eager"),
    ("lora", False, 1, 40, "sdpa"), ("full", True, 2, 24, "sdpa")])
def test_sliding_nope_layers_exact(method, ckpt, batch, seq, attn):
    """use_sliding_window: the NoPE layer slides (16-token window, s = 40 masks it); eager."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    cfg = {**TR.TINY_CONFIGS["smollm3"], "use_sliding_window": True, "sliding_window": 16}
    spec = model_from_config(cfg)
    assert [spec.groups[i].window for i in layer_group_order(spec)] == [None, 16, None]
    spec, job, r, casts = _run("smollm3", method, ckpt, batch, seq, attn=attn, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt", [("full", False), ("lora", True)])
def test_saved_activations_exact_eager(method, ckpt):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("smollm3", method, ckpt, 2, 24, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("lora", "selective"), ("full", "selective-attention"),
                                         ("lora", "every-k")])
def test_checkpointing_variants_exact(method, mode):
    pytest.importorskip("trl")
    F.check_checkpointing_variant("smollm3", method, mode)


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", True)])
def test_qlora_exact(recipe, ckpt):
    pytest.importorskip("bitsandbytes")
    F.check_qlora("smollm3", recipe, ckpt)


@pytest.mark.torch
def test_fp32_base_lora_exact():
    from test_memory_vs_torch import _check_fp32_base

    _check_fp32_base("smollm3")


@pytest.mark.torch
def test_tiny_config_of_the_catalog_entry():
    """``ftplan measure --tiny``: one RoPE and one NoPE layer, tied, its counts equal transformers'
    on meta (SmolLM3Config's pad_token_id 128004 would not fit the tiny vocabulary: dropped)."""
    pytest.importorskip("torch")
    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.hf import build_model

    tiny = tiny_config(get_model("smollm3-3b").config)
    assert tiny["no_rope_layers"] == [1, 0] and tiny["pad_token_id"] is None
    spec = model_from_config(tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = build_model(tiny, device="meta")
    assert spec.params.by_category() == params_by_category(real)
    assert nope_layer_count(spec) == 1


def test_catalog_count():
    """SmolLM3-3B: tied embeddings (326 tensors in the checkpoint), 9 NoPE layers of 36;
    3,075,098,624 parameters (card: 3B; blog: 3.08B)."""
    spec = get_model("smollm3-3b").spec()
    assert spec.params.total == 3_075_098_624
    assert spec.tie_word_embeddings and nope_layer_count(spec) == 9
    assert all(g.window is None for g in spec.groups)
