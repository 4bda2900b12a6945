"""Phi-3.5-MoE (``phimoe``, ``PhimoeForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

Phi-3.5-MoE is llama's GQA attention (``attention_bias`` on q/k/v and o_proj) with ``nn.LayerNorm``
norms (a weight and a bias each: native_layer_norm keeps its input, mean and rstd, in the input's
dtype on CPU, where autocast leaves layer_norm alone; CUDA's autocast runs it in fp32, planned from
that policy), an ``lm_head_bias``, and an MoE block in every layer: fused 3-D experts of
``intermediate_size`` behind ``PhimoeTopKRouter`` (an ``nn.Linear``) whose logits go through
sparsemixer: two rounds (the best expert, then the best of the rest) of a masked_fill (its bool mask
kept), Gumbel sampling, a softmax in the logits' dtype (its output kept), a gather of the sampled
expert (its int64 id kept, shared with the scatter that masks it for the second round) and
``PhimoeMultiplier``'s custom backward (it keeps the gathered probability); always top-2.
``input_jitter_noise`` > 0 (0.01 in the checkpoint) multiplies the block's input in place by a
uniform tensor, in the block and again in the router: each keeps its uniform tensor.

PEFT 0.21's ``all-linear`` wraps the router (an nn.Linear whose forward returns a tuple: the LoRA
forward fails) and not the fused experts, so ftplan plans all-linear as the attention projections
(``Family.peft_all_linear`` False, as llama4_text) and exports that list; with the experts frozen,
LoRA dropout runs.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny phimoe from
``TINY_CONFIGS``; this file adds PhimoeConfig's defaults, counts on meta, PEFT's targets, a variant
without jitter or biases, and the refusals. Held by hand, out of CI for time
(``benchmarks/families4_by_hand.py phimoe``): eager attention, more variants, QLoRA and the 2-rank
gloo expert-parallel run.
"""

from __future__ import annotations

import sys
import warnings
from functools import partial
from pathlib import Path

import pytest

from ftplan.job import Job, Layout, LoraSpec, lora_targets, lora_wraps_experts, peft_target_modules, validate_job
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

FAMILY = "phimoe"
_LONGROPE = {"rope_type": "longrope", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8, "long_mscale": 1.24,
             "short_mscale": 1.24, "original_max_position_embeddings": 16}
_PLAIN = {"input_jitter_noise": 0.0, "attention_bias": False, "lm_head_bias": False, "sliding_window": 16,
          "num_key_value_heads": 4}


@pytest.mark.torch
def test_defaults_are_phimoe_config_defaults():
    """Every default ftplan fills in equals PhimoeConfig's (head_dim: no field), and a config.json
    naming only the model type builds transformers' parameters."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are(FAMILY, AutoConfig.for_model(FAMILY), absent=("head_dim",))
    assert model_from_config({"model_type": FAMILY}).params.by_category() == F.meta_params({"model_type": FAMILY})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [_PLAIN, {"lm_head_bias": False, "tie_word_embeddings": True}])
def test_params_match_transformers(extra):
    """LayerNorm biases, attention biases, the lm_head bias, a tied embedding."""
    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS[FAMILY], **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_wraps_the_router_and_fails_so_the_attention_is_planned():
    """PEFT's all-linear wraps q/k/v/o and the router (not the fused experts), and the router's LoRA
    forward fails on its tuple output; ftplan plans and exports the attention projections."""
    pytest.importorskip("peft")
    import torch

    import ftplan.measure.torchref as TR

    model = F.peft_all_linear_model(TR.TINY_CONFIGS[FAMILY])
    wrapped = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "router"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AttributeError, match="'tuple' object has no attribute"):
            model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    spec = model_from_config(TR.TINY_CONFIGS[FAMILY])
    assert set(lora_targets(spec, LoraSpec())) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert peft_target_modules(spec, LoraSpec()) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert not lora_wraps_experts(spec, LoraSpec())


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families4_by_hand.py phimoe``, out of CI for time: exact too)
VARIANTS = [("lora", False, 1, 40, "sdpa", _PLAIN)]
VARIANTS_BY_HAND = [("full", False, 2, 24, "eager", {}), ("lora", True, 2, 24, "eager", {}),
                    ("full", True, 1, 40, "eager", {}), ("lora", False, 2, 24, "eager", {}),
                    ("full", False, 2, 24, "sdpa", _PLAIN), ("full", True, 1, 40, "sdpa", _PLAIN),
                    ("lora", True, 2, 24, "eager", _PLAIN),
                    # Phi-3.5-MoE's longrope (short / long factors and mscales; s = 40 > the original 16)
                    ("full", False, 2, 24, "sdpa", {"rope_scaling": _LONGROPE}), ("lora", True, 1, 40, "sdpa",
                                                                               {"rope_scaling": _LONGROPE})]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, FAMILY)
check_qlora = partial(F.check_qlora, FAMILY)  # (test_memory_vs_torch.LORA_TARGETS: the attention projections)

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


def test_refusals_and_layouts():
    """sparsemixer's fixed top-2 and a tied lm_head with a bias are refused in one line; expert
    parallelism is planned (PhimoeConfig has a base_model_ep_plan; held on 2 gloo ranks by hand)."""
    import ftplan.measure.configs as CF

    cfg = CF.TINY_CONFIGS[FAMILY]
    F.assert_refused(cfg, [({"num_experts_per_tok": 3},
                            "num_experts_per_tok=3: transformers' phimoe sparsemixer"),
                           ({"tie_word_embeddings": True}, "tie_word_embeddings with lm_head_bias")])
    spec = model_from_config(cfg)
    validate_job(spec, Job(method="full"), Layout(2, 1, "fsdp", ep=2))
    validate_job(spec, Job(method="lora"), Layout(4, 1, "fsdp", ep=4))
