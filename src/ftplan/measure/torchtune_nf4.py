"""torchtune's QLoRA linears (torchao ``NF4Tensor`` bases) on CPU: exact bytes for the tests.

torchtune 0.3.1 (PyPI wheel, the code of its README's date) builds QLoRA models with
``quantize_base=True``: every decoder-layer linear becomes either ``LoRALinear(quantize_base=True)``
(a LoRA target, ``torchtune/modules/peft/lora.py``) or ``FrozenNF4Linear``
(``torchtune/modules/low_precision/nf4_linear.py``; ``models/llama3_1/_component_builders.py``
``lora_llama3_attention`` / ``llama3_mlp`` / ``lora_llama3_mlp``); the embedding and the output
projection stay in the model's dtype. Both hold ``torchao``'s ``to_nf4(weight)`` (block 64, scaler
block 256) and call ``linear_nf4(input, weight)``. The forwards below are transcribed from those
files (torchtune is not installed here: ``pip download --no-deps torchtune==0.3.1`` to read them;
its 0.3.1 files import ``torchao.dtypes.nf4tensor``, which torchao 0.18 moved to
``torchao.quantization.quantize_.workflows.nf4.nf4_tensor``, :func:`nf4_module`).

:func:`quantize_like_torchtune` swaps them into a Hugging Face model built in bf16, so that
``ftplan.measure.lowprec_ref.measure_lowprec_step`` counts parameters, gradients, optimizer states
and saved tensors; :func:`measure_linear_nf4` counts what one ``linear_nf4`` call saves and
allocates (the storage tracker of :mod:`~ftplan.measure.distributed`); :func:`fsdp2_shard_bytes`
cuts an ``NF4Tensor`` into dim-0 shards as torchtune's ``load_from_full_model_state_dict``
(``training/_distributed.py``) and FSDP2 do, and reads what ``fsdp_pre_all_gather`` sends.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

__all__ = ["FrozenNF4Linear", "LinearNF4Measure", "LoRALinearNF4", "fsdp2_shard_bytes", "measure_linear_nf4",
           "nf4_module", "quantize_like_torchtune"]


def nf4_module() -> Any:
    """torchao's NF4 module (``to_nf4``, ``linear_nf4``, ``NF4Tensor``), wherever the installed
    torchao keeps it."""
    try:
        from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor as m
    except ImportError:  # torchao < 0.14
        from torchao.dtypes import nf4tensor as m  # type: ignore[no-redef]
    return m


class FrozenNF4Linear(nn.Linear):
    """torchtune 0.3.1 ``FrozenNF4Linear``: a frozen ``NF4Tensor`` weight, no bias."""

    def __init__(self, weight: torch.Tensor) -> None:
        out_dim, in_dim = weight.shape
        super().__init__(in_dim, out_dim, bias=False, device="meta", dtype=weight.dtype)
        self.weight = nn.Parameter(nf4_module().to_nf4(weight.detach()), requires_grad=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return nf4_module().linear_nf4(input=input, weight=self.weight)


class LoRALinearNF4(nn.Module):
    """torchtune 0.3.1 ``LoRALinear(quantize_base=True)``: ``linear_nf4`` on the frozen NF4 base plus
    ``(alpha / rank) * lora_b(lora_a(dropout(x)))``, adapters in the model's dtype."""

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        out_dim, in_dim = weight.shape
        self.rank, self.alpha = rank, alpha
        self.weight = nn.Parameter(nf4_module().to_nf4(weight.detach()), requires_grad=False)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0.0 else nn.Identity()
        self.lora_a = nn.Linear(in_dim, rank, bias=False, dtype=weight.dtype)
        self.lora_b = nn.Linear(rank, out_dim, bias=False, dtype=weight.dtype)
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nf4_module().linear_nf4(input=x, weight=self.weight)
        lora_out = self.lora_a(self.dropout(x))
        lora_out = (self.alpha / self.rank) * self.lora_b(lora_out)
        return out + lora_out


def quantize_like_torchtune(model: nn.Module, targets: set[str], rank: int, alpha: float,
                            dropout: float = 0.0, skip: tuple[str, ...] = ("lm_head",)) -> nn.Module:
    """Replace every ``nn.Linear`` but ``skip`` with torchtune's QLoRA linears (``targets``: the leaf
    names that get LoRA) and freeze everything else, as torchtune's ``set_trainable_params`` does."""
    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if not isinstance(child, nn.Linear) or child_name in skip:
                continue
            if child.bias is not None:
                raise ValueError(f"{name}.{child_name}: torchtune's NF4 linears refuse a bias")
            new = (LoRALinearNF4(child.weight, rank, alpha, dropout) if child_name in targets
                   else FrozenNF4Linear(child.weight))
            setattr(mod, child_name, new)
    return model


