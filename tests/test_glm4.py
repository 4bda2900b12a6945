"""GLM-4-0414 dense (``glm4``, ``Glm4ForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

GLM-4-0414 puts four llama RMSNorms in each layer (input, ``post_self_attn_layernorm`` on o_proj's
output, ``post_attention_layernorm`` before the MLP, ``post_mlp_layernorm`` on down_proj's output:
gemma2's sandwich with llama's norm, ``norms_per_layer=4``), q/k/v biases (``attention_bias``,
default on; o_proj none), phi3's fused ``gate_up_proj`` (``up * act(gate)`` of its two chunks) and a
partial rotary (Glm4Config's default factor 0.5) applied GLM-style: each layer builds interleaved
copies of the shared cos/sin (``cos[..., :w/2].repeat_interleave(2)``, ``(1, 1, s, w)`` in the
residual stream's dtype) which the rotary muls save, as ernie4_5's fp32 ones
(``rope_interleave_tables``; the width is the rotary one here), and q/k's rotated and passed-through
halves are concatenated (glm4_moe's head-major q).

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny glm4 from
``TINY_CONFIGS``; this file adds Glm4Config's defaults and counts on meta, PEFT's targets, one
variant (a quarter rotary, no biases, tied) and the catalog entries. Held by hand, out of CI for
time (``benchmarks/families3_by_hand.py glm4``, all exact): eager attention, a full rotary, more
variants, QLoRA (PEFT's and TRL's recipes).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.model import FAMILIES, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
def test_defaults_are_glm4_config_defaults():
    """Every default ftplan fills in equals Glm4Config's (the rotary share: its
    rope_parameters' 0.5), and a config.json naming only the model type builds transformers'
    parameters."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model("glm4")
    F.assert_defaults_are("glm4", tfc)
    assert tfc.rope_parameters["partial_rotary_factor"] == FAMILIES["glm4"].partial_rotary_factor
    spec = model_from_config({"model_type": "glm4"})
    assert spec.params.by_category() == F.meta_params({"model_type": "glm4"})
    assert spec.attention.rotary_dim == 64 and spec.groups[0].norms_per_layer == 4


@pytest.mark.torch
@pytest.mark.parametrize("extra", [{"attention_bias": False, "tie_word_embeddings": True},
                                   {"num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 1.0}])
def test_params_match_transformers_on_meta(extra):
    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["glm4"], **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("glm4", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"])


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families3_by_hand.py glm4``, out of CI for time: exact too)
_QUARTER = {"partial_rotary_factor": 0.25, "attention_bias": False, "tie_word_embeddings": True}
_FULL_ROPE = {"partial_rotary_factor": 1.0}
VARIANTS = [("full", True, 2, 24, "sdpa", _QUARTER)]
VARIANTS_BY_HAND = [
    ("full", False, 2, 24, "eager", {}), ("lora", True, 1, 40, "eager", {}), ("lora", False, 2, 24, "eager", {}),
    ("full", False, 1, 40, "sdpa", _FULL_ROPE), ("lora", False, 2, 24, "sdpa", _FULL_ROPE),
    ("full", True, 2, 24, "eager", _FULL_ROPE), ("lora", False, 1, 40, "sdpa", _QUARTER),
    ("full", False, 2, 24, "sdpa", {"num_key_value_heads": 1, "head_dim": 32}),
]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, "glm4")
check_qlora = partial(F.check_qlora, "glm4")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)
