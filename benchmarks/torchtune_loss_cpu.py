"""Measure torchtune's chunked-output cross-entropy tail on CPU and record it.

    python benchmarks/torchtune_loss_cpu.py [--torchtune DIR]

``DIR``: an unpacked torchtune wheel (``pip download --no-deps torchtune==0.3.1`` and unzip), whose
``CEWithChunkedOutputLoss`` and ``RMSNorm`` files are loaded as they are (they import torch only;
torchtune's package itself does not import beside torchao >= 0.14); without it, ftplan's line-for-line
transcriptions (``ftplan.measure.torchtune_loss``). Writes
``benchmarks/measurements/torchtune_loss_cpu.json``: per method (full: trained output projection;
lora: frozen), backend (eager = torchtune's ``compile: False``; aot_eager; inductor = ``compile:
True``) and shape, the bytes live after the forward, the forward's peak and the step's peak, above
the weights, the input leaf and the labels, gradients left out. ``tests/test_torchtune_loss.py``
holds ``memory._torchtune_loss_bytes`` against every record, and ``torchao_nf4.nf4_tensor_bytes``
against the NF4 storage recorded here (torchao's ``NF4Tensor``, torchtune's QLoRA weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.measure.torchtune_loss import BACKENDS, measure_tail  # noqa: E402

OUT = ROOT / "benchmarks" / "measurements" / "torchtune_loss_cpu.json"
#: (batch, seq_len, hidden, vocab): s = 20 is not a multiple of the 8 chunks (torch.chunk makes 7 of 3 rows,
#: the last of 2)
SHAPES = ((2, 32, 64, 4096), (1, 64, 64, 4096), (3, 20, 48, 2048), (2, 40, 32, 1024))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torchtune", default=None, help="an unpacked torchtune wheel")
    args = ap.parse_args()
    rows = []
    for method in ("lora", "full"):
        for backend in BACKENDS:
            for b, s, h, v in SHAPES:
                t0 = time.time()
                m = measure_tail(batch=b, seq_len=s, hidden=h, vocab=v, method=method, backend=backend,
                                 torchtune_dir=args.torchtune)
                rows.append(dataclasses.asdict(m))
                print(f"{method:4s} {backend:9s} b={b} s={s} h={h} V={v}: saved {m.forward_end_bytes:,} forward peak "
                      f"{m.forward_peak_bytes:,} peak {m.peak_bytes:,} ({time.time() - t0:.1f} s)", flush=True)
    import torch

    nf4 = []
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    except ImportError:  # torchao < 0.14: torchao.dtypes.nf4tensor
        from torchao.dtypes.nf4tensor import to_nf4
    import torchao

    for shape in ((1024, 512), (256, 128), (4096, 1024)):
        q = to_nf4(torch.randn(*shape, dtype=torch.bfloat16), 64, 256)
        names, _ = q.__tensor_flatten__()
        parts = {n: getattr(q, n).untyped_storage().nbytes() for n in names}
        nf4.append({"shape": list(shape), "stored_bytes": sum(parts.values()), "parts": parts})
        print(f"torchao {torchao.__version__} NF4 {shape}: {sum(parts.values()):,} B {parts}")
    doc = {"_doc": "torchtune's tail (final RMSNorm, output projection per chunk, CEWithChunkedOutputLoss, "
                   "8 chunks) in bf16 on CPU, one forward + backward as the recipes' train step runs it; bytes "
                   "above weights, input leaf and labels, gradients (parameters', input's) and the CPU matmul "
                   "kernels' own scratch left out; by benchmarks/torchtune_loss_cpu.py. forward_end_bytes: live "
                   "after the loss and `del logits`.",
           "torch": torch.__version__, "records": rows,
           "_nf4_doc": "torchao's to_nf4(bf16 weight, 64, 256) (torchtune's QLoRA base weights): bytes of the "
                       "NF4Tensor's inner tensors (their storages), torchao " + torchao.__version__,
           "nf4": nf4}
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, OUT)
    print(f"{len(rows)} records -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
