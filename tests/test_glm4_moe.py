"""glm4_moe (GLM-4.5 / 4.5-Air / 4.6 / 4.7) against the installed transformers and PEFT.

The tiny config (``TINY_CONFIGS["glm4_moe"]``) runs through the shared exact tests
(tests/test_memory_vs_torch.py, tests/test_checkpointing_vs_torch.py); here: the family's defaults,
what PEFT's ``all-linear`` wraps, and the switches the tiny config does not take (no q/k norms, no
biases, another rotary share, eager attention)."""

from __future__ import annotations

import warnings

import pytest

from ftplan.catalog.models import load_model_catalog
from ftplan.job import Job, LoraSpec, lora_wraps_experts
from ftplan.model import FAMILIES, model_from_config

import family_checks as F


def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals Glm4MoeConfig's (head_dim: no field, hidden // heads),
    and a config.json that only names the model type builds the same parameters as transformers."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.measure.torchref import params_by_category

    tfc = AutoConfig.for_model("glm4_moe")
    F.assert_defaults_are("glm4_moe", tfc, absent=("sliding_window",), skip=("head_dim",))
    assert not hasattr(tfc, "head_dim") and FAMILIES["glm4_moe"].defaults["head_dim"] is None
    assert tfc.rope_parameters["partial_rotary_factor"] == FAMILIES["glm4_moe"].partial_rotary_factor
    with torch.device("meta"):
        real = AutoModelForCausalLM.from_config(tfc)
    spec = model_from_config({"model_type": "glm4_moe"})
    assert spec.params.by_category() == params_by_category(real)
    assert spec.attention.rotary_dim == int(4096 // 96 * 0.5)


def test_rotary_share_is_read_where_transformers_reads_it():
    base = {"model_type": "glm4_moe", "head_dim": 128}
    assert model_from_config(base).attention.rotary_dim == 64
    assert model_from_config({**base, "partial_rotary_factor": 0.25}).attention.rotary_dim == 32
    rp = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.75}
    assert model_from_config({**base, "partial_rotary_factor": 0.25, "rope_parameters": rp}).attention.rotary_dim == 96
    # other families keep a whole-head rope
    assert model_from_config({"model_type": "llama"}).attention.rotary_dim is None


def _check_glm_all_linear(family: str) -> set[str]:
    """PEFT 0.21 all-linear on a GLM MoE family (glm4_moe, glm4_moe_lite): ParamWrapper on the fused
    experts and the fp32 router; the dense first layer's MLP and the shared experts not adapted.
    Returns the trainable parameter names."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    names = F.peft_all_linear_trainables(TR.TINY_CONFIGS[family])
    F.assert_wraps_experts_and_router(names)
    assert not any("shared_experts" in n for n in names)
    assert not any("layers.0.mlp" in n for n in names)
    return names


def test_peft_all_linear_wraps_the_experts_and_the_router():
    """transformers' conversion mapping sends glm4_moe to the qwen2_moe pattern, so PEFT 0.21
    moves gate/up/down and gate to target_parameters: ParamWrapper on the fused experts and on the
    fp32 router, and the dense layer's MLP and the shared experts are not adapted."""
    import ftplan.measure.torchref as TR

    _check_glm_all_linear("glm4_moe")
    spec = model_from_config(TR.TINY_CONFIGS["glm4_moe"])
    assert lora_wraps_experts(spec, LoraSpec())


VARIANTS = {
    # GLM-4.5-Air: no q/k norms, q/k/v biases
    "no_qk_norm": {"use_qk_norm": False},
    # no biases at all, a quarter of each head rotated (rope_parameters wins over the top level)
    "quarter_rotary": {"attention_bias": False, "partial_rotary_factor": 0.5,
                       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.25}},
}


@pytest.mark.torch
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("method,ckpt,attn", [("full", False, "sdpa"), ("lora", True, "sdpa"),
                                              ("full", False, "eager")])
