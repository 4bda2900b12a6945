"""Qwen1.5-MoE / Qwen2-MoE (``qwen2_moe``, ``Qwen2MoeForCausalLM``) against transformers 5.24 / PEFT
0.21.2 on CPU.

Qwen2-MoE is qwen2's attention (q/k/v biases by ``qkv_bias``, default on; o_proj none) with the
sparse block qwen3_next copies verbatim (planned as ``moe="qwen3_next"``: no new flag): an fp32
softmax top-k router renormalised only with ``norm_topk_prob`` (false in the checkpoints), fused
3-D experts of ``moe_intermediate_size``, and one shared expert MLP of
``shared_expert_intermediate_size`` scaled per token by ``sigmoid(shared_expert_gate(x))`` (an
``nn.Linear(hidden, 1)``); ``decoder_sparse_step`` / ``mlp_only_layers`` pick dense layers of
``intermediate_size``. With ``use_sliding_window`` Qwen2MoeConfig slides the *even* layers below
``max_window_layers`` (qwen2's rule slides the layers from it on).

PEFT: transformers' ``_MODEL_TO_CONVERSION_PATTERN`` maps olmoe, qwen3_moe, deepseek_v3 ... onto
the "qwen2_moe" pattern but has no entry for qwen2_moe itself, so PEFT 0.21.2 does not rewrite
``all-linear`` here: it wraps every ``nn.Linear`` (attention, the dense and shared-expert MLPs and
shared_expert_gate), neither the fused experts nor the router (``peft_wraps_experts=False``), and
LoRA dropout runs (no ParamWrapper).

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny qwen2_moe
from ``TINY_CONFIGS`` (layer 0 dense, layer 1 sparse); this file adds Qwen2MoeConfig's defaults,
the layer layouts and counts on meta, PEFT's targets, one variant (renormalised, sliding window),
the refusals, expert parallelism and the catalog entries. Held by hand, out of CI for time
(``benchmarks/families3_by_hand.py qwen2_moe``, all exact): eager attention, more variants, QLoRA
(PEFT's and TRL's recipes) and the 2-rank gloo expert-parallel run (transformers' EP engine, as
tests/test_expert_parallel.py).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, lora_targets, lora_wraps_experts, validate_job
from ftplan.model import FAMILIES, layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
def test_defaults_are_qwen2_moe_config_defaults():
    """Every default ftplan fills in equals Qwen2MoeConfig's (head_dim is no field of it;
    layer_types None: __post_init__ fills it in), and a config.json naming only the model type
    builds transformers' parameters."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model("qwen2_moe")
    F.assert_defaults_are("qwen2_moe", tfc, absent=("head_dim",), skip=("layer_types", "sliding_window"))
    # __post_init__: sliding_window 0 without use_sliding_window
    assert tfc.sliding_window == 0 and FAMILIES["qwen2_moe"].defaults["sliding_window"] == 4096
    assert model_from_config({"model_type": "qwen2_moe"}).params.by_category() == F.meta_params(
        {"model_type": "qwen2_moe"})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {"mlp_only_layers": [], "decoder_sparse_step": 2, "num_hidden_layers": 5, "qkv_bias": False},
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 3, "num_hidden_layers": 5,
     "tie_word_embeddings": True},
    {"num_experts": 0},
])
def test_layouts_and_params_match_transformers(extra):
    """Dense / sparse layers and windows per layer as Qwen2MoeConfig and Qwen2MoeDecoderLayer
    place them, parameters as transformers builds them (num_experts 0: every layer dense)."""
    from transformers import Qwen2MoeConfig

    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["qwen2_moe"], **extra}
    hf = Qwen2MoeConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = model_from_config(cfg)
    groups = [spec.groups[i] for i in layer_group_order(spec)]
    n = hf.num_hidden_layers
    assert [g.moe is not None for g in groups] == [
        i not in hf.mlp_only_layers and hf.num_experts > 0 and (i + 1) % hf.decoder_sparse_step == 0 for i in range(n)]
    assert [g.window for g in groups] == [hf.sliding_window if t == "sliding_attention" else None
                                          for t in hf.layer_types]
    assert spec.params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_wraps_every_linear_not_the_experts():
    """all-linear: q/k/v/o, the dense MLP, the shared expert's MLP and shared_expert_gate as LoRA
    linears; no ParamWrapper on the experts or the router (no conversion entry for qwen2_moe)."""
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    import ftplan.measure.torchref as TR

    _check_peft_all_linear("qwen2_moe", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                         "down_proj", "shared_expert_gate"])
    spec = model_from_config(TR.TINY_CONFIGS["qwen2_moe"])
    assert not lora_wraps_experts(spec, LoraSpec()) and "shared_expert_gate" in lora_targets(spec, LoraSpec())


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families3_by_hand.py qwen2_moe``, out of CI for time: exact too)
_WINDOW = {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}  # layer 0 slides
VARIANTS = [("full", False, 1, 40, "sdpa", {**_WINDOW, "norm_topk_prob": True})]
VARIANTS_BY_HAND = [
    ("full", False, 2, 24, "eager", {}), ("lora", True, 1, 40, "eager", {}), ("lora", False, 2, 24, "eager", {}),
    ("lora", False, 1, 40, "sdpa", _WINDOW), ("full", True, 1, 40, "eager", _WINDOW),
    ("lora", True, 2, 24, "sdpa", {"norm_topk_prob": True}),
    ("full", False, 2, 24, "sdpa", {"mlp_only_layers": [], "decoder_sparse_step": 2, "num_hidden_layers": 3,
                                    "qkv_bias": False}),
    ("full", True, 2, 24, "sdpa", {"mlp_only_layers": [], "num_key_value_heads": 4}),
]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, "qwen2_moe")
check_qlora = partial(F.check_qlora, "qwen2_moe")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


