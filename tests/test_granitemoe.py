"""IBM Granite 3.x MoE (``granitemoe``, ``GraniteMoeForCausalLM``) against transformers 5.24 on CPU.

granite's multipliers (``tests/test_granite.py``: nothing saved by them, the unscaled embedding leaf
held beside the first checkpoint input under LoRA + checkpointing) on mixtral's layout: every layer
an MoE block of fused 3-D experts (``intermediate_size`` each, no shared expert) behind
``GraniteMoeTopKRouter``: logits in the weight's dtype, upcast to fp32, top-k first and a softmax
over the k chosen logits (its fp32 output saved), cast back to the input's dtype. PEFT 0.21 has no
MoE mapping for granitemoe, so ``all-linear`` adapts q/k/v/o only. The generic grid runs the tiny
granitemoe from ``TINY_CONFIGS``; this file adds GraniteMoeConfig's defaults and counts on meta,
the PEFT targets, LoRA SAC, QLoRA and the expert-parallel refusal. No catalog entry: no verbatim
config.json of a Granite 3.x MoE checkpoint was found.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import LoraSpec, lora_targets
from ftplan.model import FAMILIES, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "tie_word_embeddings": True,
                                        "num_local_experts": 6, "num_experts_per_tok": 3}])
def test_defaults_and_params_match_transformers(extra):
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from ftplan.measure.torchref import params_by_category

    tfc = AutoConfig.for_model("granitemoe")
    for key, value in FAMILIES["granitemoe"].defaults.items():
        if key in ("head_dim", "sliding_window", "mlp_bias"):
            assert getattr(tfc, key, None) is None, key
        elif key == "num_key_value_heads":  # None: __post_init__ fills in the attention heads
            assert value is None and tfc.num_key_value_heads == tfc.num_attention_heads
        else:
            assert getattr(tfc, key) == value, key
    cfg = {"model_type": "granitemoe", **extra}
    real = F.meta_model(AutoConfig.for_model(**cfg))
    spec = model_from_config(cfg)
    assert spec.params.by_category() == params_by_category(real)
    assert spec.groups[0].moe.router == "granitemoe" and spec.groups[0].count == spec.num_layers


@pytest.mark.torch
def test_peft_all_linear_adapts_the_attention():
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    spec = model_from_config(TR.TINY_CONFIGS["granitemoe"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(TR.TINY_CONFIGS["granitemoe"], dtype="bf16"), r=4, alpha=8,
                                dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "q_proj", "k_proj", "v_proj", "o_proj"}


@pytest.mark.torch
def test_lora_sac_exact():
    pytest.importorskip("trl")
    F.check_checkpointing_variant("granitemoe", "lora", "selective")


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", True)])
def test_qlora_exact(recipe, ckpt):
    """bitsandbytes quantizes q/k/v/o; the router weight and the fused experts stay unquantized
    (fp32 under PEFT's kbit upcast)."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora("granitemoe", recipe, ckpt)


def test_expert_parallelism_is_refused():
    import ftplan.measure.configs as CF
    from ftplan.api import estimate

    with pytest.raises(ConfigError, match="no expert-parallel plan for Granite MoE"):
        estimate(CF.TINY_CONFIGS["granitemoe"], method="full", gpus=2, strategy="fsdp", ep=2)
