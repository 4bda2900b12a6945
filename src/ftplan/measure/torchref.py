"""Reference measurements of fine-tuning memory with real PyTorch on CPU.

This module is the *ground truth* that ftplan's formulas are held against. It builds tiny,
random-weight instances of the real Hugging Face architectures (``AutoModelForCausalLM.from_config``),
optionally wraps them with real PEFT LoRA, runs one real training step (forward through the model's
own loss, backward, optimizer step) and counts bytes exactly:

* parameters, gradients and optimizer state are summed over tensor *storages* (each storage once);
* saved activations are the tensors autograd keeps for the backward pass, captured with
  :func:`torch.autograd.graph.saved_tensors_hooks` (see :class:`SavedTensorTracker` for exactly what
  is counted, including under non-reentrant activation checkpointing);
* :func:`live_bytes_after_forward` is an independent, allocator-level cross-check using the profiler.

Everything runs on CPU (``device="cpu"``); ``device="meta"`` is accepted by :func:`build_model` and
the parameter-counting functions. This module imports torch at import time; it is only imported by
measurement code and tests, never by the planner itself.

Findings about the installed stack (torch 2.13 / transformers 5.23 / peft 0.21 / bitsandbytes 0.50),
established by running this module:

* ``model.gradient_checkpointing_enable()`` is a deprecated alias of
  ``activation_checkpointing_enable()``; with no kwargs it uses
  ``functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)`` (NON-reentrant), wraps
  each ``GradientCheckpointingLayer`` (decoder layer) ``forward`` (module hooks stay outside), passes
  ``hidden_states`` positionally and every other argument (``position_embeddings`` cos/sin,
  ``attention_mask``, ``position_ids`` ...) through a ``functools.partial`` closure, and always calls
  ``enable_input_require_grads()`` (because ``main_input_name == "input_ids"``).
* MoE experts are fused 3-D ``nn.Parameter`` s (``experts.gate_up_proj`` ``[E, 2*I, H]`` and
  ``experts.down_proj`` ``[E, H, I]``); the default ``experts_implementation`` is ``"grouped_mm"``
  (also on CPU). Router weights are a plain ``nn.Parameter`` in a ``*TopKRouter`` module (not an
  ``nn.Linear``); DeepSeek-V3's ``e_score_correction_bias`` is a *buffer*, not a parameter.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import re
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = [
    "TINY_CONFIGS",
    "CATEGORIES",
    "DTYPES",
    "build_model",
    "params_by_category",
    "total_params",
    "trainable_params",
    "LoraApplied",
    "apply_lora",
    "SavedRecord",
    "SavedTensorTracker",
    "StepMeasure",
    "measure_step",
    "set_gradient_checkpointing",
    "make_optimizer",
    "optimizer_state_bytes",
    "LiveBytes",
    "live_bytes_after_forward",
    "storage_key",
    "storage_nbytes",
]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}

# --------------------------------------------------------------------------------------------------
# Tiny configs
# --------------------------------------------------------------------------------------------------

#: One tiny but structurally faithful ``config.json``-style dict per family, keyed by HF model_type.
#: Sizes: hidden 64, 2-3 layers, vocab 512, intermediate 120 (MoE expert intermediate 24; chosen so that no
#: two of h, I, Im, V are small multiples of each other, which keeps fitted formulas unambiguous). Sliding
#: windows are 16 tokens, i.e. smaller
#: than the sequence lengths the tests use (32), so the window really masks something where it applies.
#: Features exercised:
#:
#: * llama: GQA (4 heads / 2 kv heads), untied embeddings.
#: * mistral: GQA, ``sliding_window=16`` on every layer, untied.
#: * mixtral: 4 experts top-2 (fused 3-D experts), GQA, untied, no sliding window (like Mixtral-8x7B).
#: * qwen2: q/k/v biases (hard-coded in the architecture), tied embeddings, GQA.
#: * qwen3: ``head_dim=32 != 64/4``, q_norm/k_norm, GQA, untied.
#: * qwen3_moe: ``head_dim=32``, q/k norms, 4 experts top-2 with ``moe_intermediate_size=24``,
#:   ``decoder_sparse_step=1`` and ``mlp_only_layers=[0]`` (layer 0 dense, layers 1-2 MoE).
#: * gemma2: ``head_dim=32``, ``query_pre_attn_scalar=32``, layers alternate sliding(16)/full,
#:   attention soft-capping 50 and final-logit soft-capping 30, pre/post feed-forward norms, tied.
#: * gemma3_text: ``head_dim=32``, q/k norms, layer_types sliding/full/sliding (window 16), tied.
#: * phi3: fused ``qkv_proj`` and ``gate_up_proj``, GQA, ``sliding_window=16``, untied.
#: * deepseek_v3: MLA (q_lora_rank 32, kv_lora_rank 16, qk_nope 16, qk_rope 8, v_head_dim 16),
#:   8 routed experts top-2 (n_group 2, topk_group 1), 1 shared expert, ``first_k_dense_replace=1``.
TINY_CONFIGS: dict[str, dict] = {
    "llama": {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "model_type": "mistral",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "sliding_window": 16,
        "tie_word_embeddings": False,
    },
    "mixtral": {
        "model_type": "mixtral",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
        "sliding_window": None,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
    },
    "qwen3": {
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
        "max_position_embeddings": 256,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
    "gemma2": {
        "model_type": "gemma2",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
    "phi3": {
        "model_type": "phi3",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 256,
        "sliding_window": 16,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
    },
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 120,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
}


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}") from None


def _text_config_dict(config: dict) -> tuple[str, dict]:
    """Pop model_type; descend into ``text_config`` for multimodal wrappers (gemma3 -> gemma3_text)."""
    cfg = copy.deepcopy(dict(config))
    model_type = cfg.pop("model_type", None)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        text = copy.deepcopy(cfg["text_config"])
        text_type = text.pop("model_type", None)
        if text_type is None:
            text_type = {"gemma3": "gemma3_text"}.get(model_type, f"{model_type}_text")
        # a few top-level fields matter for the text model too
        for key in ("tie_word_embeddings", "vocab_size"):
            if key in cfg and key not in text:
                text[key] = cfg[key]
        return text_type, text
    if model_type is None:
        raise ValueError("config has no 'model_type'")
    return model_type, cfg


def build_model(
    config: dict,
    *,
    dtype: str = "fp32",
    device: str = "cpu",
    attn_implementation: str = "eager",
    seed: int = 0,
    experts_implementation: str | None = None,
    quantization: str | None = None,
) -> nn.Module:
    """Build a real ``AutoModelForCausalLM`` from a config.json-style dict, with random weights.

    ``model_type`` is popped from (a copy of) the dict and the rest goes to ``AutoConfig.for_model``.
    A gemma3 (multimodal) config with ``text_config`` builds the ``gemma3_text`` causal LM.

    Args:
        config: config.json-style dict (e.g. ``TINY_CONFIGS["llama"]``); not modified.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the dtype of every floating parameter.
        device: ``"cpu"`` (weights initialised) or ``"meta"`` (shapes only, no memory).
        attn_implementation: ``"eager"`` or ``"sdpa"`` (passed to ``from_config``).
        seed: ``torch.manual_seed`` before initialisation, so builds are reproducible.
        experts_implementation: MoE experts kernel (``None`` = transformers' default, which is
            ``"grouped_mm"`` for the fused-experts families; ``"eager"`` loops over experts).
        quantization: ``None``, ``"nf4"``, ``"nf4-dq"`` (double quantization), ``"fp4"`` or ``"int8"``:
            the random model is saved to a temporary directory and reloaded with
            ``from_pretrained(quantization_config=BitsAndBytesConfig(...), device_map="cpu")`` - the
            real bitsandbytes path (4-bit and int8 both run on CPU with bitsandbytes 0.50; compute dtype =
            ``dtype``).
            ``prepare_model_for_kbit_training`` is NOT applied (it upcasts every non-quantized parameter
            to fp32; call it yourself to mirror a QLoRA recipe).

    Returns:
        The model, in train mode.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, cfg = _text_config_dict(config)
    torch_dtype = _torch_dtype(dtype)
    hf_config = AutoConfig.for_model(model_type, **cfg)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation, "dtype": torch_dtype}
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if device == "meta":
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
        else:
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
            model = model.to(device)
    if quantization is not None:
        model = _requantize(model, quantization, torch_dtype, attn_implementation, experts_implementation)
    model.train()
    return model


