"""Baidu ERNIE 4.5 MoE (``ernie4_5_moe``, ``Ernie4_5_MoeForCausalLM``) against transformers 5.24 /
PEFT 0.21.2 on CPU.

ernie4_5's attention (fp32 interleaved rope tables per layer) with an MoE block on the layers
``moe_layer_start_index <= i <= moe_layer_end_index`` (-1: the last) with ``(i + 1) %
moe_layer_interval == 0``, a dense MLP of ``intermediate_size`` on the others. The block runs the
shared experts (one MLP of ``moe_intermediate_size * moe_num_shared_experts``) first, then a router
with autocast turned off: ``x.float()`` through the fp32 ``gate.weight``, an fp32 softmax, top-k
over the probabilities plus ``e_score_correction_bias``, the chosen probabilities divided by their
sum clamped to ``moe_norm_min``, cast to the input's dtype; then transformers 5's fused grouped_mm
experts. The correction bias is an fp32 ``nn.Parameter`` with ``requires_grad=False`` (not a
buffer as in deepseek_v3): counted in the parameters (router), never trained, fp32 whatever the
model's dtype (``_keep_in_fp32_modules_strict``, with ``gate.weight``).

The generic grid (model states full / LoRA; saved activations full and LoRA under autocast, pure
bf16, checkpointing on/off, b = 1/2, sdpa; torchtitan's SAC in test_checkpointing_vs_torch) runs
the tiny ernie4_5_moe from ``TINY_CONFIGS``; this file adds Ernie4_5_MoeConfig's defaults and the
counts on meta, the MoE layer pattern, PEFT's all-linear (the qwen2_moe mapping: ParamWrapper on
the experts and the router), the frozen bias in full fine-tuning, expert parallelism, the engines'
router weight copy, FSDP1's refusal and the use_bias refusal. ``benchmarks/ernie4_5_moe_grid.py``
(by hand) runs the rest exactly: eager attention, every checkpointing variant, QLoRA (both
recipes), a variant layer pattern, the 2-rank gloo EP run and the engines (FSDP2 full / LoRA /
QLoRA, ZeRO-1/2/3 full, ZeRO-3 LoRA on 2 gloo ranks). No catalog entry: no verbatim config.json of
a published ERNIE 4.5 MoE checkpoint was found (the defaults are the 21B-A3B shape; see
``test_defaults_are_the_21b_a3b_checkpoint``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, LoraSpec, lora_targets, lora_wraps_experts
from ftplan.memory import model_states
from ftplan.model import FAMILIES, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

TINY = {"model_type": "ernie4_5_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 24}


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [
    # Ernie4_5_MoeConfig's defaults (the 21B-A3B shape) on 3 of its 28 layers: layer 0 dense, 1-2 MoE
    {"model_type": "ernie4_5_moe", "num_hidden_layers": 3},
    # layers 2 and 4 MoE (interval 2 within [2, 5]), no shared expert, an lm_head of its own
    {**TINY, "num_hidden_layers": 7, "moe_layer_start_index": 2, "moe_layer_end_index": 5, "moe_layer_interval": 2,
     "moe_num_shared_experts": 0, "tie_word_embeddings": False},
])
def test_defaults_and_params_match_transformers(cfg):
    """Every default ftplan fills in equals Ernie4_5_MoeConfig's (its end index -1 becomes the last
    layer in __post_init__; no head_dim field: hidden // heads); the counts equal transformers' on
    meta, the frozen correction biases under router."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    tfc = AutoConfig.for_model("ernie4_5_moe")
    for key, value in FAMILIES["ernie4_5_moe"].defaults.items():
        if key == "moe_layer_end_index":
            assert value == -1 and tfc.moe_layer_end_index == tfc.num_hidden_layers - 1
        elif key == "num_key_value_heads" and value is None:
            continue
        else:
            assert getattr(tfc, key, None) == value, key
    spec = model_from_config(cfg)
    assert spec.params.by_category() == F.meta_params(cfg)


def test_moe_layer_pattern():
    """Which layers are MoE, as Ernie4_5_MoeDecoderLayer decides."""
    def kinds(**kw):
        spec = model_from_config({**TINY, **kw})
        return [(g.count, g.moe is not None) for g in spec.groups]

    assert kinds() == [(1, False), (1, True)]  # start 1, end -1: layer 1
    assert kinds(num_hidden_layers=7, moe_layer_start_index=2, moe_layer_end_index=5,
                 moe_layer_interval=2) == [(5, False), (2, True)]  # layers 3 and 5
    assert kinds(num_hidden_layers=4, moe_layer_start_index=0) == [(4, True)]
    assert kinds(num_hidden_layers=4, moe_layer_start_index=4) == [(4, False)]  # none: a dense model
    spec = model_from_config({**TINY, "num_hidden_layers": 6, "moe_layer_interval": 3})
    assert [g.moe is not None for g in spec.groups] == [False, True] and spec.groups[1].count == 2  # 2, 5


def test_defaults_are_the_21b_a3b_checkpoint():
    """Ernie4_5_MoeConfig's defaults are ERNIE-4.5-21B-A3B's shape (28 layers, layer 0 dense, 64
    experts top-6, 2 shared, tied): 21,825,437,888 parameters, the safetensors total the Hugging
    Face API reports for baidu/ERNIE-4.5-21B-A3B-Thinking (F32 4,425,408 = the 27 fp32 routers and
    correction biases, BF16 21,821,012,480; repository daniel-p-green/alain-ai-learning-platform,
    out/research-baidu-ernie-4-5-21b-a3b-thinking/sources/huggingface/model.json); ~3.35B active."""
    spec = model_from_config({"model_type": "ernie4_5_moe"})
    p = spec.params
    assert p.total == 21_825_437_888 and p.router == 27 * 64 * (2560 + 1) == 4_425_408
    assert round(p.active / 1e9, 2) == 3.35
    assert [(g.count, g.moe is not None) for g in spec.groups] == [(1, False), (27, True)]


