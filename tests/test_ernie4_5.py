"""Baidu ERNIE 4.5 dense (``ernie4_5``, ``Ernie4_5ForCausalLM``) against transformers 5.24 on CPU.

llama's layers with one ``use_bias`` switch for every projection and a GLM-style rope in full
precision: the rotary embedding returns fp32 cos/sin, and each layer rotates ``q.float()`` /
``k.float()`` with its own ``repeat_interleave`` copies of the tables (``(1, 1, s, d)`` fp32 each,
saved by the rotary muls) before casting back. Without checkpointing the shared tables are saved by
no one; with it the recompute closures keep them.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny ernie4_5
(biased, head_dim 32) from ``TINY_CONFIGS``; this file adds Ernie4_5Config's defaults, the
parameter counts on meta, PEFT's all-linear targets, eager attention, SAC / every-k with LoRA,
QLoRA, an fp32 LoRA base and the catalog entry.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.memory import activation_parts, saved_activation_bytes
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

SMALL = {"model_type": "ernie4_5", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 120,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [
    {"model_type": "ernie4_5"},  # Ernie4_5Config's defaults: the 0.3B shape
    {**SMALL, "use_bias": True}, {**SMALL, "tie_word_embeddings": False},
])
def test_defaults_and_params_match_transformers(cfg):
    """Every default ftplan fills in equals Ernie4_5Config's; use_bias puts a bias on q/k/v/o and
    gate/up/down; the counts equal transformers' on meta."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("ernie4_5", AutoConfig.for_model("ernie4_5"))
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("ernie4_5", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq", [("full", False, 2, 24), ("lora", True, 1, 40)])
def test_eager_attention_exact(method, ckpt, batch, seq):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("ernie4_5", method, ckpt, batch, seq, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
def test_rope_tables_per_layer():
    """Without checkpointing each layer saves its two interleaved fp32 tables and nobody the shared
    ones; with it the closures hold the shared pair (one (1, s, d) fp32 each)."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("ernie4_5", "lora", False, 2, 24)
    tables = [x for x in r.records if x.shape == (1, 1, 24, 32) and x.dtype.endswith("float32")]
    assert len(tables) == 2 * 2 and sum(x.nbytes for x in tables) == 2 * 2 * 24 * 32 * 4
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    ck = job.with_(gradient_checkpointing=True)
    assert activation_parts(spec, ck, backend="cpu").model_level_bytes >= 2 * 24 * 32 * 4


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("lora", "selective"), ("lora", "every-k")])
def test_checkpointing_variants_exact(method, mode):
    pytest.importorskip("trl")
    F.check_checkpointing_variant("ernie4_5", method, mode)


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", True)])
def test_qlora_exact(recipe, ckpt):
    """bitsandbytes nf4: q/k come out of Linear4bit in fp32 under PEFT's kbit upcast, where
    ``q.float()`` is no copy."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora("ernie4_5", recipe, ckpt)


@pytest.mark.torch
def test_fp32_base_lora_exact():
    from test_memory_vs_torch import _check_fp32_base

    _check_fp32_base("ernie4_5")


def test_catalog_count_and_template():
    """ERNIE-4.5-0.3B: tied, 18 layers, GQA 16 / 2 of 128; 360,748,032 parameters (0.36B)."""
    from ftplan.export.llamafactory import template_for

    spec = get_model("ernie-4.5-0.3b").spec()
    assert spec.params.total == 360_748_032 and spec.tie_word_embeddings
    assert get_model("baidu/ERNIE-4.5-0.3B-PT").name == "ernie-4.5-0.3b"
    assert template_for(spec) == "ernie_nothink"
