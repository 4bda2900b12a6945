"""MiniMax-M2 / M2.1 / M2.5 / M2.7 (``minimax_m2``) against transformers 5.24 and PEFT 0.21 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2, SAC) picks the tiny minimax_m2 up from ``TINY_CONFIGS``;
expert parallelism is held in tests/test_expert_parallel.py, FSDP2 / ZeRO-3 LoRA on 2 gloo ranks in
tests/test_distributed_memory.py. This file adds what is particular to the family: the config
class's defaults and counts, the legacy ``rotary_dim``, what PEFT's ``all-linear`` wraps, eager
attention, other rotary widths, QLoRA, what is refused, and the catalog entry.

What sets it apart from the families it borrows from: the q/k norms span the whole projection
(olmo2's, but with llama's RMSNorm), the rope turns ``rotary_dim`` features of each head and
``torch.cat`` s the rest back (glm4_moe's: q reaches the kernel head-major, so on CPU o_proj reads
a copy of the attention output; with the whole head rotated too), and the router scores with an
fp32 sigmoid plus ``e_score_correction_bias`` where mixtral's softmaxes: the same saved bytes, so
ftplan plans it as mixtral's router (held here and in the grid).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, lora_wraps_experts, validate_job
from ftplan.memory import saved_activation_bytes
from ftplan.model import FAMILIES, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

#: MiniMaxM2Config() built on the meta device (transformers 5.24), and the M2.7 checkpoint
DEFAULT_PARAMS = 228_689_748_992


@pytest.mark.torch
def test_defaults_are_the_config_class_defaults():
    """Every default ftplan fills in equals MiniMaxM2Config's (no attention_bias or sliding_window
    field: no biases, no window), and a config.json that only names the model type builds the
    same parameters as transformers: the whole head rotated (no rotary_dim in the defaults)."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from ftplan.measure.torchref import params_by_category

    tfc = AutoConfig.for_model("minimax_m2")
    for key, value in FAMILIES["minimax_m2"].defaults.items():
        if key in ("attention_bias", "sliding_window"):
            assert not hasattr(tfc, key) and not value, key
        else:
            assert getattr(tfc, key) == value, key
    assert "partial_rotary_factor" not in tfc.rope_parameters
    real = F.meta_model(tfc)
    spec = model_from_config({"model_type": "minimax_m2"})
    assert spec.params.by_category() == params_by_category(real)
    assert spec.params.total == DEFAULT_PARAMS
    a = spec.attention
    assert a.rotary_dim == a.head_dim == 128 and a.head_major_q  # the cat runs for a whole head too
    assert a.qk_norm and a.qk_norm_whole and a.qk_norm_sizes == (48 * 128, 8 * 128)
    moe = spec.groups[0].moe
    assert len(spec.groups) == 1 and spec.groups[0].window is None
    assert (moe.router, moe.shared, moe.num_experts, moe.top_k, moe.expert_intermediate_size) == (
        "mixtral", None, 256, 8, 1536)


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {"rotary_dim": 64},  # the checkpoints: 64 of 128
    {"rotary_dim": 64, "partial_rotary_factor": 0.25},  # a top-level factor wins
    {"rotary_dim": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.75}},
    {"rotary_dim": 32, "head_dim": 64},
    {"head_dim": 96},  # no rotary_dim: the whole head
])
def test_rotary_width_is_read_where_transformers_reads_it(extra):
    """``rotary_dim`` (the released checkpoints' legacy field) becomes ``rotary_dim / head_dim``
    unless rope_parameters or a top-level partial_rotary_factor gives the factor
    (MiniMaxM2Config.convert_rope_params_to_dict); the rope tables are int(head_dim * factor) wide."""
    from transformers import AutoConfig

    tfc = AutoConfig.for_model("minimax_m2", **extra)
    want = int(tfc.head_dim * tfc.rope_parameters.get("partial_rotary_factor", 1.0))
    assert model_from_config({"model_type": "minimax_m2", **extra}).attention.rotary_dim == want


def test_a_rotary_width_beyond_the_head_is_refused():
    with pytest.raises(ConfigError, match="rotary_dim=256 exceeds head_dim=128"):
        model_from_config({"model_type": "minimax_m2", "rotary_dim": 256})
    with pytest.raises(ConfigError, match="rotary_dim must be an integer"):
        model_from_config({"model_type": "minimax_m2", "rotary_dim": "64"})


