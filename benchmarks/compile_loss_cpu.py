"""What a compiled chunked cross-entropy saves for backward on CPU (torchtune's CEWithChunkedOutputLoss).

    python benchmarks/compile_loss_cpu.py [--torchtune DIR]

torchtune compiles only ``compute_cross_entropy`` (``F.cross_entropy(logits.float(), labels,
reduction="sum")``) of its ``CEWithChunkedOutputLoss`` (``training.compile_loss``), and the model
returns the logits in ``num_output_chunks`` bf16 chunks. ``--torchtune DIR``: load the loss from a
torchtune installed with ``pip install --no-deps --target DIR torchtune`` (its
``modules/loss/ce_chunked_output_loss.py`` alone: torchtune 0.6.1's package does not import beside
torchao >= 0.14, which dropped ``torchao.dtypes.nf4tensor``); without it, the same two lines
written here. Prints the saved bytes per backend: eager and aot_eager keep every chunk's fp32
log-softmax (t V 4 bytes); inductor and aot_eager_decomp_partition (inductor's decompositions)
keep the bf16 logits chunks and two fp32 values per row (t V 2 + 8 t) and recompute the softmax
in backward (benchmarks/notes/compile_saved.md).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ftplan.measure.accounting import SavedTensorTracker  # noqa: E402


class _ChunkedCE(torch.nn.Module):
    """torchtune 0.6.1 ``CEWithChunkedOutputLoss``'s forward, for when torchtune is not at hand."""

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100):
        super().__init__()
        self.num_output_chunks, self.ignore_index = num_output_chunks, ignore_index

    def compute_cross_entropy(self, logits, labels):
        return F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")

    def forward(self, logits, labels):
        total_elements = (labels != self.ignore_index).sum()
        labels = [c.reshape(-1) for c in labels.chunk(self.num_output_chunks, dim=1)]
        logits = [c.reshape(-1, c.size(-1)) for c in logits]
        total = 0.0
        for lc, yc in zip(logits, labels):
            total += self.compute_cross_entropy(lc, yc)
        return total / total_elements


def _loss_class(torchtune_dir: str | None):
    if not torchtune_dir:
        return _ChunkedCE, "ftplan's copy"
    path = Path(torchtune_dir) / "torchtune" / "modules" / "loss" / "ce_chunked_output_loss.py"
    spec = importlib.util.spec_from_file_location("tt_ce_chunked_output_loss", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CEWithChunkedOutputLoss, str(path)


def measure(cls, backend: str, b: int = 2, s: int = 64, h: int = 64, vocab: int = 512, chunks: int = 8) -> int:
    torch.manual_seed(0)
    head = torch.nn.Linear(h, vocab, bias=False).to(torch.bfloat16)
    loss_fn = cls(num_output_chunks=chunks)
    if backend != "eager":
        torch._dynamo.reset()
        loss_fn.compute_cross_entropy = torch.compile(loss_fn.compute_cross_entropy, backend=backend)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s))
    tracker = SavedTensorTracker(head, track_ops=False, track_modules=False)
    with tracker:
        logits = [head(c) for c in x.chunk(chunks, dim=1)]
        loss = loss_fn(logits, labels)
    del logits
    records = tracker.alive_records()
    kinds = collections.Counter((r.shape, r.dtype, r.nbytes) for r in records)
    total = sum(r.nbytes for r in records)
    t = b * s
    print(f"{backend:28s} saved {total:7d} B (t V 2 = {t * vocab * 2}, t V 4 = {t * vocab * 4}): "
          + ", ".join(f"{n} x {shape} {dtype}" for (shape, dtype, _), n in sorted(kinds.items(), key=lambda kv: -kv[0][2])),
          flush=True)
    loss.backward()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torchtune", default=None, help="a --target dir holding torchtune")
    args = ap.parse_args()
    cls, where = _loss_class(args.torchtune)
    print(f"CEWithChunkedOutputLoss from {where}; b 2, s 64, V 512, 8 chunks, bf16 logits")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for backend in ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor"):
            measure(cls, backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
