"""Catalog entries held to what their publishers state: hub ids and aliases, totals against the
model cards and the checkpoints' own tensor inventories, and a config whose model_type transformers
does not know planned as the architecture its remote code implements (Kimi K2 as DeepSeek-V3).

The per-category equality with transformers on the meta device is ``tests/test_model_params.py``
(parametrized over every entry, these included)."""

from __future__ import annotations

import copy

import pytest

from ftplan.catalog.models import get_model, load_model_catalog, resolve_model
from ftplan.errors import ConfigError
from ftplan.job import Job
from ftplan.memory import estimate_memory
from ftplan.model import model_from_config

CATALOG = load_model_catalog()


@pytest.mark.parametrize("ref,name", [
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3"),
    ("google/gemma-3-1b-pt", "gemma-3-1b"),
    ("google/gemma-3-4b-pt", "gemma-3-4b"),
    ("google/gemma-3-12b-pt", "gemma-3-12b"),
    ("mistralai/Mistral-Nemo-Instruct-2407", "mistral-nemo-12b"),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder-30b-a3b"),
    ("moonshotai/Kimi-K2-Instruct", "kimi-k2"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b-2507"),
    ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3-235b-a22b-2507"),
])
def test_hub_ids_and_aliases_resolve(ref, name):
    assert get_model(ref).name == name
    assert get_model(ref.lower()).name == name


def test_kimi_k2_is_planned_as_deepseek_v3_and_the_answer_says_so():
    entry = CATALOG["kimi-k2"]
    assert entry.config["model_type"] == "kimi_k2"  # stored as published
    assert entry.config["architectures"] == ["DeepseekV3ForCausalLM"]
    spec = entry.spec()
    assert spec.family == "deepseek_v3"
    assert [(g.count, g.moe is not None) for g in spec.groups] == [(1, False), (60, True)]
    moe = spec.groups[1].moe
    assert (moe.num_experts, moe.top_k, moe.expert_intermediate_size) == (384, 8, 2048)
    assert moe.shared.intermediate_size == 2048
    attn = spec.groups[0].attention
    assert (attn.num_heads, attn.q_lora_rank, attn.kv_lora_rank) == (64, 1536, 512)
    assert (attn.head_dim, attn.v_head_dim) == (192, 128)
    notes = estimate_memory(spec, Job(method="full")).notes
    assert any("'kimi_k2'" in n and "DeepseekV3ForCausalLM" in n for n in notes)
    assert not any("kimi_k2" in n for n in estimate_memory(resolve_model("deepseek-v3"), Job(method="full")).notes)


def test_a_kimi_k2_text_config_inside_a_multimodal_wrapper_maps_too():
    """Kimi K2.5 nests the kimi_k2 text model in text_config (outer model_type kimi_k25)."""
    text = copy.deepcopy(CATALOG["kimi-k2"].config)
    wrapped = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}
    spec = model_from_config(wrapped)
    assert spec.family == "deepseek_v3"
    assert spec.params.total == CATALOG["kimi-k2"].spec().params.total
    assert any("'kimi_k2'" in n for n in estimate_memory(spec, Job(method="full")).notes)


def test_only_the_listed_remote_code_model_types_are_mapped():
    cfg = copy.deepcopy(CATALOG["kimi-k2"].config)
    cfg["model_type"] = "kimi_linear"  # another Moonshot architecture, not DeepSeek-V3's
    with pytest.raises(ConfigError, match="unsupported architecture"):
        model_from_config(cfg)


def test_measurement_builds_kimi_k2_with_transformers_deepseek_v3():
    from ftplan.measure.configs import text_config, tiny_config

    model_type, kwargs = text_config(CATALOG["kimi-k2"].config)
    assert model_type == "deepseek_v3" and kwargs["n_routed_experts"] == 384
    assert text_config(tiny_config(CATALOG["kimi-k2"].config))[0] == "deepseek_v3"


