"""DeepSeek-V2 (``deepseek_v2``, ``DeepseekV2ForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

DeepSeek-V2 is DeepSeek-V3's MLA attention (q_lora_rank null: one q_proj, as V2-Lite; kv_a_proj_with_mqa,
kv_a_layernorm, kv_b_proj) with a complex rope: ``apply_rotary_emb`` multiplies ``view_as_complex`` of
fp32 copies of q_pe / k_pe by one shared complex64 ``freqs_cis`` table ``(1, s, d / 2)`` and casts the
result back, so the rotary muls keep that table (4 bytes per position and rotary feature, where
DeepSeek-V3 keeps cos and sin in the residual stream's dtype) and q / k stay in the projections'
dtype. The MoE block is DeepSeek-V3's layout (fused experts, the shared experts fused into one MLP,
the first ``first_k_dense_replace`` layers dense) behind DeepSeek-V2's router: an fp32 linear through
the fp32 ``gate.weight`` (autocast turns it back to the compute dtype), an fp32 softmax, top-k of the
probabilities (``greedy``) or of those left in the ``topk_group`` best of ``n_group`` groups
(``group_limited_greedy``: a ``masked_fill`` whose bool mask is kept), never renormalised
(``norm_topk_prob`` is not read), times ``routed_scaling_factor``. transformers maps deepseek_v2 onto
qwen2_moe's conversions, so PEFT's ``all-linear`` wraps the experts and the router.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny deepseek_v2
from ``TINY_CONFIGS``; this file adds DeepseekV2Config's defaults, counts on meta, PEFT's targets, the
group-limited router with a q LoRA rank and biases, and the refusals. Held by hand, out of CI for
time (``benchmarks/families4_by_hand.py deepseek_v2``, all exact): eager attention, more variants,
QLoRA (PEFT's and TRL's recipes) and the 2-rank gloo expert-parallel run.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, lora_wraps_experts, validate_job
from ftplan.model import FAMILIES, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

FAMILY = "deepseek_v2"
#: DeepSeek-V2 (236B)'s router and attention shape, shrunk: 4 groups of 2 experts, the best 2 groups,
#: a q LoRA rank; biases on the attention and MLP projections
_GROUPED = {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "q_lora_rank": 32,
            "attention_bias": True, "mlp_bias": True}


@pytest.mark.torch
def test_defaults_are_deepseek_v2_config_defaults():
    """Every default ftplan fills in equals DeepseekV2Config's (head_dim: __post_init__ sets it to
    qk_rope_head_dim; num_experts_per_tok None builds no router: ftplan says so)."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model(FAMILY)
    # (num_key_value_heads None: __post_init__ fills in num_attention_heads)
    F.assert_defaults_are(FAMILY, tfc, skip=("head_dim", "num_key_value_heads"))
    assert tfc.head_dim == tfc.qk_rope_head_dim and FAMILIES[FAMILY].defaults["head_dim"] is None
    with pytest.raises(ConfigError, match="num_experts_per_tok must be an integer"):
        model_from_config({"model_type": FAMILY})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [_GROUPED, {"tie_word_embeddings": True, "first_k_dense_replace": 0}])
def test_params_match_transformers(extra):
    """q_a_proj / q_a_layernorm / q_b_proj with a q LoRA rank; attention_bias on q_a, kv_a and o;
    mlp_bias on the dense MLP and the shared experts; tied embeddings."""
    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS[FAMILY], **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_wraps_the_experts_and_the_router():
    """all-linear: the MLA projections as LoRA linears; the fused experts and the fp32 router through
    ParamWrapper; the dense first layer's MLP and the shared experts not adapted."""
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    import ftplan.measure.torchref as TR

    _check_peft_all_linear(FAMILY, ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"])
    names = F.peft_all_linear_trainables(TR.TINY_CONFIGS[FAMILY])
    F.assert_wraps_experts_and_router(names)
    assert not any("shared_experts" in n or "layers.0.mlp" in n for n in names)
    assert lora_wraps_experts(model_from_config(TR.TINY_CONFIGS[FAMILY]), LoraSpec())


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families4_by_hand.py deepseek_v2``, out of CI for time: exact too)
VARIANTS = [("full", False, 2, 24, "sdpa", _GROUPED)]
VARIANTS_BY_HAND = [("full", False, 2, 24, "eager", {}), ("lora", True, 2, 24, "eager", {}),
                    ("full", True, 1, 40, "eager", {}), ("lora", False, 2, 24, "eager", {}),
                    ("lora", False, 1, 40, "sdpa", _GROUPED), ("full", True, 2, 24, "sdpa", _GROUPED),
                    ("lora", True, 2, 24, "eager", _GROUPED),
                    ("full", False, 2, 24, "sdpa", {"routed_scaling_factor": 1.0, "n_shared_experts": 1}),
                    # DeepSeek-V2-Lite's yarn rope (the table scaled by its attention factor, same shape)
                    ("lora", False, 1, 40, "sdpa", {"rope_scaling": {
                        "type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                        "mscale_all_dim": 0.707, "original_max_position_embeddings": 16}})]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, FAMILY)
check_qlora = partial(F.check_moe_qlora, FAMILY)

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


def test_refusals_and_layouts():
    """What transformers' DeepseekV2TopkRouter cannot run (another topk_method, a group-limited
    router without groups) and a moe_layer_freq it ignores are refused in one line; expert
    parallelism is planned (DeepseekV2Config has a base_model_ep_plan; held on 2 gloo ranks by hand)."""
    import ftplan.measure.configs as CF

    cfg = CF.TINY_CONFIGS[FAMILY]
    F.assert_refused(cfg, [({"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),
                           ({"topk_method": "group_limited_greedy"}, "needs integer n_group and topk_group"),
                           ({"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1},
                            "n_group=3 must divide the 8 experts"),
                           ({"moe_layer_freq": 2},
                            "moe_layer_freq=2: transformers' DeepseekV2DecoderLayer ignores it")])
    spec = model_from_config(cfg)
    validate_job(spec, Job(method="full"), Layout(2, 1, "fsdp", ep=2))
    # LoRA on the experts under EP does not run (tests/test_ep_lora.py): refused; the attention runs
    with pytest.raises(ConfigError, match="with expert parallelism"):
        validate_job(spec, Job(method="lora", lora=LoraSpec(dropout=0.0)), Layout(4, 1, "fsdp", ep=4))
    attention = ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")  # (q_lora_rank null: one q_proj)
    validate_job(spec, Job(method="lora", lora=LoraSpec(dropout=0.0, target_modules=attention)),
                 Layout(4, 1, "fsdp", ep=4))


def test_catalog_entry_against_the_model_card():
    """DeepSeek-V2-Lite(-Chat): 'DeepSeek-V2-Lite has 15.7B parameters in total and 2.4B activated'
    (the meta build of transformers 5.24: 15,706,484,224, tests/test_model_params.py per category)."""
    from ftplan.catalog.models import get_model

    p = get_model("deepseek-ai/DeepSeek-V2-Lite-Chat").spec().params
    assert p.total == 15_706_484_224 and round(p.total / 1e9, 1) == 15.7
    assert 2.4 <= (p.active - p.embedding) / 1e9 < 2.5  # 2.45B without the input embedding
