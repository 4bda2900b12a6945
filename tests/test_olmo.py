"""OLMo 2 (``olmo2``) and OLMo 3 (``olmo3``) against transformers 5.24 on CPU.

The grid every family runs (model states, saved activations under autocast and pure bf16, full and
LoRA, checkpointing on/off, b = 1/2, SAC) picks the tiny olmo2/olmo3 up from ``TINY_CONFIGS``; this
file adds what is particular to them: the config classes' defaults, OLMo 3's layer_types, the q/k
norms over the whole projection, eager attention, the checkpointing variants, TRL's head and
offloading, QLoRA, an fp32 LoRA base, tensor parallelism refused, and the catalog entries.

What autograd saves differs from llama's in three places, each held here by the exact tests (turn
one off and the tiny olmo3's LoRA step is off by 3,072 B, 12,480 B or 2,304 B): no input norm
(q/k/v and gate/up read the residual stream; the post-attention and post-feed-forward norms read
o_proj's and down_proj's compute-dtype outputs), OLMo's rotary tables stay fp32 (and OLMo 3 keeps
one pair per layer type), and the q/k norms keep one fp32 rsqrt per token, not per head.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from ftplan.catalog.models import get_model
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout
from ftplan.memory import estimate_memory, saved_activation_bytes
from ftplan.model import FAMILIES, layer_group_order, model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
@pytest.mark.parametrize("family", ["olmo2", "olmo3"])
def test_defaults_are_the_config_class_defaults(family):
    """Every default ftplan fills in equals Olmo2Config's / Olmo3Config's (head_dim: no field,
    hidden // heads), and a config.json that only names the model type builds the same parameters
    as transformers (OLMo 3: every 4th layer full attention, the others a 4096-token window)."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from ftplan.measure.torchref import params_by_category

    tfc = AutoConfig.for_model(family)
    for key, value in FAMILIES[family].defaults.items():
        if key == "num_key_value_heads":  # None: as many as the attention heads
            assert value is None and tfc.num_key_value_heads == tfc.num_attention_heads
        elif key == "head_dim" or (key == "sliding_window" and family == "olmo2"):
            assert getattr(tfc, key, None) is None and value is None, key
        else:
            assert getattr(tfc, key) == value, key
    real = F.meta_model(tfc)
    spec = model_from_config({"model_type": family})
    assert spec.params.by_category() == params_by_category(real)
    if family == "olmo3":
        windows = [spec.groups[i].window for i in layer_group_order(spec)]
        assert windows == [4096 if t == "sliding_attention" else None for t in tfc.layer_types]


@pytest.mark.torch
@pytest.mark.parametrize("extra", [{"num_hidden_layers": 8}, {"num_hidden_layers": 6},
                                   {"layer_types": ["full_attention", "sliding_attention"] * 2}])
def test_olmo3_layer_layout_matches_transformers(extra):
    from transformers.models.olmo3 import Olmo3Config

    cfg = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 120, "num_hidden_layers": 4,
           "sliding_window": 16, **extra}
    hf = Olmo3Config(**cfg)
    spec = model_from_config({"model_type": "olmo3", **cfg})
    windows = [spec.groups[i].window for i in layer_group_order(spec)]
    assert windows == [16 if t == "sliding_attention" else None for t in hf.layer_types]


@pytest.mark.torch
def test_qk_norms_span_the_whole_projection():
    """q_norm / k_norm are RMSNorms of heads x head_dim and kv_heads x head_dim features (one
    rsqrt per token), not per-head norms of head_dim as qwen3's."""
    import ftplan.measure.torchref as TR

    for family in ("olmo2", "olmo3"):
        cfg = TR.TINY_CONFIGS[family]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            attn = TR.build_model(cfg).model.layers[0].self_attn
        a = model_from_config(cfg).attention
        assert a.qk_norm and a.qk_norm_whole
        assert a.qk_norm_sizes == (attn.q_norm.weight.numel(), attn.k_norm.weight.numel()) == (64, 32)
        assert not hasattr(TR.build_model(cfg).model.layers[0], "input_layernorm")
    assert model_from_config(TR.TINY_CONFIGS["qwen3"]).attention.qk_norm_sizes == (32, 32)


