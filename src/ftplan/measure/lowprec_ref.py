"""Exact CPU byte counts of low-precision training with the real torchao code (tests only).

torchao 0.18's float8 training (``Float8Linear``, tensorwise / rowwise / rowwise_with_gw_hp,
``torch._scaled_mm`` included) and its FP8 / NVFP4 weight-only tensors run on CPU with torch 2.13,
so the low-precision terms of the memory model are held against them byte for byte:

* :func:`convert_like_accelerate` swaps ``nn.Linear`` for ``Float8Linear`` exactly as accelerate's
  ``fp8_backend: AO`` does (``accelerate.utils.ao.convert_model_to_fp8_ao``: every linear with both
  dims divisible by 16 except the first and the last ``nn.Linear`` of the model);
* :func:`quantize_base` quantizes the frozen base weight-only as ``TorchAoConfig`` does (every
  ``nn.Linear`` except the ``lm_head``), before PEFT wraps it (``TorchaoLoraLinear``);
* :func:`cuda_autocast_semantics`: ``Float8Linear.forward`` casts its input to the autocast dtype
  only when ``torch.is_autocast_enabled()`` (the CUDA flag) is set; inside this context that
  flag reports CPU autocast, so a CPU run takes the code path a CUDA run takes;
* :func:`measure_lowprec_step` counts parameter storages through tensor subclasses
  (``__tensor_flatten__``) and the bytes autograd saves with :class:`~ftplan.measure.torchref.
  SavedTensorTracker`.

torch and torchao are imported lazily (this module is imported by tests only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from . import torchref as TR

__all__ = [
    "TORCHAO_RECIPE",
    "cuda_autocast_semantics",
    "convert_like_accelerate",
    "quantize_base",
    "inner_tensors",
    "param_storage_bytes",
    "LowPrecStep",
    "measure_lowprec_step",
]

#: ftplan recipe name -> torchao Float8LinearConfig recipe name
TORCHAO_RECIPE = {
    "fp8-tensorwise": "tensorwise",
    "fp8-rowwise": "rowwise",
    "fp8-rowwise-gw-hp": "rowwise_with_gw_hp",
}


@contextlib.contextmanager
def cuda_autocast_semantics() -> Iterator[None]:
    """Make ``torch.is_autocast_enabled()`` / ``torch.get_autocast_gpu_dtype()`` (no-argument, CUDA
    forms used by torchao's ``Float8Linear``) report the CPU autocast state."""
    is_enabled, gpu_dtype = torch.is_autocast_enabled, torch.get_autocast_gpu_dtype

    def _is_enabled(*args: Any) -> bool:
        return is_enabled(*args) if args else is_enabled("cpu")

    torch.is_autocast_enabled = _is_enabled  # type: ignore[assignment]
    torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype("cpu")  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.is_autocast_enabled = is_enabled  # type: ignore[assignment]
        torch.get_autocast_gpu_dtype = gpu_dtype  # type: ignore[assignment]


def convert_like_accelerate(model: nn.Module, recipe: str) -> nn.Module:
    """accelerate 1.15 ``_prepare_ao``: ``convert_model_to_fp8_ao(model, config)`` with the recipe's
    ``Float8LinearConfig`` (accelerate's default config is tensorwise)."""
    from accelerate.utils.ao import convert_model_to_fp8_ao
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPE[recipe])
    convert_model_to_fp8_ao(model, config=config)
    return model


def quantize_base(model: nn.Module, recipe: str) -> nn.Module:
    """Weight-only quantization of every ``nn.Linear`` but the ``lm_head`` (``TorchAoConfig``'s
    ``include_input_output_embeddings=False``)."""
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    if recipe == "fp8-weight-only":
        config = Float8WeightOnlyConfig()
    elif recipe == "nvfp4-weight-only":
        from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig

        config = NVFP4WeightOnlyConfig()
    else:  # pragma: no cover - programming error
        raise ValueError(recipe)

    def keep(mod: nn.Module, fqn: str) -> bool:
        return isinstance(mod, nn.Linear) and fqn.split(".")[-1] != "lm_head"

    quantize_(model, config, filter_fn=keep)
    return model


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding a (possibly subclass) tensor's data, recursively."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None or type(t) in (torch.Tensor, nn.Parameter):
        return [t]
    names, _ = t.__tensor_flatten__()
    out: list[torch.Tensor] = []
    for n in names:
        inner = getattr(t, n)
        if isinstance(inner, torch.Tensor):
            out += inner_tensors(inner)
    return out


