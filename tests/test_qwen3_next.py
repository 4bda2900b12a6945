"""Qwen3-Next (``qwen3_next``): the hybrid Gated DeltaNet / gated-attention layers with fused
DeltaNet projections and qwen2_moe's sparse block, against transformers 5.24 and PEFT 0.21 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2, SAC) picks the tiny qwen3_next up from ``TINY_CONFIGS`` (two
MoE layers, one dense through ``mlp_only_layers``); this file adds what is particular to it: the
config class's defaults and layer layout (``full_attention_interval``, ``decoder_sparse_step``,
``mlp_only_layers``), PEFT's ``all-linear`` targets (transformers maps qwen3_next's conversions onto
qwen2_moe's, so PEFT wraps the fused experts and the router with ParamWrapper, leaves the shared
expert's projections alone and wraps the shared_expert_gate), several delta rule chunks, the router
without renormalisation, eager attention, and the refusals shared with the other hybrids.
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

    return TR.TINY_CONFIGS["qwen3_next"]


def _hf_config(cfg):
    from transformers.models.qwen3_next import Qwen3NextConfig

    return Qwen3NextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})


@pytest.mark.torch
def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals Qwen3NextConfig's, and a config.json naming only the
    model type builds the same parameters as transformers, category by category (79.67B: 512
    experts top-10 in all 48 layers, 36 DeltaNet and 12 gated-attention layers)."""
    pytest.importorskip("transformers")

    from ftplan.measure.accounting import params_by_category

    tfc = _hf_config({})
    for key, value in FAMILIES["qwen3_next"].defaults.items():
        if key in ("sliding_window", "full_attention_interval"):  # no attributes of the config class
            assert not hasattr(tfc, key), key
        else:
            assert getattr(tfc, key) == value, key
    assert tfc.layer_types.count("full_attention") == 12  # every 4th of 48
    real = F.meta_model(tfc)
    assert type(real).__name__ == "Qwen3NextForCausalLM"
    spec = model_from_config({"model_type": "qwen3_next"})
    assert spec.params.by_category() == params_by_category(real)
    kinds = ["linear_attention" if spec.groups[i].is_linear else "full_attention" for i in layer_group_order(spec)]
    assert kinds == tfc.layer_types


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {"num_hidden_layers": 4},
    {"full_attention_interval": 3, "num_hidden_layers": 7},
    {"decoder_sparse_step": 2, "num_hidden_layers": 6},
    {"mlp_only_layers": [0, 3], "num_hidden_layers": 5, "full_attention_interval": 2},
    {"layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"],
     "num_hidden_layers": 4, "mlp_only_layers": [1], "norm_topk_prob": False},
])
def test_layer_layout_and_counts_match_transformers(extra):
    """Which layers are DeltaNet / attention and MoE / dense (``full_attention_interval`` or
    ``layer_types``; ``decoder_sparse_step`` and ``mlp_only_layers`` as qwen2_moe), and the
    parameters by category, equal transformers' model built on the meta device."""
    pytest.importorskip("transformers")

    from ftplan.measure.accounting import params_by_category

    cfg = {k: v for k, v in _tiny().items() if k != "layer_types"} | extra
    tfc = _hf_config(cfg)
    real = F.meta_model(tfc)
    spec = model_from_config(cfg)
    assert spec.params.by_category() == params_by_category(real)
    order = layer_group_order(spec)
    kinds = ["linear_attention" if spec.groups[i].is_linear else "full_attention" for i in order]
    assert kinds == tfc.layer_types
    moe = [spec.groups[i].moe is not None for i in order]
    assert moe == [type(layer.mlp).__name__ == "Qwen3NextSparseMoeBlock" for layer in real.model.layers]
    assert all(g.linear_attention.fused_proj for g in spec.groups if g.is_linear)