def test_saved_activations_exact_variants(variant, method, ckpt, attn):
    pytest.importorskip("peft")
    import torch
    from peft import LoraConfig, get_peft_model

    import ftplan.measure.torchref as TR
    from ftplan.memory import model_states, saved_activation_bytes

    cfg = {**TR.TINY_CONFIGS["glm4_moe"], **VARIANTS[variant]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="fp32" if method == "full" else "bf16", attn_implementation=attn)
        if method == "lora":
            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                     target_modules="all-linear", task_type="CAUSAL_LM"))
        orig = TR._model_dtype
        TR._model_dtype = lambda m: torch.float32  # HF Trainer bf16=True: autocast
        try:
            r = TR.measure_step(model, batch=2, seq_len=24, gradient_checkpointing=ckpt, dtype="bf16")
        finally:
            TR._model_dtype = orig
    casts = sum(x.nbytes for x in r.records if x.param_copy)
    job = Job(method=method, micro_batch=2, seq_len=24, gradient_checkpointing=ckpt, attn_impl=attn,
              lora=LoraSpec(r=8, alpha=16, dropout=0.0), loss="hf")
    spec = model_from_config(cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    states = model_states(spec, job)
    assert states.trainable_weights == r.trainable_param_bytes and states.gradients == r.grad_bytes
    assert states.frozen_weights == (0 if method == "full" else r.frozen_param_bytes)


def test_glm_4_5_air_counts_against_the_model_card():
    """Model card: 106B parameters in all, 12B active. transformers builds no MTP layer (the
    checkpoint's model.layers.46) and neither does ftplan: 106.85B; the card's active 12B leaves the
    input embedding and the lm_head out (12.18B), ftplan counts them (13.42B)."""
    p = load_model_catalog()["glm-4.5-air"].spec().params
    assert p.total == 106_852_245_504
    assert int(p.total / 1e9) == 106
    assert round((p.active - p.embedding - p.lm_head) / 1e9) == 12


#: per-rank saved bytes measured on 2 gloo ranks (tests/test_distributed_memory.py, 2026-11-24:
#: the harness's token ids left out), full fine-tuning of the tiny configs at 2 x 24 tokens: FSDP
#: under accelerate's autocast, DeepSpeed ZeRO-3 in its bf16 mode (no autocast)
MEASURED_ENGINE_ACTIVATIONS = {("glm4_moe", "fsdp"): 766_276, ("deepseek_v3", "fsdp"): 724_036,
                               ("glm4_moe", "zero3"): 783_108, ("deepseek_v3", "zero3"): 740_868}


@pytest.mark.parametrize("family,strategy", sorted(MEASURED_ENGINE_ACTIVATIONS))
def test_estimate_follows_the_engines_router_dtypes(family, strategy):
    """estimate_memory plans the fp32 router path as each engine runs it (sharding.engine_compute):
    under FSDP's bf16 weights and autocast the logits, scores and top-k weights are bf16 and the
    linear saves a bf16 copy of the upcast weight; under DeepSpeed's cast module the path runs in
    fp32 and saves an fp32 copy. Its CPU form equals the bytes measured per rank."""
    from ftplan.job import Layout
    from ftplan.measure.configs import TINY_CONFIGS
    from ftplan.memory import estimate_memory

    spec = model_from_config(TINY_CONFIGS[family])
    job = Job(method="full", micro_batch=2, seq_len=24, gradient_checkpointing=False, loss="hf")
    mem = estimate_memory(spec, job, Layout(gpus_per_node=2, strategy=strategy), backend="cpu")
    c = mem.components
    token_ids = 2 * 24 * 8
    saved = c["activations"] + c["logits_and_loss"]
    if strategy == "fsdp":
        # FSDP2's breakdown is the moment of its peak (sharding.fsdp2_moment_peak: here the last
        # layer's backward, its own saved tensors and the loss's already freed): the forward's
        # saved set is read from the same parts estimate_memory places
        from ftplan.catalog.constants import memory_constants
        from ftplan.memory import model_states, saved_activation_bytes
        from ftplan.sharding import activation_job, engine_compute, layout_memory

        layout = Layout(gpus_per_node=2, strategy=strategy)
        assert any(n.startswith("fsdp2: the forward/backward peak is at") for n in mem.notes)
        lm = layout_memory(spec, job, layout, model_states(spec, job), memory_constants(), "cpu")
        saved = saved_activation_bytes(spec, activation_job(job, lm), layout, backend="cpu",
                                       engine_compute=engine_compute(job, layout))
    assert saved - token_ids == MEASURED_ENGINE_ACTIVATIONS[(family, strategy)]
