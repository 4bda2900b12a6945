"""Measure the loss path's peak bytes on CPU with the installed transformers and record them.

    python benchmarks/loss_peak_cpu.py            # transformers >= 4.46: hf + transcribed hf-legacy
    PYTHONPATH=/path/to/transformers-4.44.2 python benchmarks/loss_peak_cpu.py   # real hf-legacy

Each run replaces the records of its own (transformers version, loss source) in
``benchmarks/measurements/loss_peak_cpu.json`` and keeps the others, so the file holds the
transformers 4.44.2 measurements (the legacy path as the model itself runs it) next to the current
ones. ``tests/test_loss_peak_vs_torch.py`` holds ftplan's formula against every record; see
``ftplan.measure.loss_peak`` for what is measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.measure.loss_peak import (  # noqa: E402
    MODES,
    legacy_transformers_installed,
    measure_accumulation_peak,
    measure_loss_peak,
)

OUT = ROOT / "benchmarks" / "measurements" / "loss_peak_cpu.json"
#: a tiny llama whose vocabulary dwarfs the layers, so that the loss path sets the peak
CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "tie_word_embeddings": False}
SHAPES = ((2, 32), (1, 40), (3, 16))
ACCUMULATION_SHAPES = ((2, 32), (1, 40))


def main() -> int:
    legacy_installed = legacy_transformers_installed()
    losses = ("hf-legacy",) if legacy_installed else ("hf", "hf-legacy")
    rows = []
    for loss in losses:
        for mode in MODES:
            for keep in (False, True):
                for b, s in SHAPES:
                    m = measure_loss_peak(CONFIG, batch=b, seq_len=s, loss=loss, keep_output=keep, mode=mode)
                    rows.append(dataclasses.asdict(m))
                    print(f"{m.transformers_version} {loss:9s} {m.legacy_source:11s} {mode:20s} keep={keep!s:5s} "
                          f"b={b} s={s}: {m.peak_bytes:,} B (forward {m.forward_peak_bytes:,} B)")
    acc = []
    for loss in losses:
        for b, s in ACCUMULATION_SHAPES:
            a = measure_accumulation_peak(CONFIG, batch=b, seq_len=s, loss=loss, micro_batches=2)
            acc.append(dataclasses.asdict(a))
            print(f"{a.transformers_version} {loss:9s} full fp32+autocast, 2 micro-batches, b={b} s={s}: "
                  + ", ".join(f"{k} {v:,}" for k, v in a.phase_peak_bytes.items()))
    previous = json.loads(OUT.read_text()) if OUT.exists() else {}
    old = previous.get("records", [])
    mine = {(r["transformers_version"], r["legacy_source"]) for r in rows}
    kept = [r for r in old if (r["transformers_version"], r["legacy_source"]) not in mine]
    acc_kept = [r for r in previous.get("accumulation", []) if r["transformers_version"] not in
                {a["transformers_version"] for a in acc}]
    doc = {"_doc": "Peak live bytes of one forward + backward on CPU above parameters, buffers and batch "
                   "(parameter gradients excluded; forward_peak_bytes: the peak before backward starts), by "
                   "benchmarks/loss_peak_cpu.py; config below; modes: LoRA r 8 all-linear (bf16 base; "
                   "mixed-lora-fp32-base: fp32 base), or full fine-tuning of fp32 weights under bf16 autocast; "
                   "non-reentrant checkpointing of "
                   "every layer. Machine: CPU, torch "
                   f"{__import__('torch').__version__}.",
           "config": CONFIG, "records": kept + rows,
           "_accumulation_doc": "Full fine-tuning of fp32 weights under bf16 autocast, 2 micro-batches "
                                "accumulating gradients (HF Trainer's loop): the running peak of everything "
                                "above parameters, buffers and batches, gradients included, per phase.",
           "accumulation": acc_kept + acc}
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, OUT)
    print(f"{len(rows)} + {len(acc)} records -> {OUT.relative_to(ROOT)} ({len(kept)} + {len(acc_kept)} kept from "
          "other versions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
