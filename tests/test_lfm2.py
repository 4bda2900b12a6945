"""LFM2 (``lfm2``, ``Lfm2ForCausalLM``): gated short-convolution layers beside GQA attention against
transformers 5.24 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) picks the tiny lfm2 up
from ``TINY_CONFIGS``; this file adds what is particular to it: Lfm2Config's defaults, the layer
layout from ``layer_types`` / ``full_attn_idxs``, the MLP width Lfm2MLP derives from the config,
PEFT's ``all-linear`` targets (the Conv1d is no Linear; w1/w3/w2 and both out_proj), eager
attention, biased convs, QLoRA through bitsandbytes, an fp32 LoRA base, checkpointing variants,
FLOPs, the causal-conv1d note and what is refused.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, lora_targets
from ftplan.memory import estimate_memory, saved_activation_bytes
from ftplan.model import FAMILIES, layer_group_order, model_from_config
from ftplan.runtime import flops_per_token

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

TINY = {
    "model_type": "lfm2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "conv_L_cache": 3, "max_position_embeddings": 256,
}


def _meta_params(cfg: dict) -> dict[str, int]:
    from transformers.models.lfm2 import Lfm2Config

    from ftplan.measure.torchref import params_by_category

    hf = Lfm2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    real = F.meta_model(hf)
    return hf, real, params_by_category(real)


@pytest.mark.torch
def test_defaults_match_lfm2_config():
    """Every default ftplan fills in equals Lfm2Config's (head_dim: no field, hidden // heads), and a
    config.json naming only the model type builds transformers' parameters (every layer attention:
    full_attn_idxs defaults to all of them)."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model("lfm2")
    for key, value in FAMILIES["lfm2"].defaults.items():
        if key in ("head_dim", "sliding_window", "attention_bias", "hidden_act"):
            assert getattr(tfc, key, None) is None, key  # no such field (silu, no biases: hard-coded)
        elif key in ("full_attn_idxs", "layer_types"):  # filled in by __post_init__
            assert value is None
        else:
            assert getattr(tfc, key) == value, key
    _, _, expected = _meta_params({"model_type": "lfm2"})
    spec = model_from_config({"model_type": "lfm2"})
    assert spec.params.by_category() == expected
    assert not spec.is_hybrid and spec.groups[0].mlp.intermediate_size == 8192  # int(2 * 12288 / 3)


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {},  # full_attn_idxs None: every layer attention
    {"full_attn_idxs": [1, 4]},
    {"layer_types": ["conv", "conv", "full_attention", "conv", "full_attention", "conv"]},
    # layer_types wins over full_attn_idxs (Lfm2Config reads full_attn_idxs only without layer_types)
    {"layer_types": ["full_attention", "conv"] * 3, "full_attn_idxs": [5]},
])
def test_layer_layout_matches_transformers(extra):
    pytest.importorskip("transformers")
    hf, real, expected = _meta_params({**TINY, **extra})
    spec = model_from_config({**TINY, **extra})
    kinds = ["conv" if spec.groups[i].short_conv is not None else "full_attention" for i in layer_group_order(spec)]
    assert kinds == hf.layer_types
    assert spec.params.by_category() == expected


@pytest.mark.torch
@pytest.mark.parametrize("ff", [
    {"block_ff_dim": 12288},  # LFM2-1.2B: 8192
    {"block_ff_dim": 12288, "intermediate_size": 8192},  # block_ff_dim wins (Lfm2Config pops it)
    {"intermediate_size": 6656},  # LFM2-350M style: 4437 -> 4608
    {"intermediate_size": 300, "block_multiple_of": 7, "block_ffn_dim_multiplier": 1.5},  # 200 * 1.5 -> 301
    {"intermediate_size": 300, "block_ffn_dim_multiplier": 2},  # an int multiplier: 400 -> 512
    {"intermediate_size": 10752, "block_auto_adjust_ff_dim": False},  # as given
])
def test_mlp_width_as_lfm2_mlp_derives_it(ff):
    """Lfm2MLP: with block_auto_adjust_ff_dim, int(2 * I / 3), then (a multiplier not null)
    int(multiplier * that) rounded up to block_multiple_of; config.json's block_ff_dim overrides
    intermediate_size."""
    pytest.importorskip("transformers")
    cfg = {**TINY, "layer_types": ["conv", "full_attention"] * 3, **ff}
    _, real, expected = _meta_params(cfg)
    spec = model_from_config(cfg)
    assert spec.groups[0].mlp.intermediate_size == real.model.layers[0].feed_forward.w1.out_features
    assert spec.params.by_category() == expected