def _requantize(
    model: nn.Module,
    quantization: str,
    torch_dtype: torch.dtype,
    attn_implementation: str,
    experts_implementation: str | None,
) -> nn.Module:
    import tempfile

    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    q = quantization.lower()
    if q in ("nf4", "nf4-dq", "fp4", "fp4-dq"):
        qc = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=q.split("-")[0],
            bnb_4bit_use_double_quant=q.endswith("-dq"),
            bnb_4bit_compute_dtype=torch_dtype,
        )
    elif q == "int8":
        qc = BitsAndBytesConfig(load_in_8bit=True)
    else:
        raise ValueError(f"unknown quantization {quantization!r}")
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation, "dtype": torch_dtype}
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
        return AutoModelForCausalLM.from_pretrained(d, quantization_config=qc, device_map="cpu", **kwargs)


# --------------------------------------------------------------------------------------------------
# Parameter categories
# --------------------------------------------------------------------------------------------------

#: The parameter categories reported by :func:`params_by_category` (``"lora"`` is added only for
#: models carrying PEFT adapters).
CATEGORIES: tuple[str, ...] = ("embedding", "attention", "mlp", "experts", "router", "norms", "lm_head")

_PEFT_SEGMENTS = {"base_layer", "base_model", "default"}
_LORA_RE = re.compile(r"(^|\.)(lora_[A-Za-z_]+)(\.|$)")


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    if "." in name:
        mod_name, pname = name.rsplit(".", 1)
        return model.get_submodule(mod_name), pname
    return model, name


def _is_norm(module: nn.Module) -> bool:
    cls = type(module).__name__
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or cls.endswith("Norm") or "RMSNorm" in cls


def _is_router(module: nn.Module, segs: list[str]) -> bool:
    cls = type(module).__name__
    if "Router" in cls or cls.endswith("Gate") or "TopK" in cls:
        return True
    # plain nn.Linear routers (older layouts): `...mlp.gate` / `...block_sparse_moe.gate` / `...router`
    last = segs[-1] if segs else ""
    return last in ("gate", "router", "shared_expert_gate") and not isinstance(module, nn.Embedding)


def _categorise(model: nn.Module, name: str, param: nn.Parameter) -> str:
    owner, pname = _owner(model, name)
    segs = [s for s in name.split(".")[:-1] if s not in _PEFT_SEGMENTS]
    if _LORA_RE.search(name):
        return "lora"
    if isinstance(owner, nn.Embedding) or "embed_tokens" in segs or "wte" in segs:
        return "embedding"
    if "lm_head" in segs:
        return "lm_head"
    if _is_norm(owner):
        return "norms"
    if any(s in ("self_attn", "attention", "attn") for s in segs):
        return "attention"
    if any(s.startswith("shared_expert") for s in segs):
        if segs and segs[-1] == "shared_expert_gate":
            return "router"
        return "mlp"
    if _is_router(owner, segs) or ("bias" in pname and "router" in pname):
        return "router"
    if any(s == "experts" for s in segs):
        return "experts"
    if any(s in ("mlp", "feed_forward", "block_sparse_moe", "ffn") for s in segs):
        return "mlp"
    raise ValueError(f"parameter {name!r} (owner {type(owner).__name__}) fits no category")


