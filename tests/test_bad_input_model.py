"""Bad model input never crashes ftplan: config.json types, impossible values, absurd sizes, odd
model arguments and unknown hub ids offline (issue 16, items 2, 3, 4 and 8).

Oracles: transformers' own config classes and modeling code (which layers slide, which are MoE),
the Hugging Face cache layout huggingface_hub reads, wall-clock and memory bounds.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftplan.catalog.models import load_model_catalog, resolve_model
from ftplan.errors import ConfigError, FtplanError, NotFoundError
from ftplan.model import CONFIG_LIMITS, model_from_config

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "intermediate_size": 11008, "vocab_size": 32000}
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _problem(cfg) -> str:
    with pytest.raises(ConfigError) as e:
        model_from_config(cfg)
    return e.value.one_line()


# ---------------------------------------------------------------------------------------------
# item 2: wrong types
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, words", [
    ({"model_type": ["llama"]}, "model_type must be a string"),
    ({"model_type": {"x": 1}}, "model_type must be a string"),
    ({"head_dim": "64"}, "head_dim must be an integer"),
    ({"hidden_size": "4096"}, "hidden_size must be an integer"),
    ({"num_hidden_layers": 32.0}, "num_hidden_layers must be an integer"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"attention_bias": "true"}, "attention_bias must be true or false"),
    ({"vocab_size": True}, "vocab_size must be an integer"),
    ({"num_key_value_heads": [8]}, "num_key_value_heads must be an integer"),
    ({"max_position_embeddings": "131072"}, "max_position_embeddings must be an integer"),
    ({"sliding_window": "4096"}, "sliding_window must be an integer"),
    ({"x": json.loads("[" * 100 + "]" * 100)}, "nested deeper"),
])
def test_wrong_types_are_one_config_error(change, words):
    msg = _problem({**LLAMA, **change})
    assert words in msg and "\n" not in msg


def test_architectures_of_the_wrong_type_do_not_crash():
    for archs in ("LlamaForCausalLM", [["LlamaForCausalLM"]], 7, {"a": 1}):
        assert "no 'model_type'" in _problem({k: v for k, v in LLAMA.items() if k != "model_type"}
                                             | {"architectures": archs})
    spec = model_from_config({k: v for k, v in LLAMA.items() if k != "model_type"}
                             | {"architectures": [3, "LlamaForCausalLM"]})
    assert spec.family == "llama"


# ---------------------------------------------------------------------------------------------
# item 3: physically impossible configs, every problem listed
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, words", [
    ({"head_dim": -64}, "head_dim must be >= 1"),
    ({"head_dim": 64.5}, "head_dim must be an integer"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be >= 1"),
    ({"num_key_value_heads": 5}, "must divide num_attention_heads"),
    ({"hidden_size": 1e200}, "hidden_size must be an integer"),
    ({"hidden_size": 10**400}, "implausibly large"),
    ({"num_attention_heads": 8192, "hidden_size": 4096}, "num_attention_heads"),
    ({"attn_logit_softcapping": float("nan")}, "attn_logit_softcapping"),
    ({"final_logit_softcapping": float("inf")}, "final_logit_softcapping"),
    ({"vocab_size": 0}, "vocab_size must be >= 1"),
])
def test_impossible_values_are_rejected(change, words):
    assert words in _problem({**LLAMA, **change})


def test_all_problems_are_listed_in_one_error():
    msg = _problem({**LLAMA, "head_dim": -1, "num_key_value_heads": 0, "tie_word_embeddings": "false",
                    "vocab_size": "32k", "intermediate_size": 1e9})
    assert "5 problems" in msg
    for words in ("head_dim", "num_key_value_heads", "tie_word_embeddings", "vocab_size", "intermediate_size"):
        assert words in msg


@pytest.mark.parametrize("cfg, words", [
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8}, "exceeds the 4 experts"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 9}, "exceeds the 8 experts"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 2, "num_experts_per_tok": 3}, "exceeds the 2 experts"),
    ({"model_type": "deepseek_v3", "kv_lora_rank": -1}, "kv_lora_rank must be >= 1"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": ["0"]}, "mlp_only_layers"),
    ({"model_type": "gemma3_text", "sliding_window_pattern": 0}, "sliding_window_pattern must be >= 1"),
])
def test_impossible_moe_and_mla_configs(cfg, words):
    assert words in _problem(cfg)


def test_zero_head_dim_means_derived_like_transformers():
    # transformers' llama: `getattr(config, "head_dim", None) or hidden_size // num_attention_heads`
    assert model_from_config({**LLAMA, "head_dim": 0}).attention.head_dim == 128


# ---------------------------------------------------------------------------------------------
# item 4: bounded sizes, work proportional to distinct layer types
# ---------------------------------------------------------------------------------------------
def test_a_billion_layers_is_refused_fast_and_small():
    tracemalloc.start()
    t0 = time.perf_counter()
    msg = _problem({**LLAMA, "num_hidden_layers": 10**9})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert "num_hidden_layers" in msg and f"{CONFIG_LIMITS['num_hidden_layers']:,}" in msg
    # a hang guard, not a speed target (those live in benchmarks/): the bound is the memory
    assert time.perf_counter() - t0 < 10.0 and peak < 5 * 2**20


@pytest.mark.parametrize("cfg", [
    {"model_type": "gemma3_text", "num_hidden_layers": 4096, "sliding_window_pattern": 4096},
    {"model_type": "gemma2", "num_hidden_layers": 4096},
    {"model_type": "qwen3_moe", "num_hidden_layers": 4096, "decoder_sparse_step": 3,
     "mlp_only_layers": [1, 2, 4095], "use_sliding_window": True, "sliding_window": 512, "max_window_layers": 7},
])
def test_the_largest_layer_count_builds_few_groups_quickly(cfg):
    t0 = time.perf_counter()
    spec = model_from_config(cfg)
    assert time.perf_counter() - t0 < 10.0  # a hang guard; the work bound is the group count below
    assert sum(g.count for g in spec.groups) == 4096 and len(spec.groups) <= 4
    spec.params  # noqa: B018 - finite arithmetic on the largest allowed sizes


def _tf_config(cfg):
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    d = dict(cfg)
    return AutoConfig.for_model(d.pop("model_type"), **d)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 40), pattern=st.integers(1, 9), window=st.integers(1, 4096),
       family=st.sampled_from(["gemma2", "gemma3_text", "qwen2", "qwen3", "mistral"]),
       start=st.integers(0, 45), use_sw=st.booleans())
def test_sliding_layers_match_transformers_config(n, pattern, window, family, start, use_sw):
    """Which layers slide, per transformers' own config class (its ``layer_types``)."""
    cfg = {"model_type": family, "num_hidden_layers": n, "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "sliding_window": window}
    if family == "gemma3_text":
        cfg["sliding_window_pattern"] = pattern
    if family.startswith("qwen"):
        cfg |= {"use_sliding_window": use_sw, "max_window_layers": start}
    tfc = _tf_config(cfg)
    types = getattr(tfc, "layer_types", None)
    if types is None:  # mistral: every layer slides
        expected_sliding = n
    else:
        expected_sliding = sum(t == "sliding_attention" for t in types)
        if family.startswith("qwen") and not use_sw:
            expected_sliding = 0  # qwen's layer_types name sliding layers that run full attention
    spec = model_from_config(cfg)
    got = sum(g.count for g in spec.groups if g.window is not None)
    assert got == expected_sliding and sum(g.count for g in spec.groups) == n
    assert spec.groups[0].window == (window if expected_sliding and _first_slides(tfc, family, use_sw) else None)


def _first_slides(tfc, family, use_sw) -> bool:
    types = getattr(tfc, "layer_types", None)
    if types is None:
        return True
    if family.startswith("qwen") and not use_sw:
        return False
    return types[0] == "sliding_attention"


@settings(max_examples=8, deadline=None, derandomize=True)
@given(n=st.integers(1, 12), step=st.integers(1, 4), only=st.lists(st.integers(0, 14), max_size=4),
       k=st.integers(0, 14), family=st.sampled_from(["qwen3_moe", "deepseek_v3"]))
def test_moe_layers_match_the_modeling_code(n, step, only, k, family):
    """Which decoder layers transformers builds with a routed MoE block (meta device, no weights)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    if family == "qwen3_moe":
        cfg = {"model_type": family, "num_hidden_layers": n, "hidden_size": 32, "intermediate_size": 64,
               "moe_intermediate_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
               "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": step, "mlp_only_layers": only}
    else:
        cfg = {"model_type": family, "num_hidden_layers": n, "hidden_size": 32, "intermediate_size": 64,
               "moe_intermediate_size": 16, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 64,
               "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
               "first_k_dense_replace": k, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8,
               "qk_rope_head_dim": 4, "v_head_dim": 8}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_tf_config(cfg))
    kinds = [type(layer.mlp).__name__.endswith(("SparseMoeBlock", "MoE")) for layer in model.model.layers]
    spec = model_from_config(cfg)
    assert sum(g.count for g in spec.groups if g.moe is not None) == sum(kinds)
    assert (spec.groups[0].moe is not None) == kinds[0]


# ---------------------------------------------------------------------------------------------
# fuzz: any JSON object as config.json is a ModelSpec or one ConfigError
# ---------------------------------------------------------------------------------------------
_KEYS = sorted(set(CONFIG_LIMITS) | {"model_type", "tie_word_embeddings", "attention_bias", "mlp_bias",
                                     "use_sliding_window", "layer_types", "mlp_only_layers", "architectures",
                                     "text_config", "attn_logit_softcapping", "final_logit_softcapping"})
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8) | st.sampled_from(["llama", "gemma2", "qwen3_moe", "deepseek_v3", "sliding_attention"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@FUZZ
@given(base=st.sampled_from(sorted(load_model_catalog())),
       changes=st.dictionaries(st.sampled_from(_KEYS), _json, max_size=5))
def test_fuzz_config_json(base, changes):
    cfg = {**load_model_catalog()[base].config, **changes}
    try:
        spec = model_from_config(cfg)
    except ConfigError as e:
        assert "\n" not in e.one_line()
        return
    p = spec.params
    assert p.total > 0 and 0 < p.active <= p.total
    assert sum(g.count for g in spec.groups) == spec.num_layers <= CONFIG_LIMITS["num_hidden_layers"]


# ---------------------------------------------------------------------------------------------
# the model argument: length, odd characters, files
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ref, words", [
    ("a" * 300, "unknown model"),
    ("x/" + "b" * 300, "unknown model"),
    ("a" * 5000, "at most 4,096"),
    ("bad\x00name", "U+0000"),
    ("org/na\rme", "U+000D"),
    ("llama\u202e", "U+202E"),
    ("caf\udce9", "U+DCE9"),  # an argv byte that is not UTF-8 (surrogateescape)
    ("   ", "empty model name"),
])
def test_odd_model_arguments(ref, words):
    with pytest.raises(ConfigError) as e:
        resolve_model(ref)
    assert words in e.value.one_line() and len(e.value.one_line()) < 400


def test_config_files_that_are_not_configs(tmp_path):
    cases = {
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "nan.json": '{"model_type": "llama", "hidden_size": NaN}',
        "bom.json": "\ufeff" + json.dumps(LLAMA),
        "latin1.json": None,
        "nul.json": '{"model_type": "llama"\x00}',
        "list.json": "[1, 2]",
    }
    for name, text in cases.items():
        p = tmp_path / name
        if text is None:
            p.write_bytes(b'{"model_type": "ll\xe9ma"}')
        else:
            p.write_text(text, encoding="utf-8")
    assert resolve_model(str(tmp_path / "bom.json")).family == "llama"  # a BOM is fine
    for name in ("deep.json", "nan.json", "latin1.json", "nul.json", "list.json"):
        with pytest.raises(ConfigError) as e:
            resolve_model(str(tmp_path / name))
        assert "\n" not in e.value.one_line(), name


# ---------------------------------------------------------------------------------------------
# item 8: unknown org/name offline fails fast with one line and no noise
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    # a closed local port: the connection is refused at once, with or without a network in CI
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return hub


def test_unknown_hub_id_offline_fails_fast_and_quietly(unreachable_hub, capfd):
    t0 = time.perf_counter()
    with pytest.raises(NotFoundError) as e:
        resolve_model("someorg/somemodel")
    assert time.perf_counter() - t0 < 15.0  # huggingface_hub's own retries took 23-47 s
    msg = e.value.one_line()
    assert "someorg/somemodel" in msg and "cannot reach the Hugging Face hub" in msg
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no retry warnings, no progress bars


def test_hf_hub_offline_uses_the_cache_only(unreachable_hub, monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    with pytest.raises(NotFoundError, match="HF_HUB_OFFLINE"):
        resolve_model("someorg/somemodel")
    assert time.perf_counter() - t0 < 15.0  # no network retries (23-47 s)
    # a config in the local HF cache (the layout huggingface_hub writes) resolves offline
    repo = tmp_path / "hub" / "models--someorg--cached"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(LLAMA))
    spec = resolve_model("someorg/cached")
    assert spec.family == "llama" and spec.hf_id == "someorg/cached"
    # and so it does when the hub is merely unreachable
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert resolve_model("someorg/cached").num_layers == 32


def test_hub_errors_never_escape_as_tracebacks(unreachable_hub, monkeypatch):
    import huggingface_hub

    def boom(*a, **k):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", boom)
    with pytest.raises(FtplanError):
        resolve_model("someorg/other")
