"""IBM Granite 3.x dense (``granite``, ``GraniteForCausalLM``) against transformers 5.24 on CPU.

Granite is llama's decoder with muP multipliers (python floats of the config): the embedding output
times ``embedding_multiplier``, each attention and MLP output times ``residual_multiplier`` before
its residual add, ``attention_multiplier`` as the softmax scale and the logits divided by
``logits_scaling``. A tensor-by-scalar mul/div saves nothing for backward, so parameters, states
and saved tensors are llama's, with one exception: the embedding is scaled *outside* the embedding
module, so with a frozen embedding under checkpointing the unscaled output (the leaf transformers'
``enable_input_require_grads`` marks) stays alive next to the first layer's checkpoint input.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny granite from
``TINY_CONFIGS``; this file adds GraniteConfig's defaults, biases and head_dim on meta, PEFT's
all-linear targets, eager attention, that leaf (live bytes of a whole step), SAC / every-k with
LoRA, TRL's fused head (which reads ``logits_scaling``), QLoRA and the catalog entry.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.job import Job
from ftplan.memory import activation_parts, saved_activation_bytes
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402

SMALL = {"model_type": "granite", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 120,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.torch
def test_defaults_match_granite_config():
    """Every default ftplan fills in equals GraniteConfig's (head_dim and sliding_window are no
    fields of it), and a config.json naming only the model type builds transformers' parameters."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("granite", AutoConfig.for_model("granite"), absent=("head_dim", "sliding_window"),
                          kv_heads_are_heads=True)
    assert model_from_config({"model_type": "granite"}).params.by_category() == F.meta_params({"model_type": "granite"})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [
    {}, {"attention_bias": True}, {"mlp_bias": True}, {"tie_word_embeddings": True},
    {"head_dim": 32},  # no GraniteConfig field, but GraniteAttention reads it when config.json has it
    {"num_key_value_heads": None},  # GraniteConfig: the attention heads
])
def test_params_match_transformers_on_meta(extra):
    """attention_bias puts a bias on q/k/v and o_proj; mlp_bias on gate/up/down."""
    pytest.importorskip("transformers")
    cfg = {**SMALL, **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params({k: v for k, v in cfg.items() if v is not None})


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("granite", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@pytest.mark.torch
@pytest.mark.parametrize("method,ckpt,batch,seq", [("full", False, 2, 24)])  # (lora, ckpt, 1, 40: by hand)
def test_eager_attention_exact(method, ckpt, batch, seq):
    """Eager: ``matmul(q, k^T) * attention_multiplier`` (a scalar) saves what llama's saves."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("granite", method, ckpt, batch, seq, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
def test_unscaled_embedding_leaf_is_held():
    """LoRA under checkpointing: the graph keeps the unscaled embedding output as a leaf (its own
    storage beside the first layer's checkpoint input, ``(b, s, h)`` in the embedding's dtype),
    which the harness finds through the graph's AccumulateGrad nodes; full fine-tuning and LoRA
    without checkpointing have none."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run("granite", "lora", True, 2, 24)
    assert r.saved_by_kind.get("graph_leaf") == 2 * 24 * 64 * 2  # bf16 base
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    for j in (job.with_(gradient_checkpointing=False), job.with_(method="full")):
        base = model_from_config({**spec.config, "model_type": "llama"})
        assert activation_parts(spec, j, backend="cpu") == activation_parts(base, j, backend="cpu")


@pytest.mark.torch
# (also held by hand, out of CI for time: ("hf", True, 2, 24, "mixed-lora-fp32-base"))
@pytest.mark.parametrize("loss,keep,batch,seq,mode", [("hf", False, 2, 32, "pure-bf16-lora")])
def test_live_step_peak_equals_formula(loss, keep, batch, seq, mode):
    """The live bytes of a whole step (every storage, not only saved ones: the leaf, the logits'
    division by logits_scaling) peak where and at what ftplan says, on the loss-peak test's llama
    shape (vocabulary 4096) as granite."""
    pytest.importorskip("peft")
    import test_loss_peak_vs_torch as L

    from ftplan.measure.loss_peak import measure_loss_peak

    cfg = {**{k: v for k, v in L.DOC["config"].items() if k != "architectures"}, "model_type": "granite",
           "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
           "logits_scaling": 16.0}
    m = measure_loss_peak(cfg, batch=batch, seq_len=seq, loss=loss, keep_output=keep, mode=mode)
    spec, job = model_from_config(cfg), m.job()
    a = activation_parts(spec, job, backend="cpu")
    assert m.forward_peak_bytes == a.forward_peak_bytes
    assert m.peak_bytes == max(a.device_saved_bytes + a.loss_saved_bytes + a.transient_bytes, a.forward_peak_bytes)


@pytest.mark.torch
@pytest.mark.parametrize("method,mode,loss", [("lora", "selective", "hf"), ("lora", "every-k", "trl")])
def test_checkpointing_variants_exact(method, mode, loss):
    """SAC and every-k with LoRA (the leaf held beside the checkpoint inputs); TRL's fused head
    divides its logit tiles by logits_scaling (it reads the config) and saves what llama's saves."""
    pytest.importorskip("trl")
    F.check_checkpointing_variant("granite", method, mode, loss)


@pytest.mark.torch
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", True)])
def test_qlora_exact(recipe, ckpt):
    pytest.importorskip("bitsandbytes")
    F.check_qlora("granite", recipe, ckpt)


@pytest.mark.torch
def test_tiny_config_of_the_catalog_entry():
    """``ftplan measure --tiny`` keeps the multipliers (the counts: test_model_params)."""
    from ftplan.measure.configs import tiny_config

    tiny = tiny_config(get_model("granite-3.3-8b").config)
    assert tiny["embedding_multiplier"] == 12.0 and tiny["logits_scaling"] == 16.0


def test_catalog_count_and_template():
    """granite-3.3-8b-instruct: tied, 40 layers, GQA 32 / 8; 8,170,864,640 parameters (card: 8B)."""
    from ftplan.export.llamafactory import template_for

    spec = get_model("granite-3.3-8b").spec()
    assert spec.params.total == 8_170_864_640 and spec.tie_word_embeddings
    assert get_model("ibm-granite/granite-3.3-8b-instruct").name == "granite-3.3-8b"
    assert template_for(spec) == "granite3"
    # the leaf: LoRA at 1 x 4096 tokens with checkpointing holds 4096 x 4096 bf16 more than llama's shape
    job = Job(method="lora", seq_len=4096)
    llama = model_from_config({**spec.config, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    diff = saved_activation_bytes(spec, job) - saved_activation_bytes(llama, job)
    assert diff == 4096 * 4096 * 2