def test_architecture_name_and_no_window():
    """The architecture alone names the family; a sliding_window in a config (MiniMax-M1's carry
    one) is ignored, as MiniMaxM2Attention has none."""
    spec = model_from_config({"architectures": ["MiniMaxM2ForCausalLM"], "sliding_window": 16,
                              "num_hidden_layers": 2})
    assert spec.family == "minimax_m2" and all(g.window is None for g in spec.groups)


@pytest.mark.torch
def test_peft_all_linear_wraps_the_experts_and_the_router():
    """transformers maps minimax_m2's weight conversions onto mixtral's, so PEFT 0.21's all-linear
    adapts q/k/v/o with ordinary LoRA and moves the experts (gate_up_proj, down_proj) and the
    router (gate.weight) to target_parameters (ParamWrapper), which refuses lora_dropout > 0:
    ftplan says so in one line."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    import ftplan.measure.torchref as TR

    cfg = TR.TINY_CONFIGS["minimax_m2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(TR.build_model(cfg, dtype="bf16"),
                               LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                          task_type="CAUSAL_LM"))
        with pytest.raises(ValueError, match="ParamWrapper does not work with lora_dropout"):
            get_peft_model(TR.build_model(cfg, dtype="bf16"),
                           LoraConfig(r=8, lora_dropout=0.1, target_modules="all-linear", task_type="CAUSAL_LM"))
    pc = model.peft_config["default"]
    assert set(pc.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(pc.target_parameters) == {"gate_up_proj", "down_proj", "gate.weight"}
    wrapped = {n.split(".")[-1]: type(m).__name__ for n, m in model.named_modules()
               if ".layers.0." in n and hasattr(m, "lora_A")}
    assert wrapped == {"q_proj": "Linear", "k_proj": "Linear", "v_proj": "Linear", "o_proj": "Linear",
                       "gate": "ParamWrapper", "experts": "ParamWrapper", "base_layer": "ParamWrapper"}
    spec = model_from_config(cfg)
    assert lora_wraps_experts(spec, LoraSpec())
    with pytest.raises(ConfigError, match="ParamWrapper, which refuses lora_dropout > 0"):
        validate_job(spec, Job(method="lora", lora=LoraSpec(dropout=0.1)))


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq", [
    ("full", False, 2, 24), ("lora", True, 2, 24), ("lora", False, 1, 40), ("full", True, 1, 40)])
def test_saved_activations_exact_eager(method, ckpt, batch, seq):
    """Eager attention: q and the repeated k/v, the fp32 softmax and its cast, o_proj's input."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("minimax_m2", method, ckpt, batch, seq, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


VARIANTS = {
    # MiniMaxM2Config's own default: no rotary_dim, the whole head rotated (the cat still runs)
    "whole_head": {"rotary_dim": None},
    # rope_parameters' factor wins over rotary_dim; head_dim = hidden // heads
    "quarter": {"head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                                     "partial_rotary_factor": 0.25}},
}


@pytest.mark.torch
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("method,ckpt", [("full", False), ("lora", True)])
def test_saved_activations_exact_rotary_variants(variant, method, ckpt):
    import ftplan.measure.torchref as TR
    from ftplan.memory import model_states
    from test_memory_vs_torch import _run

    cfg = {k: v for k, v in {**TR.TINY_CONFIGS["minimax_m2"], **VARIANTS[variant]}.items() if v is not None}
    spec, job, r, casts = _run("minimax_m2", method, ckpt, 2, 24, cfg=cfg)
    assert spec.attention.rotary_dim == (32 if variant == "whole_head" else 4)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    st = model_states(spec, job)
    assert (st.trainable_weights, st.gradients, st.optimizer_states) == (
        r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes)


@pytest.mark.torch
@pytest.mark.parametrize("recipe", ["peft", "trl"])
def test_qlora_exact(recipe):
    """QLoRA through bitsandbytes nf4 on CPU (it packs q/k/v/o only: the fused experts and the
    router stay bf16, PEFT's recipe upcasts them to fp32): model states exact for both recipes,
    saved activations exact with checkpointing (without it: tests/test_moe_qlora_activations.py,
    the fp32 merged experts of PEFT's recipe)."""
    from test_memory_vs_torch import _check_qlora

    _check_qlora("minimax_m2", True, recipe, dropout=0.0)


def test_refused_and_planned_layouts():
    """Tensor parallelism is refused in one line (transformers' tp_plan gathers q/k/v whole for the
    whole-projection norms); expert parallelism is planned (held against transformers' EP engine
    in tests/test_expert_parallel.py), and so is flash attention (``_supports_flash_attn``)."""
    spec = get_model("minimax-m2.7").spec()
    job = Job(method="lora", lora=LoraSpec(dropout=0.0))
    with pytest.raises(ConfigError, match="tensor parallelism is not modelled for minimax-m2.7's q/k norms") as e:
        validate_job(spec, job, Layout(8, 1, "fsdp", tp=2))
    assert "\n" not in str(e.value)
    # (LoRA on the attention: LoRA on EP experts is refused, tests/test_ep_lora.py)
    validate_job(spec, job.with_(lora=LoraSpec(dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))),
                 Layout(8, 1, "fsdp", ep=8))
    validate_job(spec, job.with_(attn_impl="flash"), Layout(8, 1, "fsdp"))
    with pytest.raises(ConfigError, match="expert-parallel degree 3 must divide the 256 experts"):
        validate_job(spec, job, Layout(6, 1, "fsdp", ep=3))


