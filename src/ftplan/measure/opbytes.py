"""Bytes that real PyTorch ops move, per token: the check on the runtime model's memory-bound
traffic (``runtime._elementwise_dims``, ``runtime.adapter_traffic_bytes``).

Every aten op a forward (then its backward) runs is seen through a ``TorchDispatchMode``; its bytes
are the sizes of the tensors it reads and writes. GEMMs, the attention kernel and views are left
out (the runtime model prices GEMMs and attention on their own; views move nothing). Two token
counts are run and differenced, so weight-sized work (autocast's weight casts, a norm's weight, a
weight gradient's accumulation) drops out and what is left is bytes per token, the unit of the
inventories. On CPU: the CUDA kernels read and write the same tensors, dropout excepted (CUDA's
one ``native_dropout`` kernel against CPU's ``bernoulli_`` + ``div_`` + ``mul``).

Needs torch (the ``measure`` extra); planning never imports this module.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["OpBytes", "bytes_per_token"]

#: priced as GEMMs or attention by the runtime model, or no data movement (views, allocations)
SKIPPED_OPS = frozenset({
    "mm", "addmm", "bmm", "matmul", "linear", "baddbmm",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "view", "_unsafe_view", "t", "transpose", "expand", "permute", "reshape", "alias", "detach", "as_strided",
    "slice", "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind", "lift_fresh", "empty",
    "zeros_like", "ones_like",
})


class OpBytes(TorchDispatchMode):
    """Bytes read + written per aten op (tensors of more than one element), by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in SKIPPED_OPS:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.by_op[name] += sum(t.numel() * t.element_size() for t in tensors if t.numel() > 1)
        return out


def bytes_per_token(run: Callable[[int], tuple[Callable[[], Any], Callable[[Any], None]]],
                    tokens: tuple[int, int] = (128, 256)) -> tuple[float, float, dict[str, float]]:
    """(forward, backward) bytes per token, and by op (backward ops prefixed ``bwd:``), of
    ``run(T) -> (forward, backward)``: ``forward()`` returns what ``backward(y)`` differentiates.
    The difference of two token counts, per token."""
    got = []
    for t in tokens:
        forward, backward = run(t)
        f, b = OpBytes(), OpBytes()
        with f:
            y = forward()
        with b:
            backward(y)
        got.append((f.by_op, b.by_op))
    dt = tokens[1] - tokens[0]
    fwd = (sum(got[1][0].values()) - sum(got[0][0].values())) / dt
    bwd = (sum(got[1][1].values()) - sum(got[0][1].values())) / dt
    ops = {k: (got[1][0][k] - got[0][0][k]) / dt for k in got[1][0]}
    ops.update({"bwd:" + k: (got[1][1][k] - got[0][1][k]) / dt for k in got[1][1]})
    return fwd, bwd, ops