def _unique_named_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Named parameters with tied/shared tensors reported once (first name wins, as in torch)."""
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=True):
        key = id(p)
        if key in seen:
            continue
        seen.add(key)
        yield name, p


def params_by_category(model: nn.Module) -> dict[str, int]:
    """Element counts per category; tied weights counted once (as ``embedding``).

    Categories: ``embedding`` (token embeddings), ``attention`` (every projection weight/bias inside
    ``self_attn``: q/k/v/o, fused ``qkv_proj``, MLA ``q_a_proj``/``q_b_proj``/``kv_a_proj_with_mqa``/
    ``kv_b_proj``), ``mlp`` (dense MLPs and MoE *shared* experts), ``experts`` (routed experts: the
    fused 3-D ``experts.gate_up_proj``/``experts.down_proj``), ``router`` (MoE gate weights and any
    router bias *parameter*), ``norms`` (every norm weight incl. q_norm/k_norm/q_a_layernorm/
    kv_a_layernorm and the final norm), ``lm_head`` (0 when tied). Models with PEFT adapters get an
    extra ``lora`` key (lora_A/lora_B/...); base weights wrapped by PEFT keep their category.

    Works on ``device="meta"`` models. Raises ``ValueError`` if a parameter fits no category.
    """
    out = {c: 0 for c in CATEGORIES}
    for name, p in _unique_named_parameters(model):
        cat = _categorise(model, name, p)
        out[cat] = out.get(cat, 0) + _numel(p)
    return out


def _numel(p: torch.Tensor) -> int:
    # bitsandbytes Params4bit store packed uint8; report the logical element count when known
    qs = getattr(p, "quant_state", None)
    if qs is not None and getattr(qs, "shape", None) is not None:
        n = 1
        for d in qs.shape:
            n *= int(d)
        return n
    return p.numel()


def total_params(model: nn.Module) -> int:
    """Number of parameter elements, shared/tied parameters counted once."""
    return sum(_numel(p) for _, p in _unique_named_parameters(model))


def trainable_params(model: nn.Module) -> int:
    """Number of parameter elements with ``requires_grad=True``, shared parameters counted once."""
    return sum(_numel(p) for _, p in _unique_named_parameters(model) if p.requires_grad)


# --------------------------------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoraApplied:
    """Result of :func:`apply_lora`: the PEFT model and what PEFT really targeted."""

    model: nn.Module
    #: full module names PEFT wrapped (relative to the base model, ``base_model.model.`` stripped)
    targeted_modules: list[str]
    #: distinct last name components of ``targeted_modules`` (e.g. ``["down_proj", "q_proj", ...]``)
    targeted_suffixes: list[str]
    #: parameter names targeted through ``target_parameters`` (3-D MoE experts), if any
    targeted_parameters: list[str]
    #: ``nn.Linear`` modules of the base model that were NOT wrapped (e.g. ``lm_head``)
    untargeted_linear: list[str]
    #: parameters of the base model that are not reachable by module targeting because they are not
    #: inside an ``nn.Linear`` (fused 3-D experts, custom routers), with their shapes
    non_linear_weights: dict[str, tuple[int, ...]]
    #: LoRA parameter elements (lora_A + lora_B [+ magnitude...])
    lora_params: int
    #: the adapter config as PEFT left it (after its transformers-v5 MoE rewrite)
    peft_target_modules: list[str] = dataclasses.field(default_factory=list)
    peft_target_parameters: list[str] = dataclasses.field(default_factory=list)
    rank_pattern: dict[str, int] = dataclasses.field(default_factory=dict)
    alpha_pattern: dict[str, float] = dataclasses.field(default_factory=dict)


def _strip_peft_prefix(name: str) -> str:
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def apply_lora(
    model: nn.Module,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: str | list[str] = "all-linear",
    target_parameters: list[str] | None = None,
    bias: str = "none",
    autocast_adapter_dtype: bool = True,
) -> LoraApplied:
    """Wrap ``model`` with real ``peft.get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", ...))``.

    Findings (peft 0.21.2 + transformers 5.23, verified by ``tests/test_torchref_harness.py`` and
    ``benchmarks/notes/make_inventory.py``):

    * Dense families: ``"all-linear"`` wraps every ``nn.Linear`` except the output embedding
      (``lm_head``, found via ``get_output_embeddings()``; excluded whether tied or not): q/k/v/o, phi3's
      fused ``qkv_proj``/``gate_up_proj``, MLA's ``q_a_proj``/``q_b_proj``/``kv_a_proj_with_mqa``/
      ``kv_b_proj``, gate/up/down. Embeddings and norms are never targeted.
    * MoE families whose v5 layout changed (mixtral, and every model transformers maps to the
      ``qwen2_moe`` conversion pattern, incl. qwen3_moe and deepseek_v3): PEFT's
      ``convert_peft_config_for_transformers`` REWRITES the config. ``all-linear`` is resolved to leaf
      names, then ``gate_proj``/``up_proj``/``down_proj`` (``w1``/``w3``/``w2``) and ``gate`` are moved
      to ``target_parameters`` = ``{"gate_up_proj", "down_proj", "gate.weight"}``: the fused 3-D routed
      experts get a PEFT ``ParamWrapper`` LoRA (per expert; ``gate_up_proj`` at rank ``2r`` and alpha
      ``2*alpha`` via rank/alpha patterns, ``down_proj`` at rank ``r``; lora_A ``[r_eff*E, in]``, lora_B
      ``[out, r_eff*E]``) and the ROUTER weight gets one too (lora_A ``[r, h]``, lora_B ``[E, r]``).
      Side effect: because those names leave ``target_modules``, dense MLP layers (qwen3_moe
      ``mlp_only_layers``, deepseek's first ``first_k_dense_replace`` layers) and DeepSeek's
      ``shared_experts`` are NOT targeted at all (see ``untargeted_linear``).
    * ``ParamWrapper`` raises ``ValueError("... does not work with lora_dropout != 0")``, so
      ``all-linear`` with ``dropout > 0`` FAILS on those MoE models (the error is propagated).
    * ``ParamWrapper`` materialises ``W + scale * B @ A`` for ALL experts on every forward and
      grouped_mm saves it for backward: a full expert-weight-sized tensor per wrapped 3-D parameter and
      MoE layer shows up as *activation* memory.
    * ``lora_dropout > 0`` inserts an ``nn.Dropout`` on the LoRA branch input of each wrapped layer
      (each q/k/v gets its own mask and dropped copy); ``lora_dropout == 0`` uses ``nn.Identity``.
    * Every base parameter is frozen. LoRA weights are FP32 even on a bf16/fp16 base model: PEFT's
      ``autocast_adapter_dtype=True`` (default of ``get_peft_model``) upcasts them, and each LoRA layer
      casts its input to fp32 (``_cast_input_dtype``) before ``lora_A`` - so in bf16 models every wrapped
      linear saves its OWN fp32 copy of its input (q/k/v no longer share one storage) plus the fp32
      ``lora_B`` input (r per token); trainable parameters, gradients and optimizer states are fp32.
      Pass ``autocast_adapter_dtype=False`` to keep adapters in the model dtype.

    Args:
        model: a model from :func:`build_model` (modified in place by PEFT).
        r, alpha, dropout: LoRA rank, ``lora_alpha`` and ``lora_dropout``.
        target_modules: ``"all-linear"`` or a list of module name suffixes.
        target_parameters: optional explicit PEFT ``target_parameters`` (3-D expert weights).
        bias: LoRA ``bias`` option (``"none"`` by default).
        autocast_adapter_dtype: passed to ``get_peft_model`` (PEFT default ``True``: fp32 adapters).

    Returns:
        :class:`LoraApplied` with the PEFT model and what was really targeted (after PEFT's rewrite).
    """
    from peft import LoraConfig, get_peft_model

    kwargs: dict[str, Any] = dict(
        task_type="CAUSAL_LM",
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        bias=bias,
    )
    if target_parameters:
        kwargs["target_parameters"] = list(target_parameters)
    base_linear = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    non_linear: dict[str, tuple[int, ...]] = {}
    linear_param_ids = {id(p) for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
    for n, p in model.named_parameters():
        owner, _ = _owner(model, n)
        if id(p) not in linear_param_ids and not isinstance(owner, nn.Embedding) and not _is_norm(owner):
            non_linear[n] = tuple(p.shape)
    peft_model = get_peft_model(model, LoraConfig(**kwargs), autocast_adapter_dtype=autocast_adapter_dtype)
    tuner = peft_model.base_model
    pc = peft_model.peft_config["default"]
    targeted = sorted({_strip_peft_prefix(n) for n in getattr(tuner, "targeted_module_names", [])})
    targeted_params = sorted({_strip_peft_prefix(n) for n in getattr(tuner, "targeted_parameter_names", [])})
    lora_params = sum(p.numel() for n, p in peft_model.named_parameters() if _LORA_RE.search(n))
    return LoraApplied(
        model=peft_model,
        targeted_modules=targeted,
        targeted_suffixes=sorted({t.rsplit(".", 1)[-1] for t in targeted}),
        targeted_parameters=targeted_params,
        untargeted_linear=sorted(base_linear - set(targeted)),
        non_linear_weights=non_linear,
        lora_params=lora_params,
        peft_target_modules=(
            [pc.target_modules] if isinstance(pc.target_modules, str) else sorted(pc.target_modules or [])
        ),
        peft_target_parameters=sorted(pc.target_parameters or []),
        rank_pattern=dict(pc.rank_pattern or {}),
        alpha_pattern=dict(pc.alpha_pattern or {}),
    )


# --------------------------------------------------------------------------------------------------
# Saved-tensor tracking
# --------------------------------------------------------------------------------------------------


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's memory: the data pointer of its untyped storage."""
    return t.untyped_storage().data_ptr()


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of the whole untyped storage behind ``t`` (views count their full base)."""
    return t.untyped_storage().nbytes()


@dataclasses.dataclass
class SavedRecord:
    """One storage kept alive for the backward pass."""

    key: int  #: storage data_ptr
    nbytes: int  #: storage size in bytes
    shape: tuple[int, ...]  #: shape of the first saved view
    dtype: str  #: dtype of the first saved view
    module: str  #: innermost module (qualified name) running when first saved, '' if none
    module_type: str  #: class name of that module
    op: str  #: torch function running when first saved, or 'checkpoint_input'/'checkpoint_closure'
    producer: str  #: grad_fn class of the saved tensor when first saved ('' for leaves/no-grad)
    n_saves: int = 1  #: how many times autograd saved a view of this storage
    savers: list[str] = dataclasses.field(default_factory=list)  #: "module:op" of every save
    alive: bool = True  #: still referenced by the graph when the report was taken
    #: name of the parameter this storage is a dtype cast of (autocast's low-precision weight copies),
    #: found through the grad_fn chain (``TBackward0``/``ToCopyBackward0`` -> ``AccumulateGrad``); only
    #: detectable for parameters that require grad
    param_copy: str = ""


class _Held:
    """What the pack hook returns: a detached alias (no grad_fn, so no reference cycle)."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _OpStack(TorchFunctionMode):
    """Records which torch function is executing, so saved tensors can be attributed to an op."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D401
        name = getattr(func, "__name__", None) or str(func)
        self.stack.append(name)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()


def _iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if depth > 4:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _iter_tensors(o, depth + 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _iter_tensors(o, depth + 1)
    elif isinstance(obj, functools.partial):
        yield from _iter_tensors(obj.args, depth + 1)
        yield from _iter_tensors(obj.keywords, depth + 1)


class SavedTensorTracker:
    """Count the storages autograd saves for backward during a forward pass.

    Use as a context manager around the forward (and the loss). What is counted:

    * every tensor autograd saves (``torch.autograd.graph.saved_tensors_hooks`` pack hook) is keyed by
      its untyped storage ``data_ptr``; each storage is counted ONCE with its full ``nbytes`` (a view
      costs its whole base), however many ops save it;
    * storages belonging to parameters or buffers of ``model`` (and views of them, e.g. ``weight.t()``
      saved by ``addmm``) and of any tensor in ``exclude`` are EXCLUDED (reported separately as
      ``excluded_bytes``). Autocast's low-precision weight copies are NOT parameters and ARE counted;
    * a storage counts only while at least one of its saved references is still held by the graph
      (tensors saved by a sub-graph whose output was dropped are freed and not counted; e.g. DeepSeek-V3's
      group-limited routing saves ``topk`` indices on a branch that only feeds a non-differentiable
      ``topk`` and is dropped at once). When such an address is reused by a later saved tensor, a fresh
      record is started (the old one moves to ``retired``);
    * activation checkpointing: tensors saved *inside* a non-reentrant checkpointed region go to the
      checkpoint's own inner hooks (the outer hook never sees them) and are not kept - correct, they
      are recomputed. The region's positional tensor inputs are kept as ``SavedTensor`` s by
      ``_CheckpointFrame.save_inputs`` and DO reach the outer hook (op ``checkpoint_input``). Its
      keyword/closure tensors (HF passes ``position_embeddings``, ``attention_mask``,
      ``position_ids`` ... inside a ``functools.partial``) are kept alive by the recompute closure
      and never pass through a hook; :meth:`wrap_checkpoint_fn` records them (op
      ``checkpoint_closure``, counted while the partial is alive). With reentrant checkpointing the
      inputs go through ``ctx.save_for_backward`` (seen by the hook) and the closure is ``ctx.
      run_function`` (recorded the same way).
    * NOT counted: the CPU RNG state the checkpoint stashes (``torch.get_rng_state()``, a 5056-byte
      uint8 CPU tensor per checkpointed call - host memory even on GPU; reported as
      ``rng_state_bytes``), Python objects, the loss value itself (it is an output, not saved).

    Attribution: each record carries the innermost running module (global module forward hooks)
    and the torch function running at save time (a ``TorchFunctionMode``), plus the ``grad_fn`` of
    the saved tensor (its producer).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        exclude: Iterable[torch.Tensor] = (),
        track_ops: bool = True,
        track_modules: bool = True,
    ) -> None:
        self.model = model
        self._excluded: set[int] = set()
        if model is not None:
            for p in model.parameters():
                self._excluded.add(storage_key(p))
            for b in model.buffers():
                self._excluded.add(storage_key(b))
        for t in exclude:
            self._excluded.add(storage_key(t))
        self._excluded.discard(0)
        self.records: dict[int, SavedRecord] = {}
        #: records whose storage was released during the forward (address later reused)
        self.retired: list[SavedRecord] = []
        self._holders: dict[int, list[weakref.ref]] = defaultdict(list)
        self._excluded_seen: dict[int, int] = {}
        self._closures: list[tuple[weakref.ref, list[torch.Tensor]]] = []
        self._ckpt_inputs: set[int] = set()
        self.n_checkpoint_calls = 0
        self.rng_state_bytes = 0
        self._track_ops = track_ops
        self._track_modules = track_modules
        self._ops = _OpStack() if track_ops else None
        self._mod_stack: list[nn.Module] = []
        self._names: dict[int, str] = {}
        self._param_names: dict[int, str] = {}
        if model is not None:
            self._names = {id(m): _strip_peft_prefix(n) for n, m in model.named_modules()}
            self._param_names = {id(p): _strip_peft_prefix(n) for n, p in model.named_parameters()}
        self._stack = contextlib.ExitStack()

    # ---- hooks -----------------------------------------------------------------------------
    def _where(self) -> tuple[str, str]:
        if self._mod_stack:
            m = self._mod_stack[-1]
            return self._names.get(id(m), type(m).__name__), type(m).__name__
        return "", ""

    def _pack(self, t: torch.Tensor) -> _Held:
        held = _Held(t.detach())
        if t.device.type == "meta":
            return held
        st = t.untyped_storage()
        key = st.data_ptr()
        nbytes = st.nbytes()
        if key == 0 or nbytes == 0:
            return held
        if key in self._excluded:
            self._excluded_seen[key] = nbytes
            return held
        module, module_type = self._where()
        if self._ops is not None and self._ops.stack:
            op = self._ops.stack[-1]
        elif key in self._ckpt_inputs:
            op = "checkpoint_input"
        else:
            op = "<python>"
        rec = self.records.get(key)
        if rec is not None and not any(r() is not None for r in self._holders[key]):
            # every earlier save of this address was released (its sub-graph died) and the CPU allocator
            # handed the address out again: it is a different tensor now, start a fresh record
            rec.alive = False
            self.retired.append(rec)
            self._holders[key] = []
            rec = None
        if rec is None:
            gf = t.grad_fn
            param_copy = self._param_copy_of(gf) if gf is not None else ""
            rec = SavedRecord(
                key=key,
                nbytes=nbytes,
                shape=tuple(t.shape),
                dtype=str(t.dtype).replace("torch.", ""),
                module=module,
                module_type=module_type,
                op=op,
                producer=type(gf).__name__ if gf is not None else "",
                param_copy=param_copy,
            )
            self.records[key] = rec
        else:
            rec.n_saves += 1
        rec.savers.append(f"{module}:{op}")
        self._holders[key].append(weakref.ref(held))
        return held

    def _param_copy_of(self, gf: Any) -> str:
        """Name of the parameter reached from ``gf`` through view/cast nodes only ('' if none)."""
        node = gf
        for _ in range(4):
            name = type(node).__name__
            if name == "AccumulateGrad":
                return self._param_names.get(id(node.variable), "")
            if name not in ("ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0",
                            "PermuteBackward0", "ExpandBackward0", "UnsqueezeBackward0"):
                return ""
            nxt = [f for f, _ in node.next_functions if f is not None]
            if len(nxt) != 1:
                return ""
            node = nxt[0]
        return ""

    @staticmethod
    def _unpack(held: _Held) -> torch.Tensor:
        return held.t

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        self._mod_stack.append(module)

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        # pop up to and including `module` (robust to modules whose pre-hook we missed)
        for i in range(len(self._mod_stack) - 1, -1, -1):
            if self._mod_stack[i] is module:
                del self._mod_stack[i:]
                break

    # ---- checkpoint wrapping ------------------------------------------------------------------
    def wrap_checkpoint_fn(self, ckpt_fn: Callable) -> Callable:
        """Wrap a checkpoint function (``torch.utils.checkpoint.checkpoint`` or HF's partial of it)
        so that the tensors it keeps alive through closures are recorded."""
        tracker = self

        @functools.wraps(ckpt_fn)
        def wrapped(function: Callable, *args: Any, **kwargs: Any) -> Any:
            tracker.n_checkpoint_calls += 1
            tracker.rng_state_bytes += torch.get_rng_state().numel()
            for t in _iter_tensors(list(args)):
                tracker._ckpt_inputs.add(storage_key(t))
            closure = [t.detach() for t in _iter_tensors(function)] + [
                t.detach() for t in _iter_tensors({k: v for k, v in kwargs.items()})
            ]
            try:
                ref = weakref.ref(function)
            except TypeError:  # pragma: no cover - plain functions/lambdas are weakref-able anyway
                ref = lambda: function  # noqa: E731
            tracker._closures.append((ref, closure))
            return ckpt_fn(function, *args, **kwargs)

        return wrapped

    @contextlib.contextmanager
    def _patched_checkpointing(self) -> Iterator[None]:
        patched: list[tuple[nn.Module, Any]] = []
        if self.model is not None:
            for m in self.model.modules():
                fn = m.__dict__.get("_gradient_checkpointing_func")
                if fn is not None:
                    patched.append((m, fn))
                    m._gradient_checkpointing_func = self.wrap_checkpoint_fn(fn)
        try:
            yield
        finally:
            for m, fn in patched:
                m._gradient_checkpointing_func = fn

    def __enter__(self) -> SavedTensorTracker:
        st = self._stack
        st.enter_context(self._patched_checkpointing())
        if self._track_modules:
            h1 = nn.modules.module.register_module_forward_pre_hook(self._pre_hook)
            h2 = nn.modules.module.register_module_forward_hook(self._post_hook, always_call=True)
            st.callback(h1.remove)
            st.callback(h2.remove)
        st.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        if self._ops is not None:
            st.enter_context(self._ops)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    # ---- results -------------------------------------------------------------------------------
    def _closure_records(self) -> list[SavedRecord]:
        out: dict[int, SavedRecord] = {}
        for ref, tensors in self._closures:
            if ref() is None:
                continue
            for t in tensors:
                key = storage_key(t)
                if key == 0 or key in self._excluded or key in out:
                    continue
                out[key] = SavedRecord(
                    key=key,
                    nbytes=storage_nbytes(t),
                    shape=tuple(t.shape),
                    dtype=str(t.dtype).replace("torch.", ""),
                    module="",
                    module_type="",
                    op="checkpoint_closure",
                    producer="",
                    savers=["checkpoint_closure"],
                )
        return list(out.values())

    def alive_records(self) -> list[SavedRecord]:
        """Saved storages still held by the autograd graph now, each once (plus closure tensors)."""
        out: list[SavedRecord] = []
        keys: set[int] = set()
        for key, rec in self.records.items():
            rec.alive = any(r() is not None for r in self._holders[key])
            if rec.alive:
                out.append(rec)
                keys.add(key)
        for rec in self._closure_records():
            if rec.key not in keys:
                out.append(rec)
                keys.add(rec.key)
        return out

    def saved_bytes(self) -> int:
        """Bytes of all alive saved storages (see class docstring)."""
        return sum(r.nbytes for r in self.alive_records())

    def excluded_bytes(self) -> int:
        """Bytes of parameter/buffer storages that autograd saved (not activations)."""
        return sum(self._excluded_seen.values())

    def by_op(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.alive_records():
            out[r.op] += r.nbytes
        return dict(out)

    def by_module(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.alive_records():
            out[r.module or "<top>"] += r.nbytes
        return dict(out)


# --------------------------------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------------------------------


def make_optimizer(name: str, params: list[nn.Parameter], lr: float = 1e-4) -> torch.optim.Optimizer:
    """Build a real optimizer by name.

    * ``"adamw"``: ``torch.optim.AdamW`` (foreach default, weight_decay 0.01).
    * ``"sgd"``: ``torch.optim.SGD(momentum=0.9)``.
    * ``"adafactor"``: ``transformers.optimization.Adafactor`` (what HF Trainer's ``optim="adafactor"``
      uses; ``scale_parameter=False, relative_step=False, warmup_init=False``, ``beta1=None``).
    * ``"adafactor_torch"``: ``torch.optim.Adafactor``.
    * ``"adamw_8bit"`` / ``"paged_adamw_8bit"``: ``bitsandbytes.optim.AdamW8bit`` /
      ``PagedAdamW8bit``. Both RUN ON CPU with bitsandbytes 0.50.2; the paged one warns
      "Paged optimizers are not supported on CPU" and falls back to ordinary (non-paged) buffers.
    """
    name = name.lower()
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    if name == "adafactor_torch":
        return torch.optim.Adafactor(params, lr=lr)
    if name in ("adamw_8bit", "paged_adamw_8bit"):
        import bitsandbytes as bnb

        cls = bnb.optim.AdamW8bit if name == "adamw_8bit" else bnb.optim.PagedAdamW8bit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}")


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, int], int]:
    """Bytes of every tensor in ``optimizer.state`` (each storage once).

    Returns ``(total_unique_bytes, bytes_by_state_key_unique, total_bytes_counting_shared_per_param)``.
    bitsandbytes' quantization maps ``qmap1``/``qmap2`` are the same tensor object for every parameter,
    hence the unique/per-param distinction. Non-tensor state (Python ints like bnb's/Adafactor's
    ``step``) costs no tensor memory and is ignored; transformers' Adafactor keeps ``RMS`` as a 0-dim
    fp32 tensor per parameter (4 bytes, counted).
    """
    seen: set[int] = set()
    by_key: dict[str, int] = defaultdict(int)
    total = 0
    per_param_total = 0
    for state in optimizer.state.values():
        for k, v in state.items():
            if not isinstance(v, torch.Tensor):
                continue
            nb = storage_nbytes(v)
            per_param_total += nb
            key = storage_key(v)
            if key in seen and key != 0:
                continue
            seen.add(key)
            by_key[k] += nb
            total += nb
    return total, dict(by_key), per_param_total


