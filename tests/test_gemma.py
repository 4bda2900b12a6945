"""Google Gemma 1 (``gemma``, ``GemmaForCausalLM``) against transformers 5.24 / PEFT 0.21.2 on CPU.

Gemma 1 is llama's pre-norm decoder with gemma's fp32 ``(1 + weight)`` RMSNorm (``norm_style``
"gemma", as gemma2's), the embedding output scaled by sqrt(hidden_size) inside the embedding module
(``GemmaTextScaledWordEmbedding``, gemma2's: no tensor of its own to plan), a GeGLU MLP
(``gelu_pytorch_tanh``: GemmaConfig turns the checkpoints' "gelu" into it; it saves what SiLU
saves), ``attention_bias`` on q/k/v and o_proj, ``head_dim`` 256 whatever hidden / heads
(gemma-7b: 16 x 256 = 4096 > hidden 3072; gemma-2b: multi-query, one kv head) and tied embeddings.
No new ``Family`` flag: gemma2 without its post norms, window and soft-capping.

The generic grid (model states, saved activations under autocast and pure bf16, full and LoRA,
checkpointing on/off, b = 1/2, sdpa; SAC in test_checkpointing_vs_torch) runs the tiny gemma from
``TINY_CONFIGS`` (4 heads x 32 over hidden 64, one kv head); this file adds GemmaConfig's defaults
and counts on meta, PEFT's targets, the refusal, one variant (multi-head with biases) and the
catalog entries. Held by hand, out of CI for time (``benchmarks/families3_by_hand.py gemma``, all
exact): eager attention, more variants, QLoRA (PEFT's and TRL's recipes).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.model import model_from_config

sys.path.insert(0, str(Path(__file__).parent))

import family_checks as F  # noqa: E402


@pytest.mark.torch
def test_defaults_are_gemma_config_defaults():
    """Every default ftplan fills in equals GemmaConfig's (sliding_window is no field of it), and
    a config.json naming only the model type builds transformers' parameters."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    F.assert_defaults_are("gemma", AutoConfig.for_model("gemma"), absent=("sliding_window",))
    assert model_from_config({"model_type": "gemma"}).params.by_category() == F.meta_params({"model_type": "gemma"})


@pytest.mark.torch
@pytest.mark.parametrize("extra", [{"attention_bias": True, "num_key_value_heads": 4},
                                   {"tie_word_embeddings": False, "head_dim": 16, "hidden_act": "gelu"}])
def test_params_match_transformers_on_meta(extra):
    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS["gemma"], **extra}
    assert model_from_config(cfg).params.by_category() == F.meta_params(cfg)


@pytest.mark.torch
def test_peft_all_linear_targets():
    pytest.importorskip("peft")
    from test_memory_vs_torch import _check_peft_all_linear

    _check_peft_all_linear("gemma", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


#: (method, checkpointing, batch, seq, attention, config changes): the CI case, then the cases
#: held by hand (``benchmarks/families3_by_hand.py gemma``, out of CI for time: exact too)
_MHA_BIAS = {"num_key_value_heads": 4, "attention_bias": True}
VARIANTS = [("lora", False, 2, 24, "sdpa", _MHA_BIAS)]
VARIANTS_BY_HAND = [
    ("full", False, 2, 24, "eager", {}), ("lora", True, 1, 40, "eager", {}), ("full", True, 2, 24, "eager", {}),
    ("lora", False, 1, 40, "eager", {}), ("full", False, 1, 40, "sdpa", _MHA_BIAS),
    ("full", True, 2, 24, "eager", _MHA_BIAS), ("lora", True, 2, 24, "sdpa", _MHA_BIAS),
    ("full", False, 2, 24, "sdpa", {"tie_word_embeddings": False, "hidden_act": "gelu"}),
]
QLORA_BY_HAND = [("peft", True), ("peft", False), ("trl", True), ("trl", False)]


check_variant = partial(F.check_variant, "gemma")
check_qlora = partial(F.check_qlora, "gemma")

test_saved_activations_exact_variants = F.variants_test(check_variant, VARIANTS)


def test_bidirectional_attention_is_refused():
    """GemmaConfig's use_bidirectional_attention (GemmaAttention.is_causal False: non-causal
    attention) is refused in one line."""
    import ftplan.measure.configs as CF

    with pytest.raises(ConfigError, match="use_bidirectional_attention=True") as e:
        model_from_config({**CF.TINY_CONFIGS["gemma"], "use_bidirectional_attention": True})
    assert "\n" not in str(e.value)


def test_catalog_entries_count_against_the_technical_report():
    """Gemma technical report (arXiv 2403.08295) Table 2: non-embedding 7,751,248,896 (7B) and
    1,981,884,416 (2B), equal to ftplan's (= transformers 5.24 on meta); the report's embedding
    rows are 256,128 (its Table 1), the checkpoints' 256,000."""
    from ftplan.catalog.models import get_model

    for name, non_emb, total in (("gemma-7b", 7_751_248_896, 8_537_680_896),
                                 ("gemma-2b", 1_981_884_416, 2_506_172_416)):
        spec = get_model(name).spec()
        p = spec.params
        assert spec.family == "gemma" and spec.tie_word_embeddings and p.lm_head == 0
        assert p.total == total and p.total - p.embedding == non_emb and p.embedding == 256_000 * spec.hidden_size
    a7 = get_model("gemma-7b").spec().attention
    assert (a7.num_heads, a7.num_kv_heads, a7.head_dim) == (16, 16, 256)
    assert get_model("google/gemma-2b-it").spec().attention.num_kv_heads == 1