@pytest.mark.torch
@pytest.mark.parametrize("family,method,ckpt,batch,seq", [
    ("olmo2", "full", False, 2, 24), ("olmo2", "lora", True, 2, 24),
    ("olmo3", "lora", False, 1, 40), ("olmo3", "full", True, 1, 40)])
def test_saved_activations_exact_eager(family, method, ckpt, batch, seq):
    """Eager attention: repeated k/v, the fp32 softmax and its cast, per layer kind masks."""
    from test_memory_vs_torch import _run

    spec, job, r, casts = _run(family, method, ckpt, batch, seq, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("cfg_extra,method", [
    ({"num_hidden_layers": 4, "layer_types": None}, "lora"),  # Olmo3Config's own layout: s, s, s, full
    ({"num_hidden_layers": 4, "layer_types": None}, "full"),
    ({"layer_types": ["full_attention"] * 3}, "lora"),  # one layer type: one pair of rope tables
    ({"layer_types": ["sliding_attention"] * 3}, "full"),
])
def test_olmo3_layer_kinds_exact(cfg_extra, method):
    """OLMo 3 builds one pair of fp32 cos/sin tables per layer type the model has; the sliding
    layers mask beyond the 16-token window (s = 40)."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    cfg = {k: v for k, v in {**TR.TINY_CONFIGS["olmo3"], **cfg_extra}.items() if v is not None}
    spec, job, r, casts = _run("olmo3", method, False, 1, 40, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("family,method,mode", [
    ("olmo2", "lora", "selective"), ("olmo2", "full", "selective-attention"), ("olmo2", "lora", "full-reentrant"),
    ("olmo3", "lora", "every-k"), ("olmo3", "full", "every-k"), ("olmo3", "lora", "selective")])
def test_checkpointing_variants_exact(family, method, mode):
    """SAC caches the projections' mm outputs and the attention kernel's; every-k over OLMo 3's
    non-adjacent sliding/full layers; reentrant checkpointing."""
    pytest.importorskip("trl")
    F.check_checkpointing_variant(family, method, mode)


@pytest.mark.torch
@pytest.mark.parametrize("family,method,mode,offload", [("olmo2", "full", "none", False),
                                                        ("olmo3", "lora", "full", False),
                                                        ("olmo2", "lora", "full", True),
                                                        ("olmo3", "full", "none", True)])
def test_trl_head_and_offloading_exact(family, method, mode, offload):
    """TRL SFTTrainer's fused LM head after OLMo's fp32-weight final norm; TRL's activation
    offloading: every saved byte lands on the host or stays, exactly as planned."""
    pytest.importorskip("trl")
    import test_checkpointing_vs_torch as C

    from ftplan.memory import activation_parts

    spec, r = C._measure(family, method, mode, loss="trl", offload=offload)
    job = C._job(family, method, mode, 2, 24, "trl", activation_offloading=offload)
    if not offload:
        assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
        return
    p = activation_parts(spec, job, backend="cpu", consts=C._offload_consts())
    assert p.offloaded_bytes + p.device_saved_bytes + p.loss_saved_bytes == r.host_bytes + r.device_bytes - \
        r.weight_copy_bytes
    assert p.offloaded_bytes == r.host_bytes


@pytest.mark.torch
@pytest.mark.parametrize("family,recipe,ckpt", [("olmo2", "peft", False), ("olmo3", "trl", True)])
def test_qlora_exact(family, recipe, ckpt):
    """bitsandbytes nf4 on CPU: PEFT's kbit upcast (fp32 norms: the post-norms' fp32 products) and
    TRL's bf16 recipe."""
    pytest.importorskip("bitsandbytes")
    F.check_qlora(family, recipe, ckpt)


@pytest.mark.torch
def test_fp32_base_lora_exact():
    from test_memory_vs_torch import _check_fp32_base

    _check_fp32_base("olmo3")


