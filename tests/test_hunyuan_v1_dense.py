"""Tencent Hunyuan dense (``hunyuan_v1_dense``, ``HunYuanDenseV1ForCausalLM``) against transformers 5.24
/ PEFT 0.21.2 on CPU.

Hunyuan dense is llama's decoder with ``attention_bias`` on q/k/v and o_proj and per-head q/k
RMSNorms (``query_layernorm`` / ``key_layernorm``) applied *after* the rotary embedding, where
qwen3 applies them before it: the norms read q/k in the rope's output dtype (under HF Trainer's
autocast with fp32 weights, fp32: the projections' bf16 promoted by the residual stream's cos/sin),
so with trainable norm weights the normalised tensors they keep for the weight's gradient are fp32
(``Family.qk_norm_after_rope``; without it the tiny full step is 18,432 B off). The checkpoints'
"dynamic" rope with a fixed alpha is transformers' NTK-alpha base: the same tables' shape.
HunYuanDenseV1Config's head_dim default is None, which the attention uses as its width
(transformers fails), so a config.json without head_dim is refused.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny
hunyuan_v1_dense from ``TINY_CONFIGS``; this file adds the config class's defaults, counts on
meta, PEFT's targets, the refusal and a variant without biases. Held by hand, out of CI for time
(``benchmarks/families2_by_hand.py hunyuan_v1_dense``, all exact): eager attention and QLoRA
(PEFT's and TRL's recipes). No catalog entry: no verbatim config.json of a Hunyuan dense checkpoint
was looked for in the time left.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
def test_defaults_and_the_head_dim_refusal():
    """Every default ftplan fills in equals HunYuanDenseV1Config's; its own defaults build no
    model (head_dim None is the attention's width: transformers fails), and ftplan says so in one
    line; with head_dim given, the default shape's parameters are transformers'."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("hunyuan_v1_dense", AutoConfig.for_model("hunyuan_v1_dense"), absent=("sliding_window",),
                          kv_heads_are_heads=True)
    with pytest.raises(ConfigError, match="head_dim is required for hunyuan_v1_dense") as e:
        model_from_config({"model_type": "hunyuan_v1_dense"})
    assert "\n" not in str(e.value)
    cfg = {"model_type": "hunyuan_v1_dense", "head_dim": 128}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
@pytest.mark.parametrize("extra", [{"attention_bias": False, "tie_word_embeddings": True},
                                   {"head_dim": 32, "num_key_value_heads": 1}])
def test_params_match_transformers_on_meta(extra):
    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["hunyuan_v1_dense"], **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("hunyuan_v1_dense",
                           ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families2_by_hand.py hunyuan_v1_dense``, out of CI for time: exact too)
VARIANTS = [("full", True, 1, 40, "sdpa", {"attention_bias": False, "head_dim": 32})]
VARIANTS_BY_HAND = [("full", False, 2, 24, "eager", {}), ("lora", True, 1, 40, "eager", {}),
                    ("lora", False, 2, 24, "sdpa", {"attention_bias": False, "head_dim": 32})]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, "hunyuan_v1_dense")
check_qlora = partial(F.check_qlora, "hunyuan_v1_dense")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)