# --------------------------------------------------------------------------------------------------
# One training step
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class StepMeasure:
    """Exact byte counts from one real training step (see :func:`measure_step`)."""

    param_bytes: int
    trainable_param_bytes: int
    frozen_param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    saved_activation_bytes: int
    saved_by_kind: dict[str, int]
    n_trainable_tensors: int
    # --- extras useful for debugging / exact formulas ---
    #: bitsandbytes quantization state (4-bit absmax/code/nested absmax, 8-bit SCB) included in
    #: ``param_bytes``/``frozen_param_bytes`` (Params4bit storages themselves are the packed uint8)
    quant_state_bytes: int = 0
    buffer_bytes: int = 0
    saved_by_module: dict[str, int] = dataclasses.field(default_factory=dict)
    optimizer_state_by_key: dict[str, int] = dataclasses.field(default_factory=dict)
    optimizer_state_bytes_per_param_sum: int = 0
    excluded_param_saved_bytes: int = 0
    checkpoint_calls: int = 0
    checkpoint_rng_state_bytes: int = 0
    loss: float = float("nan")
    records: list[SavedRecord] = dataclasses.field(default_factory=list, repr=False)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def _quant_state_tensors(p: torch.Tensor) -> list[torch.Tensor]:
    """Tensors hanging off a bitsandbytes ``Params4bit.quant_state`` (absmax, code, nested state2...)."""
    out: list[torch.Tensor] = []
    qs = getattr(p, "quant_state", None)
    depth = 0
    while qs is not None and depth < 4:
        for name in ("absmax", "code", "offset"):
            t = getattr(qs, name, None)
            if isinstance(t, torch.Tensor):
                out.append(t)
        qs = getattr(qs, "state2", None)
        depth += 1
    scb = getattr(p, "SCB", None)  # Int8Params row scales
    if isinstance(scb, torch.Tensor):
        out.append(scb)
    return out


