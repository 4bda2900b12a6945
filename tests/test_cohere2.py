"""Cohere Command R7B / Command A (``cohere2``, ``Cohere2ForCausalLM``) against transformers 5.24 /
PEFT 0.21.2 on CPU.

Cohere2's decoder layer is a parallel block: one Cohere2LayerNorm (mean-centred in fp32, a weight and
no bias: ``x - mean`` kept twice, by ``pow(2)`` and by the product with the fp32 rsqrt, and with a
trainable weight the normalised tensor) feeds both the attention and the MLP, and ``residual +
attn + mlp`` closes it, so q/k/v and gate/up read one tensor (one norm per layer, ftplan's
``Family.parallel_block``; the first layer's gate/up read the grad-free layer input like q/k/v do).
layer_types mixes sliding-window and full-attention layers (default: every
``sliding_window_pattern``-th layer full, 4); only the sliding layers rotate q and k (fp32 copies
over interleaved cos/sin tables in the residual stream's dtype, cast back), the full-attention layers
are NoPE. q/k/v/o share ``attention_bias``; head_dim is hidden // heads unless config.json gives one
(Cohere2Config's ``__post_init__`` sets the quotient, then its kwargs override it); the logits are multiplied by ``logit_scale`` (a tensor-by-scalar mul: nothing saved);
tied embeddings by default.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2 with s = 40 > the tiny window of 16, sdpa; SAC in
test_checkpointing_vs_torch) runs the tiny cohere2 from ``TINY_CONFIGS``; this file adds
Cohere2Config's defaults, the layouts and counts on meta, PEFT's targets, one more layout and the
refusal. Held by hand, out of CI for time (``benchmarks/families4_by_hand.py cohere2``, all exact):
eager attention, more layouts, QLoRA (PEFT's and TRL's recipes).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.model import layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

FAMILY = "cohere2"


@pytest.mark.torch
def test_defaults_are_cohere2_config_defaults():
    """Every default ftplan fills in equals Cohere2Config's (layer_types None: __post_init__ fills
    it from the pattern), and a config.json naming only the model type builds transformers'
    parameters and layer layout."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model(FAMILY)
    F.assert_defaults_are(FAMILY, tfc, skip=("layer_types", "num_key_value_heads", "head_dim"))  # (__post_init__'s)
    spec = model_from_config({"model_type": FAMILY})
    assert spec.params.by_category() == F.meta_params({"model_type": FAMILY})
    groups = [spec.groups[i] for i in layer_group_order(spec)]
    assert [g.window for g in groups] == [4096 if t == "sliding_attention" else None for t in tfc.layer_types]


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {"num_hidden_layers": 8, "sliding_window_pattern": 4, "attention_bias": False, "head_dim": 32},
    {"layer_types": ["full_attention", "sliding_attention", "sliding_attention"], "tie_word_embeddings": False},
])
def test_layouts_and_params_match_transformers(extra):
    """Windows per layer as Cohere2Config fills them, the rope only on the sliding layers,
    parameters as transformers builds them (config.json's head_dim read: 32 != 64 / 4)."""
    from transformers import Cohere2Config

    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS[FAMILY], **extra}
    hf = Cohere2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = model_from_config(cfg)
    groups = [spec.groups[i] for i in layer_group_order(spec)]
    assert [g.window for g in groups] == [hf.sliding_window if t == "sliding_attention" else None
                                          for t in hf.layer_types]
    assert [g.attention.rope for g in groups] == [t == "sliding_attention" for t in hf.layer_types]
    assert spec.params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear(FAMILY, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families4_by_hand.py cohere2``, out of CI for time: exact too)
_FULL_FIRST = {"layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
               "attention_bias": False, "num_key_value_heads": 4}  # layer 0 NoPE, no GQA
VARIANTS = [("lora", False, 1, 40, "sdpa", _FULL_FIRST)]
VARIANTS_BY_HAND = [
    ("full", False, 2, 24, "eager", {}), ("lora", True, 1, 40, "eager", {}), ("full", True, 1, 40, "eager", {}),
    ("lora", False, 2, 24, "eager", {}), ("full", False, 2, 24, "sdpa", _FULL_FIRST),
    ("full", True, 1, 40, "eager", _FULL_FIRST),
    ("lora", False, 2, 24, "sdpa", {"num_hidden_layers": 4, "sliding_window_pattern": 2, "tie_word_embeddings": False}),
    ("full", False, 2, 24, "sdpa", {"head_dim": 32}), ("lora", True, 2, 24, "eager", {"head_dim": 32}),
]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, FAMILY)
check_qlora = partial(F.check_qlora, FAMILY)

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


@pytest.mark.parametrize("window", [None, 0])
def test_a_config_without_a_window_is_refused(window):
    """Cohere2Model builds its sliding-window mask every forward: without a window transformers
    fails (checked by hand), so ftplan refuses such a config.json in one line."""
    import ftplan.measure.configs as CF

    with pytest.raises(ConfigError, match="sliding_window is null") as e:
        model_from_config({**CF.TINY_CONFIGS[FAMILY], "sliding_window": window})
    assert "\n" not in str(e.value)