def test_minimax_m2_7_counts_against_the_model_card():
    """Model card (MiniMax-M2): 230B parameters in all, 10B active. transformers builds
    228,689,748,992 (the checkpoint's 228,703,644,928 tensors less its FP8 weight_scale_inv
    tensors and the 62 x 256 e_score_correction_bias buffer values); active without the input
    embedding and the lm_head (0.61B each): 9.80B."""
    m = get_model("minimax-m2.7")
    p = m.spec().params
    assert p.total == DEFAULT_PARAMS
    scales = 62 * (256 * 3 * (1536 // 128) * (3072 // 128) + 2 * 48 * 24 + 2 * 8 * 24)
    assert p.total + scales + 62 * 256 == 228_703_644_928
    assert round(p.total / 1e9) == 229 and round((p.active - p.embedding - p.lm_head) / 1e9) == 10
    assert m.spec().attention.rotary_dim == 64 and m.spec().max_position_embeddings == 204800
    assert m.config["quantization_config"]["quant_method"] == "fp8"


@pytest.mark.torch
def test_tiny_config_of_the_checkpoint_keeps_its_rotary_share():
    """``ftplan measure --tiny`` shrinks the real config: the legacy rotary_dim shrinks with the
    head (8 of 16, the checkpoints' half), the real vocabulary's bos/eos ids are dropped, and the
    shrunk model builds with ftplan's counts."""
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.torchref import build_model, params_by_category

    t = tiny_config(get_model("minimax-m2.7").config)
    assert (t["head_dim"], t["rotary_dim"], t["bos_token_id"], t["eos_token_id"]) == (16, 8, None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = build_model(t, device="meta")
    spec = model_from_config(t)
    assert real.config.rope_parameters["partial_rotary_factor"] == 0.5 and spec.attention.rotary_dim == 8
    assert params_by_category(real) == spec.params.by_category()


def test_minimax_m2_5_entry_and_its_alias():
    """MiniMax-M2.5 (alias MiniMax-M2): M2.7's architecture with a 196,608-token bound, FP8 as
    published."""
    from ftplan.catalog.models import resolve_model

    m25, m27 = get_model("minimax-m2.5"), get_model("minimax-m2.7")
    assert resolve_model("MiniMaxAI/MiniMax-M2").name == "minimax-m2.5"
    a, b = m25.spec(), m27.spec()
    assert a.params == b.params and a.groups == b.groups and a.params.total == DEFAULT_PARAMS
    assert (a.max_position_embeddings, b.max_position_embeddings) == (196608, 204800)
    assert m25.config["quantization_config"] == m27.config["quantization_config"]


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("lora", "selective"), ("lora", "every-k")])
def test_checkpointing_variants_exact(method, mode):
    """torchtitan's op SAC and every-k with PEFT's wrapped router and experts: saved bytes and the
    SAC cache exact (the grid holds full fine-tuning's SAC; selective-attention, full-reentrant and
    every-k in full fine-tuning held too, by hand)."""
    from ftplan.memory import activation_parts
    from test_checkpointing_vs_torch import _job, _measure

    spec, r = _measure("minimax_m2", method, mode)
    job = _job("minimax_m2", method, mode, 2, 24, "hf")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
    assert activation_parts(spec, job, backend="cpu").sac_cache_bytes == r.sac_cache_bytes