def _unique_param_bytes(params: Iterable[torch.Tensor], *, with_quant_state: bool = False) -> int:
    """Bytes of distinct storages; optionally plus bitsandbytes quantization state of each param."""
    seen: set[int] = set()
    total = 0
    for p in params:
        tensors = [p] + (_quant_state_tensors(p) if with_quant_state else [])
        for t in tensors:
            key = storage_key(t)
            if key in seen and key != 0:
                continue
            seen.add(key)
            total += storage_nbytes(t)
    return total


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _hf_inner(model: nn.Module) -> nn.Module:
    """The transformers PreTrainedModel inside a PEFT wrapper (or the model itself)."""
    inner = model
    for _ in range(4):
        if hasattr(inner, "activation_checkpointing_enable") or hasattr(inner, "gradient_checkpointing_enable"):
            if type(inner).__module__.startswith("transformers"):
                return inner
        nxt = getattr(inner, "base_model", None)
        if nxt is None or nxt is inner:
            nxt = getattr(inner, "model", None)
        if nxt is None:
            break
        inner = nxt
    return model


def set_gradient_checkpointing(model: nn.Module, enable: bool, checkpoint_kwargs: dict | None = None) -> None:
    """Turn HF activation checkpointing on/off exactly as transformers' Trainer does.

    On: ``activation_checkpointing_enable(activation_checkpointing_kwargs)`` (``gradient_checkpointing_
    enable`` on older versions); ``None`` kwargs means transformers' default ``{"use_reentrant": False}``.
    transformers then calls ``enable_input_require_grads()`` itself; we also call it when any parameter
    is frozen (PEFT), as Trainer/PEFT do.
    """
    hf = _hf_inner(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if enable:
            if hasattr(hf, "activation_checkpointing_enable"):
                hf.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs)
            else:  # pragma: no cover - transformers < 5.x
                hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)
            frozen = any(not p.requires_grad for p in model.parameters())
            hooked = getattr(hf, "_require_grads_hook", None) is not None
            if frozen and not hooked and hasattr(hf, "enable_input_require_grads"):
                hf.enable_input_require_grads()
        else:
            on = getattr(hf, "is_activation_checkpointing", None)
            if on is None:
                on = any(getattr(m, "gradient_checkpointing", False) for m in hf.modules())
            if on:
                if hasattr(hf, "activation_checkpointing_disable"):
                    hf.activation_checkpointing_disable()
                else:  # pragma: no cover
                    hf.gradient_checkpointing_disable()


