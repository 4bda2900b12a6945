"""glm4_moe_lite (GLM-4.7-Flash) against the installed transformers and PEFT.

Glm4MoeLiteForCausalLM is DeepSeek-V3's MLA attention with glm4_moe's (= DeepSeek-V3's) MoE block;
its dense / MoE layers come from ``mlp_layer_types`` (first_k_dense_replace is ignored) and its q/k
and v head dims are equal (192 + 64 = 256), which sends CPU sdpa to its flash kernel. The tiny config
(``TINY_CONFIGS["glm4_moe_lite"]``) runs through the shared exact tests (tests/test_memory_vs_torch.py,
tests/test_checkpointing_vs_torch.py); here: the family's defaults and parameter counts, what PEFT's
``all-linear`` wraps, refusals, and the switches the tiny config does not take (eager attention, an
explicit ``mlp_layer_types``, no q LoRA rank, a non-interleaved rope, different q/k and v head dims).
"""

from __future__ import annotations

import pytest

from ftplan.errors import ConfigError
from ftplan.job import LoraSpec, lora_wraps_experts
from ftplan.model import FAMILIES, model_from_config


def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals Glm4MoeLiteConfig's (head_dim: an alias of
    qk_rope_head_dim), and a config.json that only names the model type builds the same parameters
    as transformers on the meta device (GLM-4.7-Flash's shape: the config class defaults are it)."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.measure.torchref import params_by_category

    tfc = AutoConfig.for_model("glm4_moe_lite")
    for key, value in FAMILIES["glm4_moe_lite"].defaults.items():
        if key == "head_dim":
            assert tfc.head_dim == tfc.qk_rope_head_dim and value is None
        elif key == "sliding_window":
            assert getattr(tfc, key, None) is None and value is None
        elif key == "mlp_layer_types":
            assert tfc.mlp_layer_types == ["dense"] + ["sparse"] * 46 and value is None
        else:
            assert getattr(tfc, key) == value, key
    with torch.device("meta"):
        real = AutoModelForCausalLM.from_config(tfc)
    spec = model_from_config({"model_type": "glm4_moe_lite"})
    assert spec.params.by_category() == params_by_category(real)
    assert [g.count for g in spec.groups] == [1, 46]


@pytest.mark.parametrize("extra", [
    # transformers ignores first_k_dense_replace: layer 0 dense only
    {"first_k_dense_replace": 2},
    {"mlp_layer_types": ["sparse", "dense", "sparse", "dense"]},
    {"q_lora_rank": None},  # a plain q_proj (a null is kept, not the class default)
])
def test_params_exact_on_meta(extra):
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.measure.torchref import params_by_category

    cfg = {"model_type": "glm4_moe_lite", "num_hidden_layers": 4, **extra}
    tfc = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        real = AutoModelForCausalLM.from_config(tfc)
    assert model_from_config(cfg).params.by_category() == params_by_category(real)


@pytest.mark.parametrize("extra,msg", [
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types must be a list"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types has 2 entries"),
])
def test_refused(extra, msg):
    """A partial rotary share fails in transformers' MLA attention (narrower rope tables than
    qk_rope_head_dim); a malformed mlp_layer_types is refused as transformers would."""
    with pytest.raises(ConfigError, match=msg):
        model_from_config({"model_type": "glm4_moe_lite", "num_hidden_layers": 3, **extra})
    assert model_from_config({"model_type": "glm4_moe_lite", "partial_rotary_factor": 1.0}).num_layers == 47


def test_peft_all_linear_wraps_the_experts_and_the_router():
    """As glm4_moe: PEFT 0.21 puts ParamWrapper on the fused experts and on the fp32 router (which
    refuses lora_dropout > 0); the dense layer's MLP and the shared experts are not adapted; the MLA
    projections (q_a, q_b, kv_a_with_mqa, kv_b, o) are."""
    from test_glm4_moe import _check_glm_all_linear

    import ftplan.measure.torchref as TR

    names = _check_glm_all_linear("glm4_moe_lite")
    for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
        assert any(f"layers.0.self_attn.{proj}.lora_A" in n for n in names)
    assert lora_wraps_experts(model_from_config(TR.TINY_CONFIGS["glm4_moe_lite"]), LoraSpec())


VARIANTS = {
    "tiny": {},
    # explicit layer pattern (MoE first), no q LoRA rank, rope not interleaved
    "layers_noq_rope": {"mlp_layer_types": ["sparse", "dense", "sparse"], "q_lora_rank": None,
                        "rope_interleave": False},
    # v narrower than q/k (as DeepSeek-V3): CPU sdpa's math kernel
    "narrow_v": {"v_head_dim": 16},
}


@pytest.mark.torch
@pytest.mark.parametrize("variant,method,ckpt,attn,precision", [
    ("tiny", "full", False, "eager", "bf16-mixed"),
    ("tiny", "lora", False, "eager", "bf16-mixed"),
    ("layers_noq_rope", "full", False, "sdpa", "bf16-mixed"),
    ("layers_noq_rope", "lora", False, "eager", "bf16-mixed"),
    ("layers_noq_rope", "full", True, "sdpa", "bf16"),
    ("narrow_v", "full", False, "sdpa", "bf16-mixed"),
    ("narrow_v", "full", False, "eager", "bf16"),
])
def test_saved_activations_exact_variants(variant, method, ckpt, attn, precision):
    pytest.importorskip("peft")
    from test_memory_vs_torch import _run

    from ftplan.memory import model_states, saved_activation_bytes

    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["glm4_moe_lite"], **VARIANTS[variant]}
    spec, job, r, casts = _run("glm4_moe_lite", method, ckpt, 2, 24, attn=attn, precision=precision, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    states = model_states(spec, job)
    assert states.trainable_weights == r.trainable_param_bytes and states.gradients == r.grad_bytes
    assert states.frozen_weights == (0 if method == "full" else r.frozen_param_bytes)


def test_glm_4_7_flash_counts_against_the_model_card():
    """Model card: a '30B-A3B MoE model'. transformers builds no MTP layer (model.layers.47) and
    neither does ftplan: 29.94B; 3.26B active without the input embedding and the lm_head (ftplan's
    active count includes both: 3.90B)."""
    from ftplan.catalog.models import load_model_catalog

    p = load_model_catalog()["glm-4.7-flash"].spec().params
    assert p.total == 29_943_390_976
    assert round(p.total / 1e9) == 30
    assert round((p.active - p.embedding - p.lm_head) / 1e9) == 3


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("full", "selective-attention"), ("lora", "selective"),
                                         ("lora", "every-k")])
def test_checkpointing_variants_exact(method, mode):
    """TRL's attention SAC keeps the CPU flash kernel's output and logsumexp (one op here, where
    DeepSeek-V3's math kernel is not); torchtitan's op SAC on LoRA; every-k. (Full op SAC runs in
    tests/test_checkpointing_vs_torch.py's grid.)"""
    pytest.importorskip("peft")
    import test_checkpointing_vs_torch as C

    C.test_checkpointing_variants_exact("glm4_moe_lite", method, mode)
