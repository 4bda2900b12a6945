"""torchtune 0.3.1's chunked-output loss and RMS norm, transcribed line for line (torch only).

Shared by :mod:`ftplan.measure.torchtune_loss` (the tail measured alone) and
:mod:`ftplan.measure.distributed` (torchtune's FSDP2 wrapping on gloo ranks), which cannot import each
other. Sources: the torchtune 0.3.1 wheel (PyPI), ``torchtune/modules/loss/ce_chunked_output_loss.py``
and ``torchtune/modules/rms_norm.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ChunkedCE", "RMSNorm"]


class ChunkedCE(torch.nn.Module):
    """torchtune 0.3.1 ``CEWithChunkedOutputLoss`` (modules/loss/ce_chunked_output_loss.py),
    transcribed: forward and ``compute_cross_entropy`` line for line."""

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100):
        super().__init__()
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    def compute_cross_entropy(self, logits, labels):
        return F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")

    def forward(self, logits, labels):
        total_elements = (labels != self.ignore_index).sum()
        labels = [target_chunk.reshape(-1) for target_chunk in labels.chunk(self.num_output_chunks, dim=1)]
        logits = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
        total_loss = 0.0
        for logits_chunk, labels_chunk in zip(logits, labels):
            total_loss += self.compute_cross_entropy(logits_chunk, labels_chunk)
        return total_loss / total_elements


class RMSNorm(torch.nn.Module):
    """torchtune 0.3.1 ``RMSNorm`` (modules/rms_norm.py), transcribed."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x_fp32 = x.float()
        x_normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return x_normed * self.scale