@dataclasses.dataclass(frozen=True)
class LinearNF4Measure:
    """One ``linear_nf4`` forward and backward of an ``out x in`` bf16 weight on ``tokens`` rows."""

    numel: int
    weight_bytes: int  #: every storage of the NF4Tensor
    saved: tuple[str, ...]  #: type names of what autograd saved
    saved_weight_only: bool  #: the one saved tensor is the NF4 weight itself
    forward_peak_bytes: int  #: peak above the live bytes before the call (the output included)
    backward_peak_bytes: int  #: peak above the live bytes before backward (the incoming gradient included)
    output_bytes: int
    grad_input_bytes: int


def measure_linear_nf4(out_features: int, in_features: int, tokens: int, dtype: torch.dtype = torch.bfloat16
                       ) -> LinearNF4Measure:
    """What one ``linear_nf4`` call saves for backward and allocates, counted by the storage tracker
    (every storage an op returns; the weight's own storages registered first, so they are not
    counted as allocations)."""
    from .distributed import StorageTracker
    from .lowprec_ref import inner_tensors, param_storage_bytes

    m = nf4_module()
    torch.manual_seed(0)
    w = m.to_nf4(torch.randn(out_features, in_features, dtype=dtype))
    x = torch.randn(tokens, in_features, dtype=dtype, requires_grad=True)
    grad = torch.randn(tokens, out_features, dtype=dtype)
    saved: list[Any] = []
    tr = StorageTracker()
    for t in (*inner_tensors(w), x, grad):
        tr.register_tensor(t)
    with tr:
        tr.phase = "forward"
        base = tr.cur
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
            y = m.linear_nf4(x, w)
        fwd = tr.phase_peak["forward"] - base
        out_bytes = y.untyped_storage().nbytes()
        tr.phase = "backward"
        base = tr.cur
        y.backward(grad)
        bwd = tr.phase_peak["backward"] - base
    return LinearNF4Measure(
        numel=out_features * in_features, weight_bytes=param_storage_bytes([w]),
        saved=tuple(type(t).__name__ for t in saved), saved_weight_only=len(saved) == 1 and saved[0] is w,
        forward_peak_bytes=fwd, backward_peak_bytes=bwd, output_bytes=out_bytes,
        grad_input_bytes=x.grad.untyped_storage().nbytes())


class _Mesh:
    """The one call ``NF4Tensor.fsdp_pre_all_gather`` makes on its mesh: ``get_group().size()``."""

    def __init__(self, size: int) -> None:
        self._size = size

    def get_group(self) -> "_Mesh":
        return self

    def size(self) -> int:
        return self._size


def fsdp2_shard_bytes(out_features: int, in_features: int, world: int, dtype: torch.dtype = torch.bfloat16
                      ) -> list[dict[str, int]]:
    """Per rank: the bytes of its NF4 shard (every storage, the shared tables included) and of
    what ``fsdp_pre_all_gather`` hands FSDP2 to all-gather, the shard made as torchtune 0.3.1's
    ``load_from_full_model_state_dict`` makes it (``torch.chunk`` of the full ``NF4Tensor`` on dim
    0, ``new_zeros`` of the chunk's size, ``copy_``: FSDP2's ``_init_sharded_param`` the same way).
    Raises what torchao raises where the weight does not split."""
    from .lowprec_ref import param_storage_bytes

    m = nf4_module()
    torch.manual_seed(0)
    full = m.to_nf4(torch.randn(out_features, in_features, dtype=dtype))
    out = []
    for rank in range(world):
        chunk = list(torch.chunk(full, world, dim=0))[rank]
        shard = full.new_zeros(chunk.size())
        shard[: chunk.size(0)].copy_(chunk)
        inputs, _meta = shard.fsdp_pre_all_gather(_Mesh(world))
        out.append({"rows": int(shard.size(0)), "shard_bytes": param_storage_bytes([shard]),
                    "all_gather_input_bytes": sum(t.numel() * t.element_size() for t in inputs)})
    return out