@pytest.mark.parametrize("extra,msg", [
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types names sliding_attention"),
])
def test_refusals(extra, msg):
    """Sliding layer_types without use_sliding_window (Qwen2MoeConfig's window is then 0) are
    refused in one line (the load-balancing loss, output_router_logits, is planned since
    2026-11-25: tests/test_router_aux_loss.py)."""
    import ftplan.measure.configs as CF

    with pytest.raises(ConfigError, match=msg) as e:
        model_from_config({**CF.TINY_CONFIGS["qwen2_moe"], **extra})
    assert "\n" not in str(e.value)


def test_expert_parallel_layouts_are_planned():
    """Qwen2MoeConfig has a base_model_ep_plan; the 2-rank gloo run of transformers' EP engine is
    exact against the plan (held by hand: benchmarks/families3_by_hand.py qwen2_moe)."""
    import ftplan.measure.configs as CF

    spec = model_from_config(CF.TINY_CONFIGS["qwen2_moe"])
    validate_job(spec, Job(method="full"), Layout(2, 1, "fsdp", ep=2))
    validate_job(spec, Job(method="lora"), Layout(4, 1, "fsdp", ep=4))


def test_catalog_entry_counts_against_the_model_card():
    """Qwen2-57B-A14B: '57B-A14B' (57B total, 14B activated, the model card); ftplan (=
    transformers 5.24 on meta): 57,408,658,944 total, 14,249,270,784 active (top-8 of 64 experts,
    the shared expert, embedding and lm_head included)."""
    from ftplan.catalog.models import get_model

    spec = get_model("qwen2-57b-a14b").spec()
    assert spec.family == "qwen2_moe" and spec.is_moe and spec.groups[0].count == 28 and len(spec.groups) == 1
    assert spec.params.total == 57_408_658_944 and round(spec.params.total / 1e9) == 57
    assert spec.params.active == 14_249_270_784 and round(spec.params.active / 1e9) == 14
    moe = spec.groups[0].moe
    assert (moe.num_experts, moe.top_k, moe.expert_intermediate_size, moe.renormalize) == (64, 8, 2560, False)
    assert moe.shared.intermediate_size == 20480 and moe.shared_gate
    assert spec.attention.qkv_bias and not spec.attention.o_bias and spec.groups[0].window is None
