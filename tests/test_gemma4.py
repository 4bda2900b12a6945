"""Gemma 4 (``gemma4``, transformers 5.24's ``gemma4_text``) against the installed transformers
and PEFT on CPU.

The tiny config (``TINY_CONFIGS["gemma4"]``: sliding/full/sliding/full, full layers with their own
``global_head_dim``, ``num_global_key_value_heads`` and ``attention_k_eq_v``) runs through the
shared exact tests (model states, saved activations full/LoRA, autocast and pure bf16,
checkpointing on/off, selective checkpointing); this file adds what is particular to the family:
the config class's defaults and layer layout, the image-text config, PEFT's ``all-linear``
targets, eager attention, switches the tiny config does not take (v_proj on full layers, the
default head layout), the catalog's Gemma 4 31B against the model card, and the refusals.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.catalog.models import load_model_catalog
from ftplan.errors import ConfigError
from ftplan.measure.configs import TINY_CONFIGS
from ftplan.memory import model_states, saved_activation_bytes
from ftplan.model import FAMILIES, layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

TEXT = TINY_CONFIGS["gemma4"]


def _tfc(**kw):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma4_text", **kw)
    cfg.allow_global_per_layer_attribute_access = True
    return cfg


def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals Gemma4TextConfig's (``global_head_dim`` and
    ``num_global_key_value_heads`` are no attributes: the config class turns them into the
    full-attention layers' ``per_layer_config``)."""
    pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tfc = _tfc()
    for key, value in FAMILIES["gemma4"].defaults.items():
        if key == "global_head_dim":
            full = tfc.layer_types.index("full_attention")
            assert tfc.per_layer_config[full].head_dim == value
        elif key == "num_global_key_value_heads":
            assert value is None
        else:
            assert getattr(tfc, key) == value, key


@pytest.mark.parametrize("extra", [
    {},
    {"num_hidden_layers": 8},  # 5 sliding, 1 full, then the last forced to full
    {"num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
])
def test_layer_layout_matches_transformers(extra):
    """Which layers slide: Gemma4TextConfig's layer_types (every 6th full by default) with the last
    layer forced to full attention; full layers take global_head_dim (and with k_eq_v the global
    kv heads)."""
    pytest.importorskip("transformers")
    cfg = {**TEXT, "num_hidden_layers": 12, **extra}
    if "layer_types" not in extra:
        cfg.pop("layer_types")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = _tfc(**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = model_from_config(cfg)
    order = layer_group_order(spec)
    kinds = ["sliding_attention" if spec.groups[i].window else "full_attention" for i in order]
    assert kinds == hf.layer_types
    for i, gi in enumerate(order):
        a = spec.groups[gi].attention
        assert (a.head_dim, a.num_kv_heads) == (hf.per_layer_config[i].head_dim,
                                                hf.per_layer_config[i].num_key_value_heads)


@pytest.mark.torch
def test_image_text_config_plans_the_text_model():
    """AutoModelForCausalLM on a gemma4 (image-text) config builds Gemma4ForConditionalGeneration
    (vision tower included, as for gemma3); ftplan plans its language model, whose counts equal
    Gemma4ForCausalLM's built from text_config, category by category."""
    pytest.importorskip("transformers")
    from transformers.models.gemma4 import Gemma4Config

    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.torchref import build_model

    text = {k: v for k, v in TEXT.items() if k != "model_type"}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 16}
    real = F.meta_model(Gemma4Config(text_config=text, vision_config=vision))
    assert type(real).__name__ == "Gemma4ForConditionalGeneration"
    raw = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
           "text_config": TEXT, "vision_config": vision}
    spec = model_from_config(raw)
    assert spec.params.total == sum(p.numel() for p in real.model.language_model.parameters())
    assert spec.params.by_category() == params_by_category(build_model(raw, device="meta"))