def measure_step(
    model: nn.Module,
    *,
    batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    optimizer: str = "adamw",
    lr: float = 1e-4,
    dtype: str | None = None,
    seed: int = 0,
    checkpoint_kwargs: dict | None = None,
    keep_records: bool = True,
    track_ops: bool = True,
    forward_only: bool = False,
) -> StepMeasure:
    """Run ONE real training step and count bytes exactly.

    Procedure: ``model.train()``; set HF activation checkpointing on/off (:func:`set_gradient_
    checkpointing`); ``torch.manual_seed(seed)``; ``input_ids = randint(vocab, (batch, seq_len))``;
    forward ``model(input_ids=input_ids, labels=input_ids)`` under :class:`SavedTensorTracker`, so the
    model's own loss (``ForCausalLMLoss``: ``logits.float()``, shift, ``cross_entropy``) is inside;
    drop the outputs except ``loss`` (HF Trainer also discards the logits before backward) and count
    the alive saved storages; ``loss.backward()``; sum ``p.grad`` storages; build the optimizer over
    trainable parameters (:func:`make_optimizer`) and ``step()``; sum optimizer state.

    Args:
        dtype: compute dtype. ``None`` (or the model's own dtype) = plain training in the model
            dtype. A different value (e.g. ``"bf16"`` on an fp32 model) runs the forward under
            ``torch.autocast("cpu", dtype)``, i.e. mixed precision as HF Trainer's ``bf16=True``; the
            low-precision weight copies autocast makes and saves are counted as activations
            (op/producer ``ToCopyBackward0`` or ``_to_copy``).
        checkpoint_kwargs: passed to ``activation_checkpointing_enable`` (``None`` = HF default,
            non-reentrant). Use ``{"use_reentrant": True}`` to measure reentrant checkpointing.
        keep_records: keep per-storage :class:`SavedRecord` s in the result.
        forward_only: stop after counting the saved activations (no backward, no optimizer step,
            so the weights are not changed); gradient/optimizer fields are then 0.

    Note: a full step really updates the weights (``optimizer.step()``), so repeated calls on the
    same model see different weights (MoE routing may change; byte counts with the default
    ``grouped_mm`` experts do not depend on the routing).

    Field meanings (bytes, exact): ``param_bytes`` = all parameter storages once (tied counted once;
    for bitsandbytes 4-bit weights the packed uint8 storage plus its ``quant_state`` tensors);
    ``trainable_param_bytes``/``frozen_param_bytes`` split it by ``requires_grad``; ``grad_bytes`` =
    ``p.grad`` storages after backward; ``optimizer_state_bytes`` = every tensor in
    ``optimizer.state`` once (AdamW: ``exp_avg`` + ``exp_avg_sq`` + a 4-byte fp32 ``step`` tensor per
    parameter tensor; on CUDA that ``step`` lives on the host unless ``fused``/``capturable``);
    ``saved_activation_bytes`` = :class:`SavedTensorTracker` total at the end of the forward;
    ``saved_by_kind`` = the same split by the torch function that saved it (``linear``, ``softmax``,
    ``embedding``, ``cross_entropy``, ``checkpoint_input``, ``checkpoint_closure``, ...).
    """
    model.train()
    set_gradient_checkpointing(model, gradient_checkpointing, checkpoint_kwargs)
    for p in model.parameters():
        p.grad = None

    hf = _hf_inner(model)
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    vocab = int(cfg.vocab_size)
    device = next(model.parameters()).device
    model_dtype = _model_dtype(model)
    autocast_dtype = None
    if dtype is not None and _torch_dtype(dtype) != model_dtype:
        autocast_dtype = _torch_dtype(dtype)

    params = [p for _, p in _unique_named_parameters(model)]
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    # parameter bytes are taken before the step (bitsandbytes int8 may move its SCB scales in forward)
    param_bytes = _unique_param_bytes(params, with_quant_state=True)
    trainable_param_bytes = _unique_param_bytes(trainable, with_quant_state=True)
    frozen_param_bytes = _unique_param_bytes(frozen, with_quant_state=True)
    quant_state_bytes = param_bytes - _unique_param_bytes(params)

    torch.manual_seed(seed)
    input_ids = torch.randint(0, vocab, (batch, seq_len), device=device)
    tracker = SavedTensorTracker(model, track_ops=track_ops)
    ac = (
        torch.autocast(device_type=device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with tracker, ac:
        out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
        loss = out.loss
    del out
    records = tracker.alive_records()
    saved = sum(r.nbytes for r in records)
    by_kind: dict[str, int] = defaultdict(int)
    by_module: dict[str, int] = defaultdict(int)
    for r in records:
        by_kind[r.op] += r.nbytes
        by_module[r.module or "<top>"] += r.nbytes

    loss_value = float(loss.detach().float())
    if forward_only:
        grad_bytes = opt_total = opt_per_param = 0
        opt_by_key: dict[str, int] = {}
    else:
        loss.backward()
        grad_bytes = _unique_param_bytes(p.grad for p in params if p.grad is not None)
        opt = make_optimizer(optimizer, trainable, lr=lr)
        opt.step()
        opt_total, opt_by_key, opt_per_param = optimizer_state_bytes(opt)
        del opt
        for p in params:
            p.grad = None
    del loss

    return StepMeasure(
        param_bytes=param_bytes,
        trainable_param_bytes=trainable_param_bytes,
        frozen_param_bytes=frozen_param_bytes,
        quant_state_bytes=quant_state_bytes,
        grad_bytes=grad_bytes,
        optimizer_state_bytes=opt_total,
        saved_activation_bytes=saved,
        saved_by_kind=dict(by_kind),
        n_trainable_tensors=len(trainable),
        buffer_bytes=_unique_param_bytes(model.buffers()),
        saved_by_module=dict(by_module),
        optimizer_state_by_key=opt_by_key,
        optimizer_state_bytes_per_param_sum=opt_per_param,
        excluded_param_saved_bytes=tracker.excluded_bytes(),
        checkpoint_calls=tracker.n_checkpoint_calls,
        checkpoint_rng_state_bytes=tracker.rng_state_bytes,
        loss=loss_value,
        records=records if keep_records else [],
        meta={
            "batch": batch,
            "seq_len": seq_len,
            "gradient_checkpointing": gradient_checkpointing,
            "checkpoint_kwargs": checkpoint_kwargs,
            "optimizer": optimizer,
            "model_dtype": str(model_dtype).replace("torch.", ""),
            "autocast_dtype": None if autocast_dtype is None else str(autocast_dtype).replace("torch.", ""),
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "experts_implementation": getattr(hf.config, "_experts_implementation", None),
            "model_type": getattr(cfg, "model_type", None),
            "vocab_size": vocab,
            "hidden_size": getattr(cfg, "hidden_size", None),
        },
    )


# --------------------------------------------------------------------------------------------------
# Allocator-level cross-check
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LiveBytes:
    """Result of :func:`live_bytes_after_forward`."""

    live_bytes: int  #: net CPU bytes allocated during the region and still alive at its end
    allocated_bytes: int  #: sum of all allocations in the region (peak-ish upper bound)
    n_alloc: int
    n_free: int
    loss_bytes: int  #: storage of the loss tensor (alive because we keep it)
    input_bytes: int  #: storage of input_ids (allocated inside the region and kept)
    #: address -> bytes of every allocation made in the region and not freed by its end
    live_allocations: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)
    loss_key: int = 0  #: address of the loss storage
    input_key: int = 0  #: address of the input_ids storage
    #: with ``with_hooks``: the hook measurement taken in the SAME forward (same addresses)
    hook_saved_bytes: int = 0
    #: live allocations that are not saved-tensor storages (loss, RNG states, wrapped scalars ...)
    not_saved_live: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)
    #: saved storages not allocated inside the region (should be empty)
    saved_not_live: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)
    checkpoint_calls: int = 0

    def explain(self) -> dict[str, int]:
        """Classify ``not_saved_live`` blocks: loss, input_ids (when not saved, e.g. frozen embedding),
        checkpoint RNG states (5056 B), 8-byte wrapped-number scalars; anything else is ``other``."""
        out: dict[str, int] = defaultdict(int)
        for key, nb in self.not_saved_live.items():
            if key == self.loss_key:
                out["loss"] += nb
            elif key == self.input_key:
                out["input_ids"] += nb  # allocated in the region and held by the caller, not saved
            elif nb == 5056:
                out["checkpoint_rng_state"] += nb
            elif nb == 8:
                out["wrapped_number_scalars_8B"] += nb
            else:
                out["other"] += nb
        return dict(out)