def test_kimi_k2_count_equals_its_checkpoint_less_fp8_scales():
    """The checkpoint report the config was read from lists 1,026,470,731,056 tensor elements. Less
    one fp32 ``weight_scale_inv`` per 128 x 128 block of every FP8 linear (all but the router, the
    embedding and the lm_head), the 61 rotary ``inv_freq`` copies ([56] each, as listed) and the 60 MoE
    layers' ``e_score_correction_bias`` (a buffer in transformers 5), it is ftplan's count exactly."""
    c = CATALOG["kimi-k2"].config
    h, L, k = c["hidden_size"], c["num_hidden_layers"], c["first_k_dense_replace"]
    heads, e, fe = c["num_attention_heads"], c["n_routed_experts"], c["moe_intermediate_size"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]

    def blocks(out_f, in_f):
        return -(-out_f // 128) * -(-in_f // 128)

    attn = (blocks(c["q_lora_rank"], h) + blocks(heads * qk, c["q_lora_rank"])
            + blocks(c["kv_lora_rank"] + c["qk_rope_head_dim"], h)
            + blocks(heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])
            + blocks(h, heads * c["v_head_dim"]))
    dense = 2 * blocks(c["intermediate_size"], h) + blocks(h, c["intermediate_size"])
    expert = 2 * blocks(fe, h) + blocks(h, fe)
    scales = L * attn + k * dense + (L - k) * (e + c["n_shared_experts"]) * expert
    assert scales == 62_495_192
    checkpoint = 1_026_470_731_056
    assert CATALOG["kimi-k2"].spec().params.total == checkpoint - scales - L * 56 - (L - k) * e == 1_026_408_209_408


def test_totals_against_model_cards():
    p = CATALOG["kimi-k2"].spec().params  # "1T total, 32B activated"
    assert round(p.total / 1e12, 2) == 1.03 and round((p.active - p.embedding) / 1e9) == 32
    p = CATALOG["qwen3-coder-30b-a3b"].spec().params  # "30.5B in total and 3.3B activated"
    assert p.total == 30_532_122_624  # the checkpoint's tensor count (same report as the config)
    assert round(p.total / 1e9, 1) == 30.5 and round(p.active / 1e9, 1) == 3.4  # 3.35B with both vocab matrices
    p = CATALOG["qwen3-235b-a22b-2507"].spec().params  # "235B in total and 22B activated, 234B non-embedding"
    assert p == CATALOG["qwen3-235b-a22b"].spec().params  # the same architecture...
    assert round(p.total / 1e9) == 235 and round((p.total - p.embedding - p.lm_head) / 1e9) == 234
    assert round((p.active - p.embedding) / 1e9) == 22
    # ... with the 2507 release's 262,144-token context, which bounds `fit`
    contexts = [CATALOG[n].spec().max_position_embeddings for n in ("qwen3-235b-a22b", "qwen3-235b-a22b-2507")]
    assert contexts == [40960, 262144]
    assert CATALOG["mistral-nemo-12b"].spec().params.total == 12_247_782_400  # HF safetensors, "12B"
    assert CATALOG["gemma-3-1b"].spec().params.total == 999_885_952  # HF safetensors, "1B"


#: HF safetensors totals of the multimodal Gemma 3 checkpoints (SigLIP tower and projector included)
GEMMA3_HUB_TOTALS = {"gemma-3-4b": 4_300_079_472, "gemma-3-12b": 12_187_325_040, "gemma-3-27b": 27_432_406_640}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(GEMMA3_HUB_TOTALS))
def test_multimodal_gemma3_hub_total_is_the_planned_text_model_plus_the_vision_tower(name):
    """ftplan plans the language model of Gemma3ForConditionalGeneration; the full build of the stored
    config (vision tower and projector included) is the hub's total, so the text model counted is that
    of the real checkpoint."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoConfig, Gemma3ForConditionalGeneration

    cfg = copy.deepcopy(CATALOG[name].config)
    cfg.pop("model_type")
    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(AutoConfig.for_model("gemma3", **cfg))
    total = sum(p.numel() for p in model.parameters())
    text = sum(p.numel() for p in model.model.language_model.parameters())  # lm_head is tied to its embedding
    assert total == GEMMA3_HUB_TOTALS[name]
    assert text == CATALOG[name].spec().params.total
    assert 0.41e9 < total - text < 0.43e9  # SigLIP-400M tower + projector, not planned


def test_phi_4_mini_counts_rotary_share_and_tokenizer():
    """Phi-4-mini (phi3): 3,836,021,760 parameters (the model card's 3.8B; the same count in an
    independent public parameter table), 96 of each head's 128 features rotated, and no borrowed token
    estimate (its o200k tokenizer is not phi3's 32k SentencePiece one)."""
    from ftplan.catalog.tokenization import token_estimate

    spec = resolve_model("phi-4-mini")
    assert spec.params.total == 3_836_021_760
    assert (spec.attention.head_dim, spec.attention.rotary_dim) == (128, 96)
    assert resolve_model("microsoft/Phi-4-mini-instruct").name == "phi-4-mini"
    with pytest.raises(ConfigError, match="phi-4-mini.*tokenizer"):
        token_estimate("phi-4-mini", "phi3")
    assert token_estimate("phi-3-mini", "phi3").tokenizer == "phi3-spm"