@pytest.mark.torch
def test_peft_all_linear_targets():
    """PEFT 0.21's all-linear wraps q/k/v/o and the MLP; full layers with k_eq_v have no v_proj."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR
    from ftplan.job import LoraSpec, lora_targets

    spec = model_from_config(TEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(TEXT, dtype="bf16")
        applied = TR.apply_lora(model, r=4, alpha=8, dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any("layers.1.self_attn.v_proj" in n for n, _ in model.named_modules())


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq,precision", [
    ("full", False, 2, 24, "bf16-mixed"), ("lora", False, 1, 40, "bf16-mixed")])
def test_eager_attention_exact(method, ckpt, batch, seq, precision):
    """Eager attention: the repeated k/v of each layer's own kv heads and head_dim, the fp32
    softmax and its cast (scaling 1, no attention soft-capping)."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("gemma4", method, ckpt, batch, seq, attn="eager", precision=precision)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("extra,method", [
    ({"attention_k_eq_v": False}, "lora"),  # full layers keep v_proj and num_key_value_heads
    ({"layer_types": None, "num_hidden_layers": 7, "tie_word_embeddings": False,
      "final_logit_softcapping": None}, "full"),  # 5 sliding, 1 full, 1 full (forced); untied head
])
def test_other_switches_exact(extra, method):
    from test_memory_vs_torch import _run

    cfg = {k: v for k, v in {**TEXT, **extra}.items() if v is not None or k == "final_logit_softcapping"}
    spec, job, r, casts = _run("gemma4", method, False, 2, 24, cfg=cfg)
    st = model_states(spec, job)
    assert (st.trainable_weights, st.gradients, st.optimizer_states) == (
        r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_catalog_31b_matches_the_model_card():
    """gemma-4-31B: the model card's 30.7B parameters are the text model's (ftplan's count, held
    exactly against transformers on meta by tests/test_model_params.py)."""
    spec = load_model_catalog()["gemma-4-31b"].spec()
    p = spec.params
    assert p.total == 30_697_345_280
    assert round(p.total / 1e9, 1) == 30.7
    full = [g for g in spec.groups if g.window is None]
    assert [g.count for g in full] == [10]
    a = full[0].attention
    assert (a.head_dim, a.num_kv_heads, a.k_eq_v) == (512, 4, True)


@pytest.mark.parametrize("extra,words", [
    ({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
    ({"num_kv_shared_layers": 2}, "KV sharing"),
    ({"use_bidirectional_attention": "all"}, "bidirectional"),
])
def test_refusals_are_one_line(extra, words):
    with pytest.raises(ConfigError) as e:
        model_from_config({**TEXT, **extra})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_e2b_like_default_config_is_refused():
    """A config naming only the model type gets Gemma4TextConfig's hidden_size_per_layer_input=256
    (the E2B/E4B per-layer inputs): refused, not planned without them."""
    with pytest.raises(ConfigError, match="per-layer input embeddings"):
        model_from_config({"model_type": "gemma4_text"})
    with pytest.raises(ConfigError, match="per-layer input embeddings"):
        model_from_config({"model_type": "gemma4", "text_config": {"hidden_size_per_layer_input": 256}})


# ---- the MoE block (gemma-4-26B-A4B) ----------------------------------------------------------
MOE = TINY_CONFIGS["gemma4_moe"]


@pytest.mark.torch
def test_moe_params_and_peft_targets():
    """Every layer keeps its dense MLP and adds the router (a Linear ``proj`` with a learned
    ``scale`` and ``per_expert_scale``), fused experts and three norms; PEFT's all-linear wraps
    the router's Linear too, not the experts (no MoE mapping for gemma4 in PEFT 0.21)."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR
    from ftplan.job import LoraSpec, lora_targets, lora_wraps_experts

    spec = model_from_config(MOE)
    assert all(g.mlp is not None and g.moe is not None and g.norms_per_layer == 7 for g in spec.groups)
    assert spec.params.by_category() == TR.params_by_category(TR.build_model(MOE, device="meta"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(MOE, dtype="bf16"), r=4, alpha=8, dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "proj"}
    assert not lora_wraps_experts(spec, LoraSpec(r=4))


GRID = [("full", False, 2, 24, "bf16-mixed", "sdpa"), ("lora", False, 2, 24, "bf16-mixed", "sdpa"),
        ("full", True, 2, 24, "bf16-mixed", "sdpa"), ("lora", True, 1, 40, "bf16-mixed", "sdpa"),
        ("full", False, 2, 24, "bf16", "sdpa"), ("lora", False, 1, 40, "bf16-mixed", "eager")]


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq,precision,attn", GRID)
def test_moe_exact(method, ckpt, batch, seq, precision, attn):
    """Model states and every saved byte of the MoE layers (router on the un-normed residual, fp32
    softmax, renormalised top-k times per_expert_scale, grouped_mm experts in the weight dtype on
    CPU, the three extra norms), full and LoRA, autocast and pure bf16, checkpointing on/off."""
    from test_memory_vs_torch import _run

    from ftplan.memory import _autocast_weight_elems

    spec, job, r, casts = _run("gemma4", method, ckpt, batch, seq, precision=precision, attn=attn, cfg=MOE)
    st = model_states(spec, job)
    assert (st.trainable_weights, st.gradients, st.optimizer_states, st.n_trainable_tensors) == (
        r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes, r.n_trainable_tensors)
    if method == "lora":
        assert st.frozen_weights == r.frozen_param_bytes and st.master_weights == casts
    elif precision == "bf16-mixed" and not ckpt:
        assert 2 * _autocast_weight_elems(spec, backend="cpu") == casts
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("family,method,mode", [
    ("gemma4", "lora", "selective"), ("gemma4", "full", "every-k"),
    ("gemma4_moe", "full", "selective"), ("gemma4_moe", "lora", "selective"), ("gemma4_moe", "lora", "every-k")])
def test_checkpointing_variants_exact(family, method, mode, monkeypatch):
    """torchtitan's op SAC (every other mm of a layer: the dense MLP's, then the router Linear's
    and its adapters'), TRL's attention SAC, every-k over the sliding/full layers."""
    import ftplan.measure.torchref as TR
    from test_checkpointing_vs_torch import _job, _measure

    from ftplan.memory import activation_parts

    monkeypatch.setitem(TR.TINY_CONFIGS, "gemma4_moe", MOE)
    spec, r = _measure(family, method, mode)
    job = _job(family, method, mode, 2, 24, "hf")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
    parts = activation_parts(spec, job, backend="cpu")
    assert (parts.sac_cache_bytes, parts.checkpointed_layers) == (r.sac_cache_bytes, r.n_checkpointed)
    if method == "lora":
        assert model_states(spec, job).master_weights == r.weight_copy_bytes


def test_catalog_26b_a4b_matches_the_model_card():
    """gemma-4-26B-A4B: 25.2B parameters, 3.8B active (the card's figures; ftplan's active count
    includes the embedding, as the card's does)."""
    p = load_model_catalog()["gemma-4-26b-a4b"].spec().params
    assert (p.total, p.active) == (25_233_141_760, 3_822_530_560)
    assert (round(p.total / 1e9, 1), round(p.active / 1e9, 1)) == (25.2, 3.8)


@pytest.mark.torch
@pytest.mark.parametrize("family,recipe,ckpt", [("gemma4", "peft", False), ("gemma4", "trl", False),
                                                ("gemma4_moe", "peft", False)])
def test_qlora_exact(family, recipe, ckpt, monkeypatch):
    """bitsandbytes nf4 on CPU. Under PEFT's kbit upcast k_proj returns fp32, so with k_eq_v
    k_norm's and v_norm's ``.float()`` are one storage; the router's Linear is 4-bit (no fp32
    router weight copy as gpt_oss's)."""
    pytest.importorskip("bitsandbytes")
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _check_qlora

    monkeypatch.setitem(TR.TINY_CONFIGS, "gemma4_moe", MOE)
    _check_qlora(family, ckpt, recipe)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["gemma-4-31b", "gemma-4-26b-a4b"])
def test_tiny_config_of_the_catalog_models(name):
    """``ftplan measure --tiny``: the shrunk config keeps a sliding and a full layer of their own
    head sizes (and the MoE block), and its counts equal what transformers builds."""
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.torchref import build_model, params_by_category

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = tiny_config(load_model_catalog()[name].config)
        spec = model_from_config(cfg)
        assert spec.params.by_category() == params_by_category(build_model(cfg, device="meta"))
    assert [(g.window is None, g.attention.head_dim) for g in spec.groups] == [(False, 16), (True, 24)]
    assert spec.is_moe == (name == "gemma-4-26b-a4b")


@pytest.mark.parametrize("extra,words", [
    ({"sliding_window": 0}, "sliding_window must be >= 1"),
    ({"num_global_key_value_heads": 3}, "num_global_key_value_heads=3 must divide"),
    ({"enable_moe_block": True}, "num_experts must be an integer"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types has 3 entries"),
])
def test_bad_configs_are_listed(extra, words):
    with pytest.raises(ConfigError, match=words):
        model_from_config({**TEXT, **extra})


def test_expert_parallelism_is_refused_with_one_line():
    """EP on the Gemma 4 MoE block (a dense MLP beside the experts) is not held against
    transformers' EP engine: refused, not guessed."""
    from ftplan.job import Job, Layout
    from ftplan.memory import estimate_memory

    with pytest.raises(ConfigError, match="expert parallelism.*not modelled") as e:
        estimate_memory(load_model_catalog()["gemma-4-26b-a4b"].spec(), Job(method="full"),
                        Layout(gpus_per_node=8, strategy="fsdp", ep=8))
    assert "\n" not in str(e.value)