@pytest.mark.torch
def test_peft_all_linear_wraps_the_experts_and_the_router():
    """transformers maps ernie4_5_moe onto qwen2_moe's conversion pattern, so PEFT 0.21.2 moves
    gate/up/down and gate to target_parameters: ParamWrapper on the fused experts and the fp32
    router; the dense layer's MLP and the shared experts (gate_proj / up_proj / down_proj) are not
    adapted."""
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR
    from test_glm4_moe import _check_glm_all_linear

    _check_glm_all_linear("ernie4_5_moe")
    spec = model_from_config(TR.TINY_CONFIGS["ernie4_5_moe"])
    assert lora_wraps_experts(spec, LoraSpec()) and set(lora_targets(spec, LoraSpec())) == {
        "q_proj", "k_proj", "v_proj", "o_proj"}


def test_full_fine_tuning_never_trains_the_correction_bias():
    """Full fine-tuning: every parameter but the 27 x 64 fp32 correction biases is trained; they
    stay fp32 frozen weights (pure bf16 too), with no gradient and no optimizer state."""
    spec = model_from_config({"model_type": "ernie4_5_moe"})
    frozen = 27 * 64
    for precision in ("bf16-mixed", "bf16"):
        st = model_states(spec, Job(method="full", precision=precision))
        assert st.params_trainable == spec.params.total - frozen
        assert st.frozen_weights == 4 * frozen


def test_expert_parallelism_is_planned():
    """transformers has an EP plan for ernie4_5_moe (grouped_gemm experts, ep_dispatch_experts);
    the per-rank MoE block bytes of a 2-rank gloo run equal the plan's (benchmarks/
    ernie4_5_moe_grid.py)."""
    import ftplan.measure.configs as CF
    from ftplan.api import estimate
    from ftplan.expert_parallel import ep_degrees

    assert ep_degrees(model_from_config({"model_type": "ernie4_5_moe"}), 8, 8) == [2, 4, 8]
    e = estimate(CF.TINY_CONFIGS["ernie4_5_moe"], method="full", gpus=2, strategy="fsdp", ep=2)
    assert e.memory.device_total_bytes > 0


def test_use_bias_is_refused():
    with pytest.raises(ConfigError, match="use_bias: true puts a vocab-size bias"):
        model_from_config({**TINY, "use_bias": True})


#: per-rank saved bytes measured on 2 gloo ranks (the cases of tests/test_distributed_memory.py,
#: run by hand 2026-11-25; the harness's token ids left out), full fine-tuning of the tiny config at
#: 2 x 24 tokens: FSDP2 under accelerate's autocast, DeepSpeed ZeRO-3 in its bf16 mode (no autocast)
MEASURED_ENGINE_ACTIVATIONS = {"fsdp": 420_372, "zero3": 426_516}


@pytest.mark.parametrize("strategy", sorted(MEASURED_ENGINE_ACTIVATIONS))
def test_engines_cast_the_fp32_router_weight(strategy):
    """Under FSDP's bf16 gathered weights and DeepSpeed's cast module the router's
    ``weight.float()`` is a fresh fp32 copy each forward, which the linear keeps (its input runs in
    fp32 either way: autocast is off inside the router)."""
    import ftplan.measure.configs as CF
    from ftplan.job import Layout
    from ftplan.memory import estimate_memory

    spec = model_from_config(CF.TINY_CONFIGS["ernie4_5_moe"])
    job = Job(method="full", micro_batch=2, seq_len=24, gradient_checkpointing=False, loss="hf")
    c = estimate_memory(spec, job, Layout(gpus_per_node=2, strategy=strategy), backend="cpu").components
    assert c["activations"] + c["logits_and_loss"] - 2 * 24 * 8 == MEASURED_ENGINE_ACTIVATIONS[strategy]


def test_llamafactory_template():
    """LLaMA-Factory 0.9.5 registers ERNIE-4.5-21B-A3B-PT and 300B-A47B-PT with ernie_nothink."""
    from ftplan.export.llamafactory import template_for

    assert template_for(model_from_config({"model_type": "ernie4_5_moe"})) == "ernie_nothink"


def test_fsdp1_full_fine_tuning_note():
    """FSDP1's flat parameters refuse a unit mixing trainable and frozen parameters when
    use_orig_params is False (measured: ``Must flatten tensors with uniform requires_grad`` on the
    tiny model; use_orig_params=True wraps it): the answer says so for full fine-tuning only."""
    import ftplan.measure.configs as CF
    from ftplan.job import Layout
    from ftplan.memory import estimate_memory

    spec = model_from_config(CF.TINY_CONFIGS["ernie4_5_moe"])
    for method, said in (("full", True), ("lora", False)):
        notes = estimate_memory(spec, Job(method=method, micro_batch=1, seq_len=32, lora=LoraSpec(dropout=0.0)),
                                Layout(2, 1, "fsdp", fsdp_version=1)).notes
        assert any("uniform requires_grad" in n for n in notes) == said, notes
    notes = estimate_memory(spec, Job(method="full", micro_batch=1, seq_len=32), Layout(2, 1, "fsdp")).notes
    assert not any("uniform requires_grad" in n for n in notes)