@pytest.mark.torch
def test_tie_embedding_alias_and_conv_bias():
    """config.json's ``tie_embedding`` (LFM2's name) sets tie_word_embeddings; conv_bias puts a bias
    on the Conv1d, in_proj and out_proj."""
    pytest.importorskip("transformers")
    cfg = {**TINY, "layer_types": ["conv", "full_attention"] * 3, "tie_embedding": False, "conv_bias": True}
    _, real, expected = _meta_params(cfg)
    spec = model_from_config(cfg)
    assert not spec.tie_word_embeddings and spec.params.lm_head > 0
    assert real.model.layers[0].conv.conv.bias is not None
    assert spec.params.by_category() == expected


@pytest.mark.torch
def test_peft_all_linear_targets():
    """PEFT 0.21's all-linear wraps in_proj and out_proj of the short convolution, q/k/v and the
    attention's out_proj, and the MLP's w1/w3/w2; not the depthwise Conv1d, never the lm_head."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    spec = model_from_config(TR.TINY_CONFIGS["lfm2"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(TR.TINY_CONFIGS["lfm2"], dtype="bf16"), r=4, alpha=8, dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "w1", "w2", "w3"}


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq", [("full", False, 2, 24), ("lora", True, 2, 24)])
def test_eager_attention_exact(method, ckpt, batch, seq):
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("lfm2", method, ckpt, batch, seq, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("method,precision", [("full", "bf16-mixed"), ("lora", "bf16-mixed")])
def test_conv_bias_exact(method, precision):
    """conv_bias: biased in_proj/out_proj (addmm) and Conv1d; model states and saved bytes exact."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    from ftplan.memory import model_states

    cfg = {**TR.TINY_CONFIGS["lfm2"], "conv_bias": True}
    spec, job, r, casts = _run("lfm2", method, False, 2, 24, precision=precision, cfg=cfg)
    st = model_states(spec, job)
    assert (st.trainable_weights, st.gradients, st.optimizer_states, st.n_trainable_tensors) == (
        r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes, r.n_trainable_tensors)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("optimizer", ["adafactor"])
def test_other_optimizers_exact(optimizer):
    """Adafactor factors the (h, 1, K) conv weight as a matrix."""
    from test_memory_vs_torch import _run

    from ftplan.memory import model_states

    spec, job, r, _ = _run("lfm2", "full", False, 1, 16, optimizer=optimizer)
    assert model_states(spec, job).optimizer_states == r.optimizer_state_bytes


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", False)])
def test_qlora_exact(recipe, ckpt):
    """bitsandbytes nf4 on CPU. Under PEFT's kbit upcast in_proj returns fp32 and the conv weight is
    fp32: B * x is fp32, autocast casts it and the weight to bf16 for the conv, whose bf16 output is
    cast back to fp32 for C * that."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora("lfm2", recipe, ckpt)


@pytest.mark.torch
def test_fp32_base_lora_exact():
    """An fp32 LoRA base under autocast: the conv weight's bf16 cast is saved with the layer (a view
    of the parameter: autocast does not cache it), like the frozen projections' copies."""
    from test_memory_vs_torch import _check_fp32_base

    _check_fp32_base("lfm2")


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("lora", "selective"), ("full", "selective-attention"),
                                         ("lora", "every-k")])
def test_checkpointing_variants_exact(method, mode):
    """SAC caches every other projection mm (in_proj, out_proj; the conv is no mm); the attention
    kernel only in the attention layer; every-k over non-adjacent layer kinds."""
    pytest.importorskip("trl")
    F.check_checkpointing_variant("lfm2", method, mode)


LFM2_1_2B = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
    "block_ff_dim": 12288, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
    "max_position_embeddings": 128000, "tie_embedding": True,
}


