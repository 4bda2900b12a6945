"""Mistral Small 4 (``mistral4``): DeepSeek-V3's MLA attention and MoE block layout with
DeepSeek-V2's softmax router and llama-4 query scaling, against transformers 5.24 and PEFT 0.21.2
on CPU.

The grid every family runs (tests/test_memory_vs_torch.py, tests/test_checkpointing_vs_torch.py:
model states, saved activations under autocast and pure bf16, full and LoRA, checkpointing on/off)
picks the tiny mistral4 up from ``TINY_CONFIGS`` (layer 0 dense, two MoE layers, 8 experts top-2 in
2 groups, one shared expert, yarn rope with llama-4 scaling); this file adds what is particular to
it: the config class's defaults (Mistral-Small-4-119B-2603's text model), that transformers 5.24's
``AutoModelForCausalLM`` has no mapping for it, PEFT's ``all-linear`` targets (no MoE weight
conversion for mistral4: the nn.Linear modules only), and the switches the tiny config does not
take: eager attention, no router renormalisation, no q LoRA rank, a plain (not interleaved) rotary,
every layer MoE.
"""

from __future__ import annotations

import warnings

import pytest

from ftplan.job import Job, LoraSpec, lora_targets, lora_wraps_experts
from ftplan.memory import model_states, saved_activation_bytes
from ftplan.model import FAMILIES, model_from_config

import family_checks as F


def _tiny():
    import ftplan.measure.torchref as TR

    return TR.TINY_CONFIGS["mistral4"]


@pytest.mark.torch
def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals Mistral4Config's (``auto_docstring`` names
    mistralai/Mistral-Small-4-119B-2603 as its checkpoint), and a config.json naming only the model
    type builds the same parameters as transformers, category by category: 118.97B in all, 6.63B
    active (5.56B without the input embedding and the lm_head), which the model card's "119B, 6.5B
    active" rounds; its vision tower is no part of the text model."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig

    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.hf import CausalLM

    tfc = AutoConfig.for_model("mistral4")
    for key, value in FAMILIES["mistral4"].defaults.items():
        if key in ("sliding_window", "head_dim"):
            # no field of the config class (head_dim: set to qk_nope + qk_rope, which MLA reads)
            assert getattr(tfc, key, None) in (None, 128), key
        else:
            assert getattr(tfc, key) == value, key
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = CausalLM.from_config(tfc)
    assert type(real).__name__ == "Mistral4ForCausalLM"
    p = model_from_config({"model_type": "mistral4"}).params
    assert p.by_category() == params_by_category(real)
    assert p.total == 118_972_826_624 and round(p.total / 1e9) == 119
    assert round((p.active - p.embedding - p.lm_head) / 1e9, 1) == 5.6
    assert round(p.active / 1e9, 1) == 6.6


