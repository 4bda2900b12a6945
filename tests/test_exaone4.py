"""LG EXAONE 4.0 (``exaone4``, ``Exaone4ForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

EXAONE 4.0 puts OLMo 2's post-norm layout (no norm before attention or MLP: q/k/v and gate/up read
the residual stream; RMSNorms on o_proj's and down_proj's outputs before each residual add) on
llama's RMSNorm and rope (cos/sin in the input's dtype, unlike OLMo's fp32 tables), with per-head
q/k RMSNorms (as qwen3's, applied after the head transpose) and no biases. ``layer_types`` mixes
sliding-window and full-attention layers (Exaone4Config's default: every
``sliding_window_pattern``-th layer full); with a window the full-attention layers are NoPE: their
q and k reach the kernel unrotated, in the projections' dtype (not promoted by the residual
stream's cos/sin under autocast), which is what ftplan's ``AttentionSpec.rope = False`` plans.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2 with s = 40 > the tiny window of 16, sdpa; SAC in
test_checkpointing_vs_torch) runs the tiny exaone4 from ``TINY_CONFIGS`` (sliding, sliding, full
NoPE); this file adds Exaone4Config's defaults, the layer layouts and counts on meta, PEFT's
targets, a config without a window (every layer rope, no mask), the refusals and the catalog
entries. Held by hand, out of CI for time (``benchmarks/families2_by_hand.py exaone4``, all
exact): eager attention, more layouts, QLoRA (PEFT's and TRL's recipes).
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


@pytest.mark.torch
def test_defaults_are_exaone4_config_defaults():
    """Every default ftplan fills in equals Exaone4Config's (head_dim is no field of it;
    layer_types None: __post_init__ fills it from the pattern), and a config.json naming only the
    model type builds transformers' parameters and layer layout."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model("exaone4")
    F.assert_defaults_are("exaone4", tfc, absent=("head_dim",), skip=("layer_types",))
    spec = model_from_config({"model_type": "exaone4"})
    assert spec.params.by_category() == F.meta_params({"model_type": "exaone4"})
    windows = [spec.groups[i].window for i in layer_group_order(spec)]
    assert windows == [4096 if t == "sliding_attention" else None for t in tfc.layer_types]


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {"num_hidden_layers": 7, "sliding_window_pattern": 3, "layer_types": None},
    {"layer_types": ["full_attention", "sliding_attention", "full_attention"], "tie_word_embeddings": True},
    {"sliding_window": None, "layer_types": ["full_attention"] * 3, "head_dim": 32},
])
def test_layouts_and_params_match_transformers(extra):
    """Windows per layer as Exaone4Config fills them, rope only on the sliding layers when there
    is a window (every layer without one), parameters as transformers builds them (head_dim: no
    Exaone4Config field, but Exaone4Attention reads it when config.json has it)."""
    from transformers import Exaone4Config

    import ftplan.measure.torchref as TR

    cfg = {k: v for k, v in {**TR.TINY_CONFIGS["exaone4"], **extra}.items() if v is not None or k == "sliding_window"}
    hf = Exaone4Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = model_from_config(cfg)
    groups = [spec.groups[i] for i in layer_group_order(spec)]
    assert [g.window for g in groups] == [hf.sliding_window if t == "sliding_attention" else None
                                          for t in hf.layer_types]
    assert [g.attention.rope for g in groups] == [hf.sliding_window is None or t == "sliding_attention"
                                                  for t in hf.layer_types]
    assert spec.params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("exaone4", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families2_by_hand.py exaone4``, out of CI for time: exact too)
_NO_WINDOW = {"sliding_window": None, "layer_types": ["full_attention"] * 3}
VARIANTS = [("lora", True, 2, 24, "sdpa", _NO_WINDOW)]  # every layer rope, no mask
VARIANTS_BY_HAND = [
    ("full", False, 2, 24, "eager", {}), ("lora", True, 1, 40, "eager", {}), ("full", True, 1, 40, "eager", {}),
    ("full", False, 2, 24, "sdpa", _NO_WINDOW), ("full", False, 2, 24, "eager", _NO_WINDOW),
    # a window but no sliding layer: every layer NoPE, no rope table saved
    ("full", False, 2, 24, "sdpa", {"layer_types": ["full_attention"] * 3}),
    ("lora", False, 1, 40, "sdpa", {"num_hidden_layers": 4, "layer_types": None, "sliding_window_pattern": 2}),
]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


def check_variant(method, ckpt, batch, seq, attn, extra):
    import ftplan.measure.torchref as TR
    from ftplan.memory import saved_activation_bytes
    from test_memory_vs_torch import _run

    cfg = {k: v for k, v in {**TR.TINY_CONFIGS["exaone4"], **extra}.items() if v is not None or k == "sliding_window"}
    spec, job, r, casts = _run("exaone4", method, ckpt, batch, seq, attn=attn, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


check_qlora = partial(F.check_qlora, "exaone4")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


@pytest.mark.parametrize("extra,msg", [
    ({"sliding_window": None, "layer_types": None}, "layer_types is required for exaone4 without a sliding_window"),
    ({"sliding_window_pattern": "LLLG", "layer_types": None}, "sliding_window_pattern='LLLG' without layer_types"),
])
def test_layouts_transformers_cannot_build_are_refused(extra, msg):
    """Exaone4Config fills layer_types only from an integer pattern and a window (a null window
    sets the pattern to 0 and divides by it; the checkpoints' "LLLG" string fails the modulo): such
    a config.json without layer_types is refused in one line."""
    import ftplan.measure.configs as CF

    with pytest.raises(ConfigError, match=msg) as e:
        model_from_config({**CF.TINY_CONFIGS["exaone4"], **extra})
    assert "\n" not in str(e.value)