def test_tensor_parallelism_is_refused():
    """transformers' OLMo tp_plan gathers q/k/v whole on every rank (the norms span the whole
    projection): not the head-parallel split ftplan plans, so it refuses with one line."""
    with pytest.raises(ConfigError, match="tensor parallelism is not modelled.*q/k norms"):
        estimate_memory(get_model("olmo-2-13b").spec(), Job(method="lora"), Layout(gpus_per_node=2, tp=2))
    estimate_memory(get_model("olmo-2-13b").spec(), Job(method="lora"), Layout(gpus_per_node=2, strategy="ddp"))


def test_catalog_counts():
    """OLMo-2-1124-13B: its safetensors index holds 54,864,793,600 bytes of fp32 tensors =
    13,716,198,400 parameters; the 7B (card: 7B) builds 7,298,617,344. Both: 2 hidden-size norms and
    two whole-projection q/k norms per layer, untied 100,352-row lm_head."""
    s13 = get_model("olmo-2-13b").spec()
    assert s13.params.total == 13_716_198_400 == 54_864_793_600 // 4
    assert s13.params.norms == 5120 + 40 * (2 * 5120 + 2 * 5120)
    assert get_model("olmo-2-7b").spec().params.total == 7_298_617_344
    assert s13.family == "olmo2" and not s13.tie_word_embeddings


@pytest.mark.torch
@pytest.mark.parametrize("name", ["olmo-2-7b", "olmo-2-13b"])
def test_tiny_config_of_the_catalog_entries(name):
    """``ftplan measure --tiny`` on the catalog's OLMo 2 models: counts equal transformers' on meta."""
    pytest.importorskip("torch")
    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.hf import build_model

    tiny = tiny_config(get_model(name).config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = build_model(tiny, device="meta")
    assert model_from_config(tiny).params.by_category() == params_by_category(real)


@pytest.mark.torch
def test_tiny_config_of_an_olmo3_config_keeps_both_layer_kinds():
    from ftplan.measure.configs import tiny_config

    cfg = {"model_type": "olmo3", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 8,
           "sliding_window": 4096, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2}
    tiny = tiny_config(cfg)
    assert tiny["layer_types"] == ["sliding_attention", "full_attention"]
    assert [g.window for g in model_from_config(tiny).groups] == [4096, None]


def test_olmo2_has_no_sliding_window():
    """Olmo2Attention has no window: a stray sliding_window in an olmo2 config.json changes nothing
    (as transformers ignores it)."""
    assert [g.window for g in model_from_config({"model_type": "olmo2", "sliding_window": 16}).groups] == [None]


@pytest.mark.torch
def test_fsdp2_casts_the_fp32_rope_tables_at_every_layer():
    """FSDP2 as accelerate runs it (``MixedPrecisionPolicy(cast_forward_inputs=True)``) casts
    OLMo's fp32 cos/sin to bf16 in every decoder layer's pre-forward: each layer saves its own
    engine-made copy (2 per layer, ``(1, s, head_dim)`` in bf16) and the fp32 tables are not saved.
    On 2 gloo ranks: the saved-tensor log shows the bf16 copies at each layer's rope and no fp32
    table, and the model-owned activations the harness measures are ftplan's figure less exactly
    those engine-made copies (which the harness files under the engine, not the model)."""
    pytest.importorskip("peft")
    import test_distributed_memory as D

    from ftplan.measure.distributed import run_cases

    (case,) = D.OLMO_SAVED_CASES
    # measured in test_distributed_memory's process group when that ran first (one spawn less)
    ranks = D.TWO_RANK_RESULTS.get(case) or run_cases([case], 2, timeout_s=600)[0]
    assert not isinstance(ranks, str), ranks
    hd, layers = 16, 3
    copies = layers * 2 * case.seq_len * hd * 2
    for m in ranks:
        rope = [r for r in m.detail["saved"] if "apply_rotary_pos_emb" in r[-1]]
        assert {(r[1], tuple(r[2])) for r in rope} == {("bfloat16", (1, 1, case.seq_len, hd))}
        assert len(rope) == 4 * layers  # q*cos, q*sin, k*cos, k*sin in each layer: one cos, one sin copy
        assert m.activations == D._predict(case, 2)["activations"] - copies