@pytest.mark.torch
def test_auto_model_for_causal_lm_has_no_mapping():
    """transformers 5.24 maps mistral4 to Mistral4ForCausalLM only in its pretraining and
    image-text auto classes, so ftplan's builders name the class (measure.hf.CausalLM)."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM

    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_config(AutoConfig.for_model("mistral4", num_hidden_layers=1))


def test_a_mistral3_wrapper_plans_its_text_model():
    """Mistral-Small-4-119B-2603 is a Mistral3ForConditionalGeneration whose text_config is
    mistral4: ftplan plans the text model."""
    inner = {k: v for k, v in _tiny().items()}
    wrapped = {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"],
               "text_config": inner, "vision_config": {"model_type": "pixtral"}}
    assert model_from_config(wrapped).params == model_from_config(inner).params
    assert model_from_config(wrapped).family == "mistral4"


@pytest.mark.torch
def test_peft_all_linear_wraps_the_linear_modules_only():
    """PEFT 0.21.2 has no MoE weight mapping for mistral4: ``all-linear`` wraps attention, the
    dense layer's MLP and the shared experts (nn.Linear), neither the fused experts nor the
    router (a bare parameter); so no ParamWrapper and lora_dropout > 0 is accepted."""
    pytest.importorskip("peft")
    names = F.peft_all_linear_trainables(_tiny(), lora_dropout=0.1)
    assert any("shared_experts.gate_proj.lora_A" in n for n in names)
    assert any("layers.0.mlp.down_proj.lora_A" in n for n in names)
    assert any("q_a_proj.lora_A" in n for n in names) and any("kv_b_proj.lora_A" in n for n in names)
    assert not any("mlp.experts" in n for n in names) and not any("mlp.gate." in n for n in names)
    spec = model_from_config(_tiny())
    assert not lora_wraps_experts(spec, LoraSpec())
    wrapped = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n in names if "lora_A" in n}
    assert wrapped == set(lora_targets(spec, LoraSpec(target_modules=("all-linear",))))


VARIANTS = {
    # the tiny config as it is (the shared grid runs sdpa): eager attention
    "eager": {},
    # top-k probabilities not renormalised, a routed scaling factor
    "no_renorm": {"norm_topk_prob": False, "routed_scaling_factor": 1.5},
    # no q LoRA (q_proj), a plain rotary, every layer MoE, beta 0 (scale 1: still a product).
    # (rope_type "default" would build its tables over the whole 24-wide head, not the 8 rotated
    # features, and fail: transformers' default rope ignores partial_rotary_factor)
    "plain": {"q_lora_rank": None, "rope_interleave": False, "first_k_dense_replace": 0,
              "rope_parameters": {**_tiny()["rope_parameters"], "llama_4_scaling_beta": 0.0}},
}


@pytest.mark.torch
@pytest.mark.parametrize("variant,method,ckpt,precision", [
    ("eager", "full", False, "bf16-mixed"), ("eager", "lora", False, "bf16-mixed"),
    ("eager", "full", False, "bf16"), ("eager", "lora", True, "bf16-mixed"),
    ("no_renorm", "full", False, "bf16-mixed"), ("no_renorm", "full", False, "bf16"),
    ("plain", "full", False, "bf16-mixed"), ("plain", "lora", False, "bf16-mixed"),
])
def test_saved_activations_exact_variants(variant, method, ckpt, precision):
    pytest.importorskip("peft")
    from test_memory_vs_torch import _run

    attn = "eager" if variant == "eager" else "sdpa"
    cfg = {**_tiny(), **VARIANTS[variant]}
    spec, job, r, casts = _run("mistral4", method, ckpt, 2, 24, attn=attn, precision=precision, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    states = model_states(spec, job)
    assert states.trainable_weights == r.trainable_param_bytes and states.gradients == r.grad_bytes
    assert states.frozen_weights == (0 if method == "full" else r.frozen_param_bytes)


@pytest.mark.torch
def test_exported_script_loads_mistral4_by_its_class():
    """The exported train.py loads a mistral4 checkpoint with Mistral4ForCausalLM (no
    AutoModelForCausalLM mapping) and refuses Mistral Small 4's Mistral3ForConditionalGeneration
    checkpoint in one line (its vision tower is not what ftplan planned)."""
    import ast
    import sys as _sys

    pytest.importorskip("transformers")
    from ftplan.export import script

    tree = ast.parse(script._BODY)
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("fail", "_causal_lm_class")]
    ns: dict = {"sys": _sys}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "train.py", "exec"), ns)
    assert ns["_causal_lm_class"]({"model_type": "mistral4"}).__name__ == "Mistral4ForCausalLM"
    assert ns["_causal_lm_class"]({"model_type": "llama"}) is None
    with pytest.raises(SystemExit) as e:
        ns["_causal_lm_class"]({"model_type": "mistral3", "text_config": {"model_type": "mistral4"}})
    assert e.value.code == 2


@pytest.mark.torch
def test_tiny_config_of_the_real_layout_builds_with_ftplans_counts():
    """``ftplan measure --tiny`` on Mistral4Config's layout, flat and inside a mistral3 wrapper:
    the shrunk model runs a step in transformers and has ftplan's parameter counts (Mistral4's
    rotary turns head_dim * partial_rotary_factor features, head_dim = qk_nope + qk_rope)."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig

    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.hf import build_model

    full = {k: v for k, v in AutoConfig.for_model("mistral4").to_dict().items() if k != "transformers_version"}
    wrapped = {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": full}
    for cfg in (full, wrapped):
        tiny = tiny_config(cfg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build_model(tiny, dtype="bf16")
            ids = torch.randint(0, 512, (1, 16))
            model(input_ids=ids, labels=ids).loss.backward()
        assert model_from_config(tiny).params.by_category() == params_by_category(model)


@pytest.mark.torch
@pytest.mark.parametrize("method,precision", [("full", "bf16"), ("lora", "bf16-mixed")])
def test_mla_eager_attention_exact_for_deepseek_v3_too(method, precision):
    """Eager attention on MLA (eager_attention_forward: q, k, v, the fp32 softmax and its cast)
    is shared with DeepSeek-V3, which ftplan planned as the CPU sdpa math kernel before."""
    pytest.importorskip("peft")
    import torch
    from peft import LoraConfig, get_peft_model

    import ftplan.measure.torchref as TR

    cfg = TR.TINY_CONFIGS["deepseek_v3"]
    mixed = precision.endswith("-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="fp32" if method == "full" and mixed else "bf16",
                               attn_implementation="eager")
        if method == "lora":
            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                     target_modules="all-linear", task_type="CAUSAL_LM"))
        orig = TR._model_dtype
        if mixed:
            TR._model_dtype = lambda m: torch.float32
        try:
            r = TR.measure_step(model, batch=2, seq_len=24, gradient_checkpointing=False, dtype="bf16")
        finally:
            TR._model_dtype = orig
    casts = sum(x.nbytes for x in r.records if x.param_copy)
    job = Job(method=method, precision=precision, micro_batch=2, seq_len=24, attn_impl="eager",
              gradient_checkpointing=False,
              lora=LoraSpec(r=8, alpha=16, dropout=0.0), loss="hf")
    assert saved_activation_bytes(model_from_config(cfg), job, backend="cpu") == r.saved_activation_bytes - casts


def test_fp8_wrapped_checkpoint_note_says_the_text_model_is_planned():
    """Mistral Small 4 ships FP8 weights in a Mistral3ForConditionalGeneration: the answer says the
    plan is the dequantized text model and that the exported train.py refuses that checkpoint."""
    from ftplan.job import Layout
    from ftplan.memory import estimate_memory

    wrapped = {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"],
               "text_config": dict(_tiny()), "quantization_config": {"quant_method": "fp8"}}
    notes = estimate_memory(model_from_config(wrapped), Job(method="lora", lora=LoraSpec(dropout=0.0)),
                            Layout()).notes
    note = next(n for n in notes if "FP8" in n)
    assert "dequantize=True" in note and "text model only" in note and "block-scaled" not in note
