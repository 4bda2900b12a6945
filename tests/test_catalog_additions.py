"""Catalog entries and aliases added in session 14, held to what their publishers state: model-card totals
(and active counts for MoE), exact checkpoint counts where public code quotes them, and hub ids that
resolve. The per-category equality with transformers on the meta device is ``tests/test_model_params.py``
(parametrized over every entry, these included)."""

from __future__ import annotations

import pytest

from ftplan.catalog.models import get_model, load_model_catalog
from ftplan.catalog.tokenization import token_estimate
from ftplan.errors import ConfigError

CATALOG = load_model_catalog()


@pytest.mark.parametrize("ref,name", [
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "qwen3-coder-480b-a35b"),
    ("Qwen/Qwen3.5-397B-A17B", "qwen3.5-397b-a17b"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "smollm2-1.7b"),
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "smollm2-360m"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"),
    ("google/gemma-3-270m", "gemma-3-270m"),
    ("google/gemma-3-270m-it", "gemma-3-270m"),
    ("zai-org/GLM-4.6", "glm-4.6"),
    ("Qwen/Qwen2.5-Coder-7B-Instruct", "qwen2.5-7b"),
    ("Qwen/Qwen2.5-Coder-14B", "qwen2.5-14b"),
    ("Qwen/Qwen2.5-Coder-32B-Instruct", "qwen2.5-32b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama-3.3-70b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b"),
    ("moonshotai/Kimi-K2-Thinking", "kimi-k2"),
    ("microsoft/Phi-4-reasoning", "phi-4"),
    ("microsoft/Phi-4-reasoning-plus", "phi-4"),
    ("Qwen/Qwen3.5-0.8B-Base", "qwen3.5-0.8b"),
])
def test_new_hub_ids_and_aliases_resolve(ref, name):
    assert get_model(ref).name == name
    assert get_model(ref.lower()).name == name


def _b(n: int, digits: int = 2) -> float:
    return round(n / 1e9, digits)


def test_moe_totals_and_active_against_model_cards():
    p = CATALOG["qwen3-coder-480b-a35b"].spec().params  # "480B in total and 35B activated"
    assert p.total == 480_154_875_392
    assert round(p.total / 1e9) == 480 and round((p.active - p.embedding) / 1e9) == 35
    p = CATALOG["qwen3.5-397b-a17b"].spec().params  # "397B in total and 17B activated" (with a ~0.45B vision tower)
    assert p.total == 396_346_350_336
    assert 396.0 < p.total / 1e9 + 0.45 < 397.5 and round(p.active / 1e9) == 17
    p = CATALOG["glm-4.6"].spec().params  # "355 billion total parameters, 32 billion active" (MTP layer not built)
    assert p.total == 352_797_814_784
    assert 352e9 < p.total < 355e9 < p.total + 3.99e9 and round((p.active - p.embedding - p.lm_head) / 1e9) == 32


@pytest.mark.parametrize("name,exact,card", [
    ("smollm2-1.7b", 1_711_376_384, "1.7B"),
    ("smollm2-360m", 361_821_120, "360M"),
    ("smollm2-135m", 134_515_008, "135M"),
    ("gemma-3-270m", 268_098_176, "270M"),
])
def test_small_dense_totals_equal_the_checkpoints_counts(name, exact, card):
    entry = CATALOG[name]
    p = entry.spec().params
    assert p.total == exact == entry.published_params
    assert p.lm_head == 0  # tied embeddings, counted once
    value = float(card[:-1]) * (1e9 if card.endswith("B") else 1e6)
    assert abs(p.total - value) / value < 0.01


def test_coder_and_distill_aliases_share_their_entries_architecture():
    p = CATALOG["qwen2.5-7b"].spec().params  # Qwen2.5-Coder-7B card: "7.61B", 6.53B non-embedding
    assert round(p.total / 1e9, 2) == 7.62 and _b(p.total - p.embedding - p.lm_head) == 6.53
    # the hub's safetensors totals of the distills (HF API records saved in public code)
    assert get_model("deepseek-ai/DeepSeek-R1-Distill-Llama-8B").spec().params.total == 8_030_261_248
    assert get_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B").spec().params.total == 32_763_876_352


def test_smollm2_has_no_borrowed_token_estimate():
    """SmolLM2 is model_type llama but has its own 49,152-token tokenizer, not Llama 3's."""
    for name in ("smollm2-135m", "smollm2-360m", "smollm2-1.7b"):
        assert CATALOG[name].spec().vocab_size == 49152
        with pytest.raises(ConfigError, match=f"{name}.*tokenizer"):
            token_estimate(name, "llama")
    assert token_estimate("llama-3.1-8b", "llama").tokenizer == "llama3"


def test_qwen3_5_0_8b_is_its_checkpoint_less_vision_tower_and_mtp_head():
    """The model report the config was read from lists 873,438,784 tensor elements; less the 12-block
    vision tower (768 wide, MLP 3072, merger 3072 -> 1024) and the one-layer MTP head it lists, it is
    ftplan's count of the text model exactly."""
    v, f = 768, 3072
    block = (v * 3 * v + 3 * v) + (v * v + v) + (f * v + f) + (v * f + v) + 4 * v
    vision = 12 * block + (f * f + f + 1024 * f + 1024 + 2 * v) + (v * 3 * 2 * 16 * 16 + v) + 2304 * v
    h, i = 1024, 3584
    mtp = h * 2 * h + 2 * h + 3 * i * h + (4096 * h + 2 * 512 * h + h * 2048 + 2 * 256) + 3 * h
    assert (vision, mtp) == (100_592_896, 20_452_864)
    assert CATALOG["qwen3.5-0.8b"].spec().params.total == 873_438_784 - vision - mtp == 752_393_024