def test_fused_projections_and_families_apart():
    """The DeltaNet's linears are in_proj_qkvz (q, k, v, z) and in_proj_ba (b, a), the same
    weights as qwen3_5's four projections; qwen3_5's own stay unfused."""
    spec = model_from_config(_tiny())
    names = {lin.module for lin in spec.linears()}
    assert {"in_proj_qkvz", "in_proj_ba", "out_proj", "shared_expert_gate"} <= names
    assert not names & {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"}
    q35 = model_from_config({**_tiny(), "model_type": "qwen3_5_moe_text"})
    assert sum(lin.params for lin in q35.linears() if lin.module.startswith("in_proj")) == \
        sum(lin.params for lin in spec.linears() if lin.module.startswith("in_proj"))
    assert not any(g.linear_attention.fused_proj for g in q35.groups if g.is_linear)


@pytest.mark.torch
def test_peft_all_linear_targets():
    """transformers maps qwen3_next's weight conversions onto qwen2_moe's, for which PEFT 0.21 has a
    v4 -> v5 MoE mapping: all-linear wraps the fused experts and the router (ParamWrapper: no
    dropout), drops the MLP projection names (the shared expert's and the dense layer's stay
    frozen), and keeps every other nn.Linear: the fused DeltaNet projections, the attention and
    the shared_expert_gate."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    spec = model_from_config(_tiny())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(_tiny(), dtype="bf16"), r=4, alpha=8, dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "in_proj_qkvz", "in_proj_ba", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "shared_expert_gate"}
    assert lora_wraps_experts(spec, LoraSpec(r=4)) and applied.targeted_parameters
    names = [n for n, _ in applied.model.named_parameters() if "lora_" in n]
    assert any(".experts." in n for n in names) and any(".mlp.gate." in n for n in names)
    assert not any("shared_expert." in n or ".mlp.gate_proj" in n or ".mlp.down_proj" in n for n in names)


@pytest.mark.torch
@pytest.mark.parametrize("method,precision,batch,seq,ckpt", [
    ("full", "bf16-mixed", 1, 70, False),  # two chunks, padded to 128
    ("lora", "bf16-mixed", 2, 70, False),
    ("lora", "bf16-mixed", 1, 140, True),  # three chunks
])
def test_saved_activations_over_several_chunks(method, precision, batch, seq, ckpt):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("qwen3_next", method, ckpt, batch, seq, precision=precision)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("method", ["full", "lora"])
def test_router_without_renormalisation_exact(method):
    """norm_topk_prob false (qwen2_moe's router keeps the raw top-k probabilities): saved bytes
    still exact."""
    from test_memory_vs_torch import _run

    cfg = {**_tiny(), "norm_topk_prob": False}
    spec, job, r, casts = _run("qwen3_next", method, False, 2, 24, cfg=cfg)
    assert not any(g.moe.renormalize for g in spec.groups if g.moe is not None)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("method", ["full", "lora"])
def test_eager_attention_exact(method):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("qwen3_next", method, False, 2, 24, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_hybrid_refusals_and_notes():
    """As for the other hybrids: expert parallelism and tensor parallelism are refused with one
    line, FP8 too, and a CUDA estimate carries the fla bound note."""
    from ftplan.errors import ConfigError
    from ftplan.job import Job, Layout
    from ftplan.memory import estimate_memory

    spec = model_from_config({"model_type": "qwen3_next"})
    lora = LoraSpec(r=16, dropout=0.0)  # (ParamWrapper on the experts refuses dropout)
    with pytest.raises(ConfigError, match="expert parallelism.*not modelled"):
        estimate_memory(spec, Job(method="full"), Layout(gpus_per_node=8, strategy="fsdp", ep=8))
    with pytest.raises(ConfigError, match="tensor parallelism is not modelled"):
        estimate_memory(spec, Job(method="lora", lora=lora), Layout(gpus_per_node=8, strategy="fsdp", tp=2))
    with pytest.raises(ConfigError, match="hybrid linear-attention model.*not modelled"):
        estimate_memory(spec, Job(method="full", precision="fp8"), Layout(gpus_per_node=8, strategy="fsdp"))
    est = estimate_memory(spec, Job(method="lora", lora=lora, seq_len=2048), Layout(gpus_per_node=8, strategy="fsdp"))
    assert any("flash-linear-attention" in n for n in est.notes)


@pytest.mark.torch
def test_qwen3_moe_router_without_renormalisation_exact():
    """The same router in qwen3_moe (its config class defaults norm_topk_prob to false): ftplan
    reads the flag there too."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    cfg = {**TR.TINY_CONFIGS["qwen3_moe"], "norm_topk_prob": False}
    spec, job, r, casts = _run("qwen3_moe", "full", False, 2, 24, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_qwen3_next_80b_a3b_counts():
    """The catalog's 80B-A3B: 36 Gated DeltaNet and 12 gated-attention layers, every one MoE with
    512 experts top-10 and a gated shared expert; 79.67B parameters (transformers on meta: the
    same, tests/_check_catalog_params.py), 3.87B active (3.25B without the embedding and lm_head):
    the card's 80B total, 3B active."""
    from ftplan.catalog.models import get_model

    spec = get_model("qwen3-next-80b-a3b").spec()
    assert spec.family == "qwen3_next" and spec.num_layers == 48
    assert sorted((g.count, g.is_linear) for g in spec.groups) == [(12, False), (36, True)]
    assert all(g.moe is not None and g.moe.shared_gate and g.moe.renormalize and g.moe.num_experts == 512
               and g.moe.top_k == 10 for g in spec.groups)
    assert spec.attention.rotary_dim == 64 and spec.attention.output_gate
    assert spec.params.total == 79_674_391_296
    assert round(spec.params.active / 1e9, 2) == 3.87
    assert round((spec.params.active - spec.params.embedding - spec.params.lm_head) / 1e9, 2) == 3.25


def test_exports_and_token_estimate():
    """LLaMA-Factory 0.9.5 registers Qwen3-Next-80B-A3B-Instruct with qwen3_nothink (the family's
    default, the Thinking checkpoint's, is qwen3); the token estimate is Qwen3's (the same
    151,936-row vocabulary); the exported setup's transformers floor stays 5.0 (models/qwen3_next
    first ships in 4.57)."""
    from ftplan.catalog.models import get_model
    from ftplan.catalog.tokenization import token_estimate
    from ftplan.export.llamafactory import template_for
    from ftplan.export.skypilot import transformers_floor

    spec = get_model("qwen3-next-80b-a3b").spec()
    assert template_for(spec) == "qwen3_nothink"
    assert template_for(model_from_config({"model_type": "qwen3_next"})) == "qwen3"
    assert token_estimate(spec.name, spec.family).tokenizer == "qwen3"
    assert FAMILIES["qwen3_next"].min_transformers == "4.57"
    assert transformers_floor("fsdp", "qwen3_next") == "5.0"


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", True)])  # (TRL's recipe: states exact too, by hand)
def test_qlora_model_states_exact(recipe, ckpt):
    """bitsandbytes nf4 on CPU (dropout 0: ParamWrapper on the experts): the packed 4-bit linears
    (DeltaNet, attention, shared expert, dense MLP, shared_expert_gate), the unquantized fused
    experts, router and vectors, the adapters with their gradients and AdamW states, byte-exact
    for both recipes; the saved activations exact with checkpointing (without it:
    tests/test_moe_qlora_activations.py)."""
    pytest.importorskip("bitsandbytes")
    from test_memory_vs_torch import _check_qlora

    _check_qlora("qwen3_next", ckpt, recipe, dropout=0.0, activations=ckpt)


@pytest.mark.torch
def test_tiny_config_of_the_catalog_entry():
    """``ftplan measure --tiny`` shrinks the 80B-A3B to one DeltaNet and one attention layer (the
    DeltaNet's heads too, its projections still fused), which transformers builds with the
    parameters ftplan counts."""
    import json

    import ftplan.measure.torchref as TR
    from ftplan.catalog.models import get_model
    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.configs import tiny_config

    raw = get_model("qwen3-next-80b-a3b").spec().config
    cfg = tiny_config(json.loads(json.dumps(raw)))
    assert cfg["layer_types"] == ["linear_attention", "full_attention"] and cfg["num_experts"] == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, device="meta")
    assert type(model).__name__ == "Qwen3NextForCausalLM"
    assert params_by_category(model) == model_from_config(cfg).params.by_category()
