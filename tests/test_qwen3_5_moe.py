"""Qwen3.5 MoE (``qwen3_5_moe``): qwen3_5's hybrid Gated DeltaNet / gated-attention layers with
Qwen3.5's MoE block in every layer, against transformers 5.24 and PEFT 0.21 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2) picks the tiny qwen3_5_moe up from ``TINY_CONFIGS``; this file
adds what is particular to it: the config class's defaults (a config naming only the model type
builds the same parameters), the image-text config loading as ``Qwen3_5MoeForCausalLM``, PEFT's
``all-linear`` targets (no v4 -> v5 MoE mapping for this family: the shared expert and its sigmoid
``shared_expert_gate`` are wrapped, the routed experts and the router are not) and several delta
rule chunks.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.job import LoraSpec, lora_targets, lora_wraps_experts
from ftplan.memory import saved_activation_bytes
from ftplan.model import FAMILIES, layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


def _tiny():
    import ftplan.measure.torchref as TR

    return TR.TINY_CONFIGS["qwen3_5_moe"]


@pytest.mark.torch
def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals Qwen3_5MoeTextConfig's (it has no intermediate_size:
    every layer is MoE), and a config.json naming only the model type builds the same parameters
    as transformers, category by category (the shared_expert_gate counts as router)."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

    from ftplan.measure.accounting import params_by_category

    tfc = Qwen3_5MoeTextConfig()
    for key, value in FAMILIES["qwen3_5_moe"].defaults.items():
        if key in ("intermediate_size", "sliding_window", "full_attention_interval"):
            assert getattr(tfc, key, None) is None or key == "full_attention_interval", key
        else:
            assert getattr(tfc, key) == value, key
    assert tfc.layer_types.count("full_attention") == 10  # every 4th of 40
    real = F.meta_model(tfc)
    assert type(real).__name__ == "Qwen3_5MoeForCausalLM"
    spec = model_from_config({"model_type": "qwen3_5_moe_text"})
    assert spec.params.by_category() == params_by_category(real)
    kinds = ["linear_attention" if spec.groups[i].is_linear else "full_attention" for i in layer_group_order(spec)]
    assert kinds == tfc.layer_types


@pytest.mark.torch
def test_image_text_config_loads_the_text_causal_lm():
    """AutoModelForCausalLM on a qwen3_5_moe (image-text) config builds Qwen3_5MoeForCausalLM from
    text_config alone (no vision tower); ftplan's counts equal it category by category."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig

    from ftplan.measure.accounting import params_by_category

    text = {k: v for k, v in _tiny().items() if k != "model_type"}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    hf = Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    real = F.meta_model(hf)
    assert type(real).__name__ == "Qwen3_5MoeForCausalLM"
    assert not any("visual" in n for n, _ in real.named_parameters())
    spec = model_from_config({"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                              "text_config": {**text, "model_type": "qwen3_5_moe_text"}, "vision_config": vision})
    assert spec.family == "qwen3_5_moe" and spec.is_moe and spec.is_hybrid
    assert spec.params.by_category() == params_by_category(real)
    # no model_type in text_config: the outer one names the family
    assert model_from_config({"model_type": "qwen3_5_moe", "text_config": text}).params == spec.params


@pytest.mark.torch
def test_peft_all_linear_targets():
    """PEFT 0.21 has no v4 -> v5 MoE mapping for qwen3_5_moe (transformers maps its conversions
    onto qwen3_5_text's), so all-linear wraps the nn.Linear modules only: the mixers'
    projections, the shared expert's three and shared_expert_gate; neither the fused experts nor
    the router (no ParamWrapper: lora_dropout > 0 is allowed)."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    spec = model_from_config(_tiny())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(_tiny(), dtype="bf16"), r=4, alpha=8, dropout=0.1)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj",
        "o_proj", "gate_proj", "up_proj", "down_proj", "shared_expert_gate"}
    assert not lora_wraps_experts(spec, LoraSpec(r=4)) and not applied.targeted_parameters
    names = [n for n, _ in applied.model.named_parameters() if "lora_" in n]
    assert not any(".experts." in n or ".mlp.gate." in n for n in names)


@pytest.mark.torch
@pytest.mark.parametrize("method,precision,batch,seq,ckpt", [
    ("full", "bf16-mixed", 1, 70, False),  # two chunks, padded to 128
    ("lora", "bf16-mixed", 2, 70, False),
    ("lora", "bf16-mixed", 1, 70, True),
])
def test_saved_activations_over_several_chunks(method, precision, batch, seq, ckpt):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("qwen3_5_moe", method, ckpt, batch, seq, precision=precision)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_qwen3_5_35b_a3b_counts():
    """The catalog's 35B-A3B: 30 Gated DeltaNet and 10 gated-attention layers, every one MoE; the
    text model transformers builds is 34.66B parameters (the card's 35B adds the vision tower and
    the multi-token-prediction layer), 3.45B active (top-8 of 256 experts)."""
    from ftplan.catalog.models import get_model

    spec = get_model("qwen3.5-35b-a3b").spec()
    assert sorted((g.count, g.is_linear) for g in spec.groups) == [(10, False), (30, True)]
    assert all(g.moe is not None and g.moe.shared_gate for g in spec.groups)
    assert spec.params.total == 34_660_610_688
    assert round(spec.params.active / 1e9, 2) == 3.45


def test_expert_parallelism_is_refused_with_one_line():
    """EP on the hybrid MoE is not held against transformers' EP engine: refused, not guessed."""
    from ftplan.catalog.models import get_model
    from ftplan.errors import ConfigError
    from ftplan.job import Job, Layout
    from ftplan.memory import estimate_memory

    with pytest.raises(ConfigError, match="expert parallelism.*not modelled"):
        estimate_memory(get_model("qwen3.5-35b-a3b").spec(), Job(method="full"),
                        Layout(gpus_per_node=8, strategy="fsdp", ep=8))
