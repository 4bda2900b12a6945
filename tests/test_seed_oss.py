"""ByteDance Seed-OSS (``seed_oss``, ``SeedOssForCausalLM``) against transformers 5.24 on CPU.

llama's layers with q/k/v biases (``attention_bias``, on by default) apart from o_proj's
(``attention_out_bias``, off), head_dim 128 and two dropouts that act in training:
``residual_dropout`` on o_proj's and down_proj's outputs and ``attention_dropout`` on the attention
probabilities (SeedOssConfig's defaults: 0.1 each). Each dropout keeps its mask for backward: a bool
on CUDA, the scaled mask in the input's dtype on CPU.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny seed_oss with
residual dropout 0.1 from ``TINY_CONFIGS``; this file adds SeedOssConfig's defaults and the counts on
meta, PEFT's all-linear targets, attention dropout under eager attention, LoRA SAC, QLoRA, an fp32
LoRA base and refusals. With sdpa and attention dropout the CPU kernel is the math fallback in fp32
(it saves fp32 copies of q/k/v, the probabilities and a mask), which is not what CUDA's flash /
memory-efficient kernels keep (their RNG state): ftplan plans the CUDA kernels, not held here.
No catalog entry: no verbatim config.json of Seed-OSS-36B was found (its dropouts decide the plan).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.memory import saved_activation_bytes
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

SMALL = {"model_type": "seed_oss", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 120,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _meta_params(cfg: dict) -> dict[str, int]:
    from transformers import AutoConfig

    from ftplan.measure.torchref import params_by_category

    hf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if v is not None or k.endswith("token_id")})
    return params_by_category(F.meta_model(hf))


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [
    {"model_type": "seed_oss"},  # SeedOssConfig's defaults
    {**SMALL, "attention_out_bias": True}, {**SMALL, "attention_bias": False, "mlp_bias": True},
])
def test_defaults_and_params_match_transformers(cfg):
    """Every default ftplan fills in equals SeedOssConfig's (sliding_window is no field of it);
    attention_bias puts biases on q/k/v, attention_out_bias on o_proj, mlp_bias on gate/up/down."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("seed_oss", AutoConfig.for_model("seed_oss"), absent=("sliding_window",))
    spec = model_from_config(cfg)
    assert spec.params.by_category() == _meta_params(cfg)
    if cfg == {"model_type": "seed_oss"}:
        assert spec.attention.dropout == spec.attention.out_dropout == spec.groups[0].mlp.out_dropout == 0.1


def test_seed_oss_36b_shape():
    """The Seed-OSS-36B shape (hidden 5120, 64 layers, 80 / 8 heads of 128, intermediate 27648,
    vocabulary 155,136, untied; a public snapshot of the hub's config.json fields, index id
    57091266702, not the file itself) counts 36,151,104,512 parameters, the snapshot's figure."""
    spec = model_from_config({"model_type": "seed_oss", "hidden_size": 5120, "num_hidden_layers": 64,
                              "intermediate_size": 27648, "num_attention_heads": 80, "num_key_value_heads": 8,
                              "head_dim": 128, "vocab_size": 155136, "tie_word_embeddings": False})
    assert spec.params.total == 36_151_104_512
    a = spec.attention
    assert a.qkv_bias and not a.o_bias and a.dropout == a.out_dropout == 0.1


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("seed_oss", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@pytest.mark.torch
# (also held by hand, out of CI for time: ("full", False, 2, 24, "bf16"), pure bf16)
@pytest.mark.parametrize("method,ckpt,batch,seq,precision", [("full", False, 2, 24, "bf16-mixed"),
                                                             ("lora", True, 1, 40, "bf16-mixed")])
def test_attention_dropout_eager_exact(method, ckpt, batch, seq, precision):
    """SeedOssConfig's dropouts (0.1 each) under eager attention: the probabilities' mask
    ``(b, heads, s, s)`` and the two residual masks per layer."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    cfg = {**TR.TINY_CONFIGS["seed_oss"], "attention_dropout": 0.1}
    spec, job, r, casts = _run("seed_oss", method, ckpt, batch, seq, attn="eager", precision=precision, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def test_no_dropout_saves_no_mask():
    spec0 = model_from_config({**SMALL, "attention_dropout": 0.0, "residual_dropout": 0.0})
    spec1 = model_from_config({**SMALL, "attention_dropout": 0.0, "residual_dropout": 0.1})
    from ftplan.job import Job

    job = Job(method="lora", micro_batch=2, seq_len=24, gradient_checkpointing=False)
    d = saved_activation_bytes(spec1, job) - saved_activation_bytes(spec0, job)
    assert d == 2 * 2 * (2 * 24) * 64 * 1  # two bool masks per layer, two layers, b x s x h


def test_bad_dropout_is_one_config_error():
    with pytest.raises(ConfigError, match=r"residual_dropout must be a number in \[0, 1\)"):
        model_from_config({**SMALL, "residual_dropout": 1.5})


@pytest.mark.torch
@pytest.mark.parametrize("method,mode", [("lora", "selective")])
def test_checkpointing_variants_exact(method, mode):
    pytest.importorskip("trl")
    F.check_checkpointing_variant("seed_oss", method, mode)


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", True)])
def test_qlora_exact(recipe, ckpt):
    """bitsandbytes nf4: under PEFT's kbit upcast o_proj and down_proj return fp32, so the residual
    dropouts' CPU masks are fp32."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora("seed_oss", recipe, ckpt)


@pytest.mark.torch
def test_fp32_base_lora_exact():
    from test_memory_vs_torch import _check_fp32_base

    _check_fp32_base("seed_oss")


def test_template():
    from ftplan.export.llamafactory import template_for

    assert template_for(model_from_config({"model_type": "seed_oss"})) == "seed_oss"