def param_storage_bytes(params: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``params`` (tensor subclasses through their inner
    tensors: qdata, scales, per-tensor scale)."""
    seen: set[int] = set()
    total = 0
    for p in params:
        for t in inner_tensors(p):
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in seen and key != 0:
                continue
            seen.add(key)
            total += st.nbytes()
    return total


@dataclasses.dataclass
class LowPrecStep:
    trainable_param_bytes: int
    frozen_param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    saved_bytes: int  #: every storage autograd holds at the end of the forward
    weight_copy_bytes: int  #: of which: compute-dtype copies of weights (autocast casts, dequantized weights)
    records: list[TR.SavedRecord]

    @property
    def activation_bytes(self) -> int:
        return self.saved_bytes - self.weight_copy_bytes


class _SubclassAwareTracker(TR.SavedTensorTracker):
    """``SavedTensorTracker`` that also accepts tensor subclasses (torchao ``NVFP4Tensor``...):
    each inner plain tensor is recorded, all kept alive by one holder."""

    def _pack(self, t: torch.Tensor) -> Any:
        if type(t) in (torch.Tensor, nn.Parameter) or getattr(type(t), "__tensor_flatten__", None) is None:
            return super()._pack(t)
        held = _MultiHeld(t.detach())
        held.parts = [super(_SubclassAwareTracker, self)._pack(x) for x in inner_tensors(t)]
        return held


class _MultiHeld:
    __slots__ = ("t", "parts", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.parts: list[Any] = []


def _is_weight_copy(rec: TR.SavedRecord, weight_shapes: set[tuple[int, ...]]) -> bool:
    # autocast casts of trainable weights (found through the grad_fn chain), or a frozen weight
    # dequantized by a torchao tensor subclass (no grad_fn; same shape as a quantized weight)
    return bool(rec.param_copy) or (rec.producer == "" and rec.shape in weight_shapes)


def measure_lowprec_step(
    model: nn.Module,
    *,
    batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    autocast_dtype: torch.dtype | None = torch.bfloat16,
    optimizer: str = "adamw",
    seed: int = 0,
) -> LowPrecStep:
    """One real training step on CPU: forward under ``torch.autocast("cpu")`` with CUDA autocast
    semantics for torchao, count saved storages, backward, optimizer step, count states."""
    model.train()
    TR.set_gradient_checkpointing(model, gradient_checkpointing)
    params = list({id(p): p for p in model.parameters()}.values())
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    quantized_shapes = {tuple(p.shape) for p in frozen if type(p.data) not in (torch.Tensor,)
                        and len(inner_tensors(p)) > 1}
    exclude = [t for p in params for t in inner_tensors(p)] + list(model.buffers())
    tracker = _SubclassAwareTracker(None, exclude=exclude)
    tracker.model = model  # checkpoint closures are found through the model's modules
    tracker._names = {id(m): TR.strip_peft_prefix(n) for n, m in model.named_modules()}
    tracker._param_names = {id(p): TR.strip_peft_prefix(n) for n, p in model.named_parameters()}

    hf = TR.hf_inner(model)
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    torch.manual_seed(seed)
    input_ids = torch.randint(0, int(cfg.vocab_size), (batch, seq_len))
    ac = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
          else contextlib.nullcontext())
    with cuda_autocast_semantics(), tracker, ac:
        out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
        loss = out.loss
    del out
    records = tracker.alive_records()
    saved = sum(r.nbytes for r in records)
    copies = sum(r.nbytes for r in records if _is_weight_copy(r, quantized_shapes))
    with cuda_autocast_semantics():
        loss.backward()
    grads = param_storage_bytes(p.grad for p in params if p.grad is not None)
    opt = TR.make_optimizer(optimizer, trainable)
    opt.step()
    opt_bytes, _, _ = TR.optimizer_state_bytes(opt)
    return LowPrecStep(
        trainable_param_bytes=param_storage_bytes(trainable),
        frozen_param_bytes=param_storage_bytes(frozen),
        grad_bytes=grads,
        optimizer_state_bytes=opt_bytes,
        saved_bytes=saved,
        weight_copy_bytes=copies,
        records=records,
    )


@functools.lru_cache(maxsize=1)
def torchao_version() -> str:
    import torchao

    return torchao.__version__
