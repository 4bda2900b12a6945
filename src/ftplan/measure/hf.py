"""Hugging Face models as ftplan measures them: one place for building, quantizing and LoRA.

* :func:`build_model`: a real ``AutoModelForCausalLM`` from a config.json dict with random weights
  (optionally requantized through the real bitsandbytes ``from_pretrained`` path): the exact CPU
  reference counts of :mod:`ftplan.measure.torchref` and the tests.
* :func:`build_for_job`: the model of a :class:`ftplan.job.Job` on a device, as the reference stack
  holds it (``ftplan measure``): dtypes of the precision, 4-bit layers made one at a time, LoRA.
* :func:`apply_lora` (real PEFT, and what PEFT really targeted), :func:`set_gradient_checkpointing`
  (as HF Trainer), :func:`make_optimizer` / :func:`trainer_optimizer`.

Imports torch at import time: only measurement code and tests import this module. Tiny configs are
in :mod:`ftplan.measure.configs` (stdlib only).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from typing import Any

import torch
from torch import nn

from ..errors import MeasurementError
from .configs import default_attention, text_config

__all__ = [
    "DTYPES",
    "torch_dtype",
    "build_model",
    "CausalLM",
    "build_for_job",
    "attn_implementation",
    "materialize_meta",
    "quantize_linears",
    "LoraApplied",
    "apply_lora",
    "owner_of",
    "is_norm",
    "strip_peft_prefix",
    "PEFT_SEGMENTS",
    "LORA_PARAM_RE",
    "model_dtype",
    "hf_inner",
    "set_gradient_checkpointing",
    "make_optimizer",
    "trainer_optimizer",
]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}

def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}") from None


# --------------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------------

#: model types whose causal LM transformers 5.24's ``AutoModelForCausalLM`` does not map: only its
#: pretraining and image-text auto classes name ``Mistral4ForCausalLM`` (mistral4)
CAUSAL_LM_CLASSES = {"mistral4": "Mistral4ForCausalLM"}


class CausalLM:
    """``AutoModelForCausalLM`` where transformers maps the model type, else the family's own
    causal LM class (:data:`CAUSAL_LM_CLASSES`)."""

    @staticmethod
    def from_config(config, **kwargs):
        import transformers

        name = CAUSAL_LM_CLASSES.get(getattr(config, "model_type", None))
        if name is None:
            return transformers.AutoModelForCausalLM.from_config(config, **kwargs)
        return getattr(transformers, name)._from_config(config, **kwargs)

    @staticmethod
    def from_pretrained(path, **kwargs):
        import transformers

        config = kwargs.get("config") or transformers.AutoConfig.from_pretrained(path)
        name = CAUSAL_LM_CLASSES.get(getattr(config, "model_type", None))
        cls = transformers.AutoModelForCausalLM if name is None else getattr(transformers, name)
        return cls.from_pretrained(path, **kwargs)



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
    from transformers import AutoConfig

    model_type, cfg = text_config(config)
    tdtype = torch_dtype(dtype)
    hf_config = AutoConfig.for_model(model_type, **cfg)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation, "dtype": tdtype}
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if device == "meta":
            with torch.device("meta"):
                model = CausalLM.from_config(hf_config, **kwargs)
        else:
            model = CausalLM.from_config(hf_config, **kwargs)
            model = model.to(device)
    if quantization is not None:
        model = _requantize(model, quantization, tdtype, attn_implementation, experts_implementation)
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

    from transformers import BitsAndBytesConfig

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
        return CausalLM.from_pretrained(d, quantization_config=qc, device_map="cpu", **kwargs)


def attn_implementation(job) -> str:
    """The transformers ``attn_implementation`` of a job (flash needs the flash_attn package)."""
    if job.attn_impl == "flash":
        try:
            importlib.import_module("flash_attn")
        except ImportError:
            raise MeasurementError("attention 'flash' needs the flash_attn package, which is not installed",
                                   "use `attn=sdpa` or install flash-attn") from None
        return "flash_attention_2"
    return job.attn_impl


def materialize_meta(model: nn.Module, device, dtype) -> None:
    """Give every meta parameter real random storage on ``device`` (ties kept)."""
    memo: dict[int, Any] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_meta:
                continue
            if id(p) in memo:
                mod._parameters[name] = memo[id(p)]
                continue
            t = torch.empty(p.shape, dtype=p.dtype, device=device)
            if name == "bias":
                t.zero_()
            elif t.dim() >= 2:
                t.normal_(0.0, 0.02)
            else:
                t.fill_(1.0)
            newp = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            memo[id(p)] = newp
            mod._parameters[name] = newp
        for name, b in list(mod._buffers.items()):
            if b is not None and b.device != torch.device(device) and not b.is_meta:
                mod._buffers[name] = b.to(device)


def quantize_linears(model: nn.Module, job, device) -> int:
    """Replace each nn.Linear (bar ``quant.skip_modules``) by a bnb Linear4bit, one at a time."""
    import bitsandbytes as bnb

    q = job.quant
    cdtype = torch_dtype(q.compute_dtype)
    skip = set(q.skip_modules)
    n = 0
    for parent_name, parent in list(model.named_modules()):
        for cname, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or cname in skip:
                continue
            fin, fout = child.in_features, child.out_features
            new = bnb.nn.Linear4bit(fin, fout, bias=child.bias is not None, compute_dtype=cdtype,
                                    compress_statistics=q.double_quant, quant_type=q.quant_type,
                                    device="meta")
            w = torch.empty(fout, fin, dtype=cdtype, device=device).normal_(0.0, 0.02)
            new.weight = bnb.nn.Params4bit(w, requires_grad=False, blocksize=q.blocksize,
                                           compress_statistics=q.double_quant, quant_type=q.quant_type,
                                           module=new).to(device)
            del w  # the bf16 copy of this one layer is freed before the next is made
            if child.bias is not None:
                new.bias = torch.nn.Parameter(torch.zeros(fout, dtype=cdtype, device=device),
                                              requires_grad=False)
            new.train(child.training)
            setattr(parent, cname, new)
            n += 1
    return n


def build_for_job(config: dict, job, device: str, seed: int = 0) -> nn.Module:
    """The model of ``job`` (:class:`ftplan.job.Job`) on ``device``, held as the reference stack
    holds it: trainable parameters set, 4-bit quantized for QLoRA (one layer at a time, never a
    whole bf16 copy), PEFT LoRA applied (QLoRA: after ``prepare_model_for_kbit_training`` under
    PEFT's recipe; under TRL's the adapters are cast to bf16 afterwards, as ``SFTTrainer`` does)."""
    from transformers import AutoConfig

    from ..job import PRECISIONS

    model_type, cfg = text_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = AutoConfig.for_model(model_type, **cfg)
    hf_config.use_cache = False
    attn = attn_implementation(job)
    if attn == "sdpa":
        # transformers refuses sdpa with soft-capping (Gemma2) and attention sinks (gpt-oss);
        # ftplan plans eager too
        attn = default_attention(config)
    torch.manual_seed(seed)
    prec = PRECISIONS[job.precision]
    dev = torch.device(device)
    if job.method == "full":
        dtype = torch_dtype(prec["trainable"])
    elif job.method == "lora":
        dtype = torch_dtype(job.frozen_dtype)
    else:
        dtype = torch_dtype(job.quant.compute_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if job.method == "qlora":
            from accelerate import init_empty_weights

            with init_empty_weights(include_buffers=False):
                model = CausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attn)
            # transformers 5 does not tie the output embedding of a model made under
            # init_empty_weights; from_pretrained does (tie_word_embeddings): tie before the meta
            # weights get storage, so a tied lm_head is one tensor, as in the real load
            model.tie_weights()
            quantize_linears(model, job, dev)
            materialize_meta(model, dev, dtype)
            model.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=...) sets
        else:
            with dev:
                model = CausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attn)
            model.to(dev)
    model.config.use_cache = False
    model.train()
    if job.uses_lora:
        if job.kbit_upcast:  # PEFT's QLoRA recipe; TRL's SFTTrainer skips it
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        from ..job import peft_target_modules
        from ..model import model_from_config

        # (all-linear, or on llama4_text the modules it stands for: PEFT wraps its router and fails)
        targets = peft_target_modules(model_from_config(config), job.lora)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = apply_lora(model, r=job.lora.r, alpha=job.lora.alpha, dropout=job.lora.dropout,
                               target_modules=targets).model
        if job.method == "qlora" and job.adapter_dtype != "fp32":
            # TRL >= 1.0 SFTTrainer (sft_trainer.py, "_is_quantized_model"): every trainable
            # parameter but DoRA's magnitude vector to bf16
            for name, p in model.named_parameters():
                if p.requires_grad and "lora_magnitude_vector" not in name:
                    p.data = p.data.to(torch_dtype(job.adapter_dtype))
        model.train()
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    return model


# --------------------------------------------------------------------------------------------------
# Module structure and LoRA
# --------------------------------------------------------------------------------------------------

PEFT_SEGMENTS = {"base_layer", "base_model", "default"}
LORA_PARAM_RE = re.compile(r"(^|\.)(lora_[A-Za-z_]+)(\.|$)")


def owner_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    if "." in name:
        mod_name, pname = name.rsplit(".", 1)
        return model.get_submodule(mod_name), pname
    return model, name


def is_norm(module: nn.Module) -> bool:
    cls = type(module).__name__
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or cls.endswith("Norm") or "RMSNorm" in cls


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


def strip_peft_prefix(name: str) -> str:
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

    Findings (peft 0.21.2 + transformers 5.23, verified by ``tests/measure/test_torchref_harness.py`` and
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
        owner, _ = owner_of(model, n)
        if id(p) not in linear_param_ids and not isinstance(owner, nn.Embedding) and not is_norm(owner):
            non_linear[n] = tuple(p.shape)
    peft_model = get_peft_model(model, LoraConfig(**kwargs), autocast_adapter_dtype=autocast_adapter_dtype)
    tuner = peft_model.base_model
    pc = peft_model.peft_config["default"]
    targeted = sorted({strip_peft_prefix(n) for n in getattr(tuner, "targeted_module_names", [])})
    targeted_params = sorted({strip_peft_prefix(n) for n in getattr(tuner, "targeted_parameter_names", [])})
    lora_params = sum(p.numel() for n, p in peft_model.named_parameters() if LORA_PARAM_RE.search(n))
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
# Training setup
# --------------------------------------------------------------------------------------------------


def model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def hf_inner(model: nn.Module) -> nn.Module:
    """The transformers PreTrainedModel inside a PEFT wrapper (or the model itself)."""
    inner = model
    for _ in range(4):
        if hasattr(inner, "activation_checkpointing_enable") and type(inner).__module__.startswith("transformers"):
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

    On: ``activation_checkpointing_enable(activation_checkpointing_kwargs)``; ``None`` kwargs means
    transformers' default ``{"use_reentrant": False}``. transformers then calls
    ``enable_input_require_grads()`` itself; we also call it when any parameter is frozen (PEFT), as
    Trainer/PEFT do.
    """
    hf = hf_inner(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if enable:
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs)
            frozen = any(not p.requires_grad for p in model.parameters())
            hooked = getattr(hf, "_require_grads_hook", None) is not None
            if frozen and not hooked:
                hf.enable_input_require_grads()
        elif hf.is_activation_checkpointing:
            hf.activation_checkpointing_disable()


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


def trainer_optimizer(name: str, params: list[nn.Parameter], lr: float = 1e-5) -> tuple[torch.optim.Optimizer, str]:
    """(optimizer, description) as HF Trainer builds it (weight decay 0, fused AdamW).

    :func:`make_optimizer` builds the same states with torch's own defaults (the reference counts).
    """
    if name == "adamw":
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True), "torch.optim.AdamW(fused=True)"
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0), "torch.optim.AdamW(foreach)"
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9), "torch.optim.SGD(momentum=0.9)"
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return (Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False),
                "transformers Adafactor")
    if name in ("adamw_8bit", "paged_adamw_8bit"):
        import bitsandbytes as bnb

        cls = bnb.optim.AdamW8bit if name == "adamw_8bit" else bnb.optim.PagedAdamW8bit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(params, lr=lr, weight_decay=0.0), f"bitsandbytes.optim.{cls.__name__}"
    raise ValueError(f"unknown optimizer {name!r}")


