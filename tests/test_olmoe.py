"""AllenAI OLMoE (``olmoe``, ``OlmoeForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

OLMoE is llama's pre-norm decoder (llama's RMSNorm and rope, unlike OLMo 2's post-norms and fp32
tables) with q/k RMSNorms over the whole q / k projection (olmo2's ``qk_norm_whole``: one fp32
rsqrt per token), and in every layer qwen3_moe's sparse block: an fp32-softmax top-k router,
renormalised only with ``norm_topk_prob`` (false in the checkpoints), and fused 3-D experts of
``intermediate_size`` (no shared expert). transformers maps olmoe's weight conversions onto
qwen2_moe's, so PEFT's ``all-linear`` wraps the experts and the router (ParamWrapper).

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny olmoe from
``TINY_CONFIGS``; this file adds OlmoeConfig's defaults and counts on meta, PEFT's targets, a
renormalised router with biases, the refusals, expert parallelism planned, and the catalog entries.
Held by hand, out of CI for time (``benchmarks/families2_by_hand.py olmoe``, all exact): eager
attention, more router / checkpointing variants, QLoRA (PEFT's and TRL's recipes) and the 2-rank
gloo expert-parallel run (transformers' EP engine, as tests/test_expert_parallel.py).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.job import LoraSpec, lora_wraps_experts
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
def test_defaults_are_olmoe_config_defaults():
    """Every default ftplan fills in equals OlmoeConfig's (head_dim and sliding_window are no
    fields of it), and a config.json naming only the model type builds transformers' parameters."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("olmoe", AutoConfig.for_model("olmoe"), absent=("head_dim", "sliding_window"),
                          kv_heads_are_heads=True)
    assert model_from_config({"model_type": "olmoe"}).params.by_category() == F.meta_params({"model_type": "olmoe"})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [{"attention_bias": True, "tie_word_embeddings": True},
                                   {"num_key_value_heads": 1, "num_experts": 6, "num_experts_per_tok": 3}])
def test_params_match_transformers_on_meta(extra):
    """attention_bias puts a bias on q/k/v and o_proj; the k norm spans kv_heads x head_dim."""
    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["olmoe"], **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_wraps_the_experts_and_the_router():
    """all-linear: q/k/v/o as LoRA linears, the fused experts and the router weight through
    ParamWrapper (transformers maps olmoe onto qwen2_moe's conversions, which PEFT follows)."""
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    import ftplan.measure.torchref as TR

    _check_peft_all_linear("olmoe", ["q_proj", "k_proj", "v_proj", "o_proj"])
    F.assert_wraps_experts_and_router(F.peft_all_linear_trainables(TR.TINY_CONFIGS["olmoe"]))
    assert lora_wraps_experts(model_from_config(TR.TINY_CONFIGS["olmoe"]), LoraSpec())


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families2_by_hand.py olmoe``, out of CI for time: exact too)
VARIANTS = [
    # a renormalised router (norm_topk_prob: the top-k sum and quotient saved) with biases
    ("full", False, 2, 24, "sdpa", {"norm_topk_prob": True, "attention_bias": True}),
]
VARIANTS_BY_HAND = [("lora", True, 1, 40, "eager", {}), ("full", True, 2, 24, "eager", {"norm_topk_prob": True}),
                    ("lora", False, 2, 24, "sdpa", {"norm_topk_prob": True, "attention_bias": True})]
#: QLoRA (recipe, checkpointing) cases held by hand (bitsandbytes quantizes q/k/v/o; the router
#: weight and the fused experts stay unquantized and ParamWrapper adapts them, without dropout)
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, "olmoe")
check_qlora = partial(F.check_moe_qlora, "olmoe")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


def test_refusals_and_layouts():
    """clip_qkv (in-place clamps, unmodelled; null in the checkpoints) and a head_dim that does not
    tile hidden_size (transformers fails) are refused in one line; expert parallelism is planned
    (OlmoeConfig has a base_model_ep_plan)."""
    import ftplan.measure.configs as CF

    cfg = CF.TINY_CONFIGS["olmoe"]
    F.assert_refused(cfg, [({"clip_qkv": 8.0}, "clip_qkv=8.0 is not planned"),
                           ({"head_dim": 32}, "head_dim=32 x 4 heads != hidden_size=64")])
    F.validate_ep_layouts(model_from_config(cfg))


def test_catalog_entry_counts_against_the_model_card():
    """OLMoE-1B-7B-0125-Instruct: '6.9B total / 1.3B active per token' (AI2's release figures);
    ftplan (= transformers 5.24 on meta): 6,919,161,856 total, 1,282,017,280 active (top-8 of 64
    experts, embedding and lm_head included)."""
    spec = get_model("olmoe-1b-7b-0125").spec()
    assert spec.family == "olmoe" and spec.is_moe and spec.groups[0].count == 16
    assert spec.params.total == 6_919_161_856 and round(spec.params.total / 1e9, 1) == 6.9
    assert spec.params.active == 1_282_017_280 and round(spec.params.active / 1e9, 1) == 1.3
    moe = spec.groups[0].moe
    assert (moe.num_experts, moe.top_k, moe.expert_intermediate_size, moe.renormalize) == (64, 8, 1024, False)
