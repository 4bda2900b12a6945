"""Llama 4 text (``llama4_text``): Scout / Maverick's language model against transformers 5.24 and
PEFT 0.21 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2, SAC and every-k in test_checkpointing_vs_torch) picks the tiny
llama4_text up from ``TINY_CONFIGS`` (4 layers: rope + chunked attention and NoPE + full attention,
each dense and MoE). This file adds what is particular to it: the config class's defaults and layer
schedules (``moe_layers`` / ``interleave_moe_layer_step``, ``no_rope_layers``, ``layer_types``, a
null ``attention_chunk_size``), the image-text config loading as ``Llama4ForCausalLM``, PEFT's
``all-linear`` (it wraps the router and fails: ftplan plans and exports the other linears), eager
attention (softmax in the scores' dtype) and sequences shorter than a chunk / spanning several.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.job import Job, Layout, LoraSpec, lora_targets, peft_target_modules, validate_job
from ftplan.memory import saved_activation_bytes
from ftplan.model import FAMILIES, layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _tiny():
    from ftplan.measure.configs import TINY_CONFIGS

    return TINY_CONFIGS["llama4_text"]


def _kinds(spec):
    """(rope, chunked, moe) of every decoder layer, in order."""
    return [(spec.groups[i].attention.rope, spec.groups[i].attention.chunk is not None,
             spec.groups[i].moe is not None) for i in layer_group_order(spec)]


def _hf_kinds(tfc):
    return [(bool(tfc.no_rope_layers[i]), tfc.layer_types[i] == "chunked_attention", i in tfc.moe_layers)
            for i in range(tfc.num_hidden_layers)]


@pytest.mark.torch
@pytest.mark.parametrize("overrides", [
    {},  # Llama4TextConfig's defaults: Scout's shape, 48 MoE layers
    {"num_hidden_layers": 8, "interleave_moe_layer_step": 2, "use_qk_norm": False, "num_local_experts": 128},
    {"num_hidden_layers": 5, "moe_layers": [0, 3], "no_rope_layers": [1, 0, 1, 0, 1], "attention_bias": True},
    {"num_hidden_layers": 4, "attention_chunk_size": None, "tie_word_embeddings": True},
    {"num_hidden_layers": 3, "layer_types": ["full_attention", "chunked_attention", "full_attention"],
     "moe_layers": []},
])
def test_params_and_layer_schedule_match_transformers(overrides):
    """Every default ftplan fills in is Llama4TextConfig's; a config.json naming the model type
    (and any of these schedules) builds transformers' parameters category by category, and the
    same rope / chunked / MoE kind for every layer."""
    pytest.importorskip("transformers")
    from transformers import Llama4TextConfig

    from ftplan.measure.accounting import params_by_category

    if not overrides:
        tfc0 = Llama4TextConfig()
        for key, value in FAMILIES["llama4_text"].defaults.items():
            if key == "sliding_window":  # (no field of Llama4TextConfig)
                continue
            want = getattr(tfc0, key)
            if key in ("moe_layers", "no_rope_layers", "layer_types"):
                want = None  # __post_init__ fills them from the interval/step defaults
            assert want == value, key
    tfc = Llama4TextConfig(**overrides)
    real = F.meta_model(tfc)
    assert type(real).__name__ == "Llama4ForCausalLM"
    spec = model_from_config({"model_type": "llama4_text", **overrides})
    assert spec.params.by_category() == params_by_category(real)
    assert _kinds(spec) == _hf_kinds(tfc)


@pytest.mark.torch
def test_image_text_config_loads_the_text_causal_lm():
    """AutoModelForCausalLM on a llama4 (image-text) config builds Llama4ForCausalLM from
    text_config alone (no vision tower; from_pretrained of a Llama4ForConditionalGeneration
    checkpoint loads its language_model weights and skips the vision ones); ftplan's counts equal
    it category by category, with or without the inner model_type."""
    pytest.importorskip("transformers")
    from transformers import Llama4Config

    from ftplan.measure.accounting import params_by_category

    text = {k: v for k, v in _tiny().items() if k != "model_type"}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14, "vision_output_dim": 64, "projector_input_dim": 64,
              "projector_output_dim": 64}
    hf = Llama4Config(text_config=text, vision_config=vision)
    real = F.meta_model(hf)
    assert type(real).__name__ == "Llama4ForCausalLM"
    assert not any("vision" in n for n, _ in real.named_parameters())
    spec = model_from_config({"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
                              "text_config": {**text, "model_type": "llama4_text"}, "vision_config": vision})
    assert spec.family == "llama4_text" and spec.is_moe
    assert spec.params.by_category() == params_by_category(real)
    assert model_from_config({"model_type": "llama4", "text_config": text}).params == spec.params


@pytest.mark.torch
def test_peft_all_linear_fails_and_ftplan_plans_the_other_linears():
    """PEFT 0.21's all-linear wraps Llama4Router (an nn.Linear subclass whose forward returns
    (scores, logits)) and LoRA's forward fails on the tuple; ftplan's all-linear is every other
    nn.Linear (attention, dense MLPs, the shared expert), exported as that list, which PEFT wraps
    without the fused experts or the router (no ParamWrapper: dropout allowed)."""
    pytest.importorskip("peft")
    import torch

    import ftplan.measure.torchref as TR

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        broken = TR.apply_lora(TR.build_model(_tiny(), dtype="bf16"), r=4, alpha=8, dropout=0.0).model
        ids = torch.randint(0, 512, (1, 8))
        with pytest.raises(AttributeError, match="tuple"):
            broken(input_ids=ids, labels=ids)
    spec = model_from_config(_tiny())
    lo = LoraSpec(r=4)
    assert set(lora_targets(spec, lo)) == set(LINEARS)
    assert peft_target_modules(spec, lo) == LINEARS
    assert peft_target_modules(spec, LoraSpec(r=4, target_modules=("q_proj",))) == ["q_proj"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(_tiny(), dtype="bf16"), r=4, alpha=8, dropout=0.1,
                                target_modules=LINEARS)
        applied.model(input_ids=ids, labels=ids).loss.backward()
    names = [n for n, _ in applied.model.named_parameters() if "lora_" in n]
    assert any(".shared_expert." in n for n in names) and any("layers.0.feed_forward.gate_proj" in n for n in names)
    assert not any(".experts." in n or ".router." in n for n in names)


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq,precision,attn", [
    ("full", False, 2, 24, "bf16-mixed", "eager"),  # fp32 mask: fp32 softmax + its bf16 cast
    ("lora", False, 1, 40, "bf16-mixed", "eager"),  # bf16 mask: the softmax stays bf16
    ("lora", True, 2, 24, "bf16-mixed", "eager"),  # a mask per layer kind in the closures
    ("full", False, 1, 12, "bf16-mixed", "sdpa"),  # shorter than a chunk: no chunked mask
    ("lora", True, 1, 40, "bf16-mixed", "sdpa"),  # three chunks: a (b, 1, s, s) bool mask per closure
])
def test_saved_activations_eager_and_chunks(method, ckpt, batch, seq, precision, attn):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("llama4_text", method, ckpt, batch, seq, precision=precision, attn=attn)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_expert_parallelism_is_refused():
    """transformers has no expert-parallel plan for Llama 4 (every token reaches every expert):
    --ep is refused with one line, and the planner searches no EP layout."""
    from ftplan.errors import ConfigError
    from ftplan.expert_parallel import ep_degrees

    spec = model_from_config(_tiny())
    with pytest.raises(ConfigError, match="no expert-parallel plan for Llama 4"):
        validate_job(spec, Job(method="lora"), Layout(gpus_per_node=4, strategy="fsdp", ep=2))
    assert ep_degrees(spec, 8, 8) == []


def test_catalog_counts():
    """Scout: 48 MoE layers (16 experts top-1), 36 rope/chunked + 12 NoPE; the text model is
    107.77B (the card's 109B adds the 1.91B vision tower), 17.17B active. Maverick: MoE on the odd
    layers (128 experts top-1), dense MLPs on the even ones, no q/k norm; 400.71B, 17.18B active."""
    from ftplan.catalog.models import get_model

    scout = get_model("llama-4-scout").spec()
    assert sorted((g.count, g.attention.rope, g.moe is not None) for g in scout.groups) == [
        (12, False, True), (36, True, True)]
    assert scout.params.total == 107_769_861_120 and round(scout.params.active / 1e9, 2) == 17.17
    assert all(g.attention.l2_qk_norm == g.attention.rope for g in scout.groups)
    mav = get_model("llama-4-maverick").spec()
    assert sorted((g.count, g.attention.rope, g.moe is not None) for g in mav.groups) == [
        (12, False, True), (12, True, True), (24, True, False)]
    assert mav.params.total == 400_711_848_960 and round(mav.params.active / 1e9, 2) == 17.18
    assert not any(g.attention.l2_qk_norm for g in mav.groups)
    assert all(g.attention.chunk == 8192 for g in mav.groups if g.attention.rope)


def test_exports_name_the_linears():
    """The exported script, axolotl and LLaMA-Factory configs spell all-linear out for Llama 4;
    LLaMA-Factory's template is 0.9.5's llama4."""
    from ftplan.catalog.models import get_model
    from ftplan.export.axolotl import axolotl_config
    from ftplan.export.llamafactory import llamafactory_config, template_for
    from ftplan.export.script import script_constants

    spec = get_model("llama-4-scout").spec()
    job, layout = Job(method="lora"), Layout(gpus_per_node=8, strategy="fsdp")
    assert script_constants(spec, job, layout, model_ref="m")["LORA_TARGET_MODULES"] == LINEARS
    assert axolotl_config(spec, job, layout, kind="fsdp", hsdp=False, model_ref="m",
                          dataset=None)["lora_target_modules"] == LINEARS
    lf = llamafactory_config(spec, job, layout, kind="fsdp", model_ref="m")
    assert lf["lora_target"] == ",".join(LINEARS) and template_for(spec) == "llama4"


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", False)])  # (PEFT with checkpointing: exact too)
def test_qlora_exact(recipe, ckpt):
    """QLoRA through bitsandbytes nf4 on CPU: the q/k/v/o, dense MLP and shared-expert linears are
    4-bit; the 3-D experts and the router are not (PEFT's recipe upcasts them to fp32, and autocast's
    bf16 copies of the experts and the router are kept by their bmm / linear for the input's
    gradient; TRL's keeps them bf16). Model states and saved activations byte-exact."""
    F.check_qlora("llama4_text", recipe, ckpt)