def test_flops_and_notes():
    """The conv layers' projections are GEMMs among the linears (in_proj 3h x h, out_proj h x h);
    their depthwise conv adds 2 K h per token, counted with the attention kernels; the CUDA answer
    says which conv path the bytes are for."""
    spec = model_from_config(LFM2_1_2B)
    assert spec.params.total == 1_170_340_608  # the card's 1.17B
    assert sorted((g.count, g.short_conv is not None) for g in spec.groups) == [(6, False), (10, True)]
    job = Job(method="lora", micro_batch=1, seq_len=1024)
    f = flops_per_token(spec, job)
    h, s = 2048, 1024
    assert f.attention == pytest.approx(10 * 2 * 3 * h + 6 * 2.0 * (s / 2) * 32 * 128)
    proj = 10 * 2.0 * (3 * h * h + h * h) + 6 * 2.0 * (h * h + 2 * 512 * h + h * h) + 16 * 3 * 2.0 * h * 8192
    assert f.base_matmul == pytest.approx(proj + 2.0 * h * 65536)
    mem = estimate_memory(spec, job, Layout())
    assert any(n.startswith("short-convolution layers (10) planned on transformers' torch path") for n in mem.notes)
    assert not any("Gated DeltaNet" in n for n in mem.notes)


def test_refusals_are_one_line():
    spec = model_from_config(LFM2_1_2B)
    from ftplan.api import estimate

    with pytest.raises(ConfigError, match="tensor parallelism is not modelled for the linear-attention / "
                                          "short-convolution layers"):
        estimate(LFM2_1_2B, method="lora", tp=2, gpus=2)
    with pytest.raises(ConfigError, match="hybrid short-convolution model.*not modelled"):
        estimate(LFM2_1_2B, method="full", precision="fp8", gpu="h100-sxm")
    with pytest.raises(ConfigError, match="no full_attention layer"):
        model_from_config({**LFM2_1_2B, "full_attn_idxs": []})
    with pytest.raises(ConfigError, match="layer_types must be a list of full_attention / conv"):
        model_from_config({**TINY, "layer_types": ["linear_attention"] * 6})
    with pytest.raises(ConfigError, match="conv_L_cache"):
        model_from_config({**TINY, "conv_L_cache": 0})
    assert spec.is_hybrid and not spec.has_gated_deltanet


@pytest.mark.torch
def test_tiny_config_of_a_real_config():
    """``ftplan measure --tiny``: one layer of each kind (the 1.2B's first two layers are both conv),
    the derived MLP width shrinks too; counts equal transformers' on meta."""
    pytest.importorskip("torch")
    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.hf import build_model

    tiny = tiny_config(LFM2_1_2B)
    spec = model_from_config(tiny)
    assert [g.short_conv is not None for g in spec.groups] == [True, False]
    assert spec.groups[0].mlp.intermediate_size == 128
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = build_model(tiny, device="meta")
    assert spec.params.by_category() == params_by_category(real)


def test_catalog_lfm2_1_2b():
    """The catalog's LFM2-1.2B: 10 conv and 6 attention layers, the MLP 8192 wide, 1,170,340,608
    parameters (the hub safetensors' and the model card's count); LFM2's own tokenizer has no
    chars-per-token figure (no borrowed estimate)."""
    from ftplan.catalog.models import get_model
    from ftplan.catalog.tokenization import token_estimate

    entry = get_model("LiquidAI/LFM2-1.2B")
    spec = entry.spec()
    assert entry.name == "lfm2-1.2b" and spec.params.total == entry.published_params == 1_170_340_608
    assert sorted((g.count, g.short_conv is not None) for g in spec.groups) == [(6, False), (10, True)]
    assert spec.tie_word_embeddings and {g.mlp.intermediate_size for g in spec.groups} == {8192}
    assert spec.params == model_from_config(LFM2_1_2B).params
    with pytest.raises(ConfigError, match="tokenizer"):
        token_estimate("lfm2-1.2b", "lfm2")


def test_llamafactory_template():
    """LLaMA-Factory 0.9.5 registers the ``lfm2`` template (LiquidAI's ChatML-like format) for LFM2.5."""
    from ftplan.export.llamafactory import template_for

    assert template_for(model_from_config(LFM2_1_2B)) == "lfm2"


