"""rednote dots.llm1 (``dots1``, ``Dots1ForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

dots.llm1 is qwen3's attention (per-head q/k RMSNorms; ``attention_bias`` on q/k/v and o_proj) on
DeepSeek-V3's MoE block verbatim (``Dots1TopkRouter`` is ``DeepseekV3TopkRouter``: fp32 router weight
and logits, sigmoid scores plus the ``e_score_correction_bias`` buffer, group-limited top-k,
renormalised with ``norm_topk_prob``, times ``routed_scaling_factor``; fused experts of
``moe_intermediate_size``; a shared expert MLP of ``n_shared_experts x moe_intermediate_size``; the
first ``first_k_dense_replace`` layers dense): glm4_moe's layout with its q/k norms on, a full
rotary and o_proj biased with the rest. Windows: layers from ``max_window_layers`` on slide when
``sliding_window`` is set (no ``use_sliding_window`` switch), or ``layer_types``. transformers maps
dots1 onto qwen2_moe's conversions, so PEFT's ``all-linear`` wraps the experts and the router and
adapts neither the dense MLP nor the shared experts.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny dots1 from
``TINY_CONFIGS``; this file adds Dots1Config's defaults, layouts and counts on meta, PEFT's targets,
a windowed variant, the refusals and expert parallelism planned. Held by hand, out of CI for time
(``benchmarks/families2_by_hand.py dots1``, all exact): eager attention, more variants, QLoRA (PEFT's
and TRL's recipes) and the 2-rank gloo expert-parallel run. No catalog entry: no verbatim
config.json of a dots.llm1 checkpoint was found.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import LoraSpec, lora_wraps_experts
from ftplan.model import layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
def test_defaults_are_dots1_config_defaults():
    """Every default ftplan fills in equals Dots1Config's (head_dim: no field; layer_types None:
    __post_init__ fills it from max_window_layers). Dots1Config's own defaults build no model
    (n_routed_experts, num_experts_per_tok and n_shared_experts are None): ftplan says so."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("dots1", AutoConfig.for_model("dots1"), absent=("head_dim",), skip=("layer_types",))
    with pytest.raises(ConfigError, match="n_routed_experts must be an integer"):
        model_from_config({"model_type": "dots1"})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {"attention_bias": True, "tie_word_embeddings": True, "first_k_dense_replace": 0},
    {"n_shared_experts": 2, "head_dim": 32, "sliding_window": 16, "max_window_layers": 1},
    {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
])
def test_layouts_and_params_match_transformers(extra):
    """attention_bias on q/k/v and o_proj; windows per layer as Dots1Config fills them."""
    from transformers import Dots1Config

    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["dots1"], **extra}
    hf = Dots1Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = model_from_config(cfg)
    assert [spec.groups[i].window for i in layer_group_order(spec)] == [
        hf.sliding_window if t == "sliding_attention" else None for t in hf.layer_types]
    assert spec.params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_wraps_the_experts_and_the_router():
    """all-linear: q/k/v/o as LoRA linears; the fused experts and the fp32 router through
    ParamWrapper; the dense first layer's MLP and the shared experts not adapted."""
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    import ftplan.measure.torchref as TR

    _check_peft_all_linear("dots1", ["q_proj", "k_proj", "v_proj", "o_proj"])
    names = F.peft_all_linear_trainables(TR.TINY_CONFIGS["dots1"])
    F.assert_wraps_experts_and_router(names)
    assert not any("shared_experts" in n or "layers.0.mlp" in n for n in names)
    assert lora_wraps_experts(model_from_config(TR.TINY_CONFIGS["dots1"]), LoraSpec())


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families2_by_hand.py dots1``, out of CI for time: exact too)
_WINDOW = {"sliding_window": 16, "max_window_layers": 1, "attention_bias": True}  # layers 1-2 slide
VARIANTS = [("full", False, 1, 40, "sdpa", _WINDOW),
            # no renormalisation (Dots1Config's default): the router keeps no top-k sum / quotient
            ("full", False, 2, 24, "sdpa", {"norm_topk_prob": False})]
VARIANTS_BY_HAND = [("lora", True, 2, 24, "eager", {}), ("full", False, 2, 24, "eager", {}),
                    ("lora", False, 1, 40, "sdpa", _WINDOW), ("full", True, 1, 40, "eager", _WINDOW),
                    ("full", False, 2, 24, "sdpa", {"n_group": 1, "topk_group": 1}),
                    ("lora", False, 2, 24, "sdpa", {"norm_topk_prob": False}),
                    ("full", True, 1, 40, "sdpa", {"norm_topk_prob": False})]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, "dots1")
check_qlora = partial(F.check_moe_qlora, "dots1")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


def test_refusals_and_layouts():
    """A null n_shared_experts (Dots1MoE multiplies by it) or n_group / topk_group (the router
    divides by them; transformers 5.24 fails on both, checked by hand) is refused in one line;
    expert parallelism is planned (Dots1Config has a base_model_ep_plan)."""
    import ftplan.measure.configs as CF

    cfg = CF.TINY_CONFIGS["dots1"]
    F.assert_refused(cfg, [({"n_shared_experts": None}, "n_shared_experts must be an integer"),
                           ({"n_group": None}, "n_group is null: transformers' Dots1TopkRouter divides by it")])
    spec = model_from_config(cfg)
    F.validate_ep_layouts(spec)