def _live_allocations(prof: Any) -> dict[int, int]:
    """Replay the profiler's allocation/free events (in time order) into address -> live bytes."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu":
                events.append((node.start_time_ns, int(f.ptr), int(f.alloc_size)))
    events.sort(key=lambda e: e[0])
    live: dict[int, int] = {}
    for _, ptr, size in events:
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    return live


def live_bytes_after_forward(
    model: nn.Module,
    *,
    batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    dtype: str | None = None,
    seed: int = 0,
    checkpoint_kwargs: dict | None = None,
    with_hooks: bool = True,
) -> LiveBytes:
    """Allocator-level count of what a training forward leaves alive (independent of the hooks).

    Runs the same forward as :func:`measure_step` (random ``input_ids`` created INSIDE the region,
    ``labels=input_ids``, the model's own loss, outputs dropped except ``loss``) under
    ``torch.profiler.profile(activities=[CPU], profile_memory=True)`` and sums the ``[memory]``
    events of the raw kineto trace: every CPU allocation is a positive event and every free a
    negative one, so the sum is exactly the bytes allocated in the region and still alive at its end
    (the CPU allocator does not cache). ``live_allocations`` replays the same events by address
    (``experimental_event_tree``), so each live block can be matched with a saved-tensor record
    (``SavedRecord.key`` is the same address). The result should equal the hook measurement plus the loss
    scalar (and any other live non-saved tensors, e.g. checkpoint RNG states, see the report).
    The backward is not run; the graph is freed on return.
    """
    from torch.profiler import ProfilerActivity, profile

    model.train()
    set_gradient_checkpointing(model, gradient_checkpointing, checkpoint_kwargs)
    hf = _hf_inner(model)
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    vocab = int(cfg.vocab_size)
    device = next(model.parameters()).device
    model_dtype = _model_dtype(model)
    autocast_dtype = None
    if dtype is not None and _torch_dtype(dtype) != model_dtype:
        autocast_dtype = _torch_dtype(dtype)
    ac = (
        torch.autocast(device_type=device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    # warm-up forward outside the region so lazy one-time allocations (caches) are not counted
    torch.manual_seed(seed)
    with ac:
        warm = model(input_ids=torch.randint(0, vocab, (batch, seq_len), device=device), labels=None, use_cache=False)
    del warm
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            input_ids = torch.randint(0, vocab, (batch, seq_len), device=device)
            tracker = SavedTensorTracker(model, track_ops=False) if with_hooks else contextlib.nullcontext()
            with tracker, ac:
                out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
                loss = out.loss
            del out
    live_map = _live_allocations(prof)
    alloc = n_alloc = n_free = 0
    for ev in prof.profiler.kineto_results.events():
        if ev.name() != "[memory]":
            continue
        nb = int(ev.nbytes())
        if nb > 0:
            alloc += nb
            n_alloc += 1
        elif nb < 0:
            n_free += 1
    result = LiveBytes(
        live_bytes=sum(live_map.values()),
        allocated_bytes=alloc,
        n_alloc=n_alloc,
        n_free=n_free,
        loss_bytes=storage_nbytes(loss),
        input_bytes=storage_nbytes(input_ids),
        live_allocations=live_map,
        loss_key=storage_key(loss),
        input_key=storage_key(input_ids),
    )
    if with_hooks:
        records = tracker.alive_records()
        keys = {r.key for r in records}
        result.hook_saved_bytes = sum(r.nbytes for r in records)
        result.not_saved_live = {k: v for k, v in live_map.items() if k not in keys}
        result.saved_not_live = {r.key: r.nbytes for r in records if r.key not in live_map}
        result.checkpoint_calls = tracker.n_checkpoint_calls
    del loss
    return result