# ---- LFM2-MoE (lfm2_moe) ---------------------------------------------------------------------
_LT = ["conv"] * 24
for _i in (2, 6, 10, 14, 18, 21):
    _LT[_i] = "full_attention"
#: LFM2-8B-A1B's shape as public loaders' trimmed copies of its config.json give it (index ids
#: 61253251750, 55007484134, 58787885414: the last lists the attention layers); not a verbatim file
LFM2_8B_A1B = {
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048,
    "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 128000, "conv_bias": False, "conv_L_cache": 3,
    "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": True,
    "use_expert_bias": True, "routed_scaling_factor": 1.0, "layer_types": _LT,
}


@pytest.mark.torch
def test_lfm2_moe_8b_a1b_counts():
    """Parameters on meta equal transformers' Lfm2MoeForCausalLM category by category: 8.34B, 1.56B
    active (1.42B without the embedding), the card's "8.3B total, 1.5B active"; the dense layers'
    MLP keeps intermediate_size as given (no block_* rule)."""
    pytest.importorskip("transformers")
    from transformers.models.lfm2_moe import Lfm2MoeConfig

    from ftplan.measure.torchref import params_by_category

    hf = Lfm2MoeConfig(**{k: v for k, v in LFM2_8B_A1B.items() if k not in ("model_type", "architectures")})
    real = F.meta_model(hf)
    spec = model_from_config(LFM2_8B_A1B)
    assert spec.params.by_category() == params_by_category(real)
    assert spec.params.total == 8_339_929_856 and spec.params.active == 1_557_740_288
    assert {g.mlp.intermediate_size for g in spec.groups if g.mlp is not None} == {7168}
    kinds = ["conv" if spec.groups[i].short_conv is not None else "full_attention" for i in layer_group_order(spec)]
    assert kinds == _LT


@pytest.mark.torch
def test_lfm2_moe_peft_all_linear_leaves_experts_and_router():
    """PEFT 0.21.2 has no MoE mapping for lfm2_moe: all-linear wraps the nn.Linear modules (the dense
    layers' w1/w3/w2 too), no ParamWrapper on the fused experts or the router parameter."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    spec = model_from_config(TR.TINY_CONFIGS["lfm2_moe"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(TR.TINY_CONFIGS["lfm2_moe"], dtype="bf16"), r=4, alpha=8, dropout=0.0)
    assert not any(type(m).__name__ == "ParamWrapper" for m in applied.model.modules())
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == {
        "in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "w1", "w2", "w3"}


@pytest.mark.torch
@pytest.mark.parametrize("variant,method,ckpt", [
    ({"use_expert_bias": False}, "full", False),
    ({"routed_scaling_factor": 2.5, "norm_topk_prob": False}, "lora", True),
])
def test_lfm2_moe_router_variants_exact(variant, method, ckpt):
    """Without the expert bias top-k runs on the sigmoid scores themselves; without renormalisation
    the gathered scores are only scaled: saved bytes exact either way."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    cfg = {**TR.TINY_CONFIGS["lfm2_moe"], **variant}
    spec, job, r, casts = _run("lfm2_moe", method, ckpt, 2, 24, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
def test_lfm2_moe_eager_exact():
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("lfm2_moe", "lora", False, 2, 24, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_lfm2_moe_refusals():
    from ftplan.api import estimate

    with pytest.raises(ConfigError, match="expert parallelism on .*hybrid short-convolution layers is not modelled"):
        estimate(LFM2_8B_A1B, method="lora", ep=2, gpus=2, strategy="fsdp")
    with pytest.raises(ConfigError, match="tensor parallelism is not modelled"):
        estimate(LFM2_8B_A1B, method="lora", tp=2, gpus=2)
    with pytest.raises(ConfigError, match="layer_types is required for lfm2_moe"):
        model_from_config({k: v for k, v in LFM2_8B_A1B.items() if k != "layer_types"})


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", True)])  # (without checkpointing and TRL's: exact too, by hand)
def test_lfm2_moe_qlora_exact(recipe, ckpt):
    """bitsandbytes packs the nn.Linear modules; the fused experts and the router parameter stay in
    the load dtype (fp32 after PEFT's kbit upcast): states and saved bytes exact."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora("lfm2_moe", recipe, ckpt)
