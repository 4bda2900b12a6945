"""Measure the peak of a checkpointed layer's recompute on CPU (LoRA under bf16 autocast) and record it.

    python benchmarks/layer_recompute_cpu.py

The loss-path records (``loss_peak_cpu.py``) use a vocabulary large enough for the loss to set the
step's peak. Here the vocabulary is small (128) and the MLP wide, so that the peak is in backward,
in the recompute of the last decoder layer: at its MLP down projection's LoRA branch, where PEFT
casts the layer's widest tensor to the fp32 adapters' dtype. Each record is one forward + backward
(``ftplan.measure.loss_peak.measure_loss_peak``: non-reentrant checkpointing of every layer, LoRA
r 8 on every linear, loss ``hf``), its peak live bytes above parameters, buffers and batch.
``tests/test_loss_peak_vs_torch.py::test_layer_recompute_record`` holds ftplan's
``saved activations + recompute`` against each record. Writes
``benchmarks/measurements/layer_recompute_cpu.json`` (replaced whole: the file is this script's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.measure.loss_peak import measure_loss_peak  # noqa: E402

OUT = ROOT / "benchmarks" / "measurements" / "layer_recompute_cpu.json"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text")
#: (hidden, intermediate, batch, seq_len)
SHAPES = ((256, 896, 1, 64), (384, 1280, 2, 48))


def config(family: str, hidden: int, intermediate: int) -> dict:
    """A two-layer tiny config of ``family`` whose layers, not its loss, set the step's peak."""
    cfg = {"model_type": family, "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False}
    if family == "phi3":  # its default special-token ids lie outside a 128-token vocabulary
        cfg.update(pad_token_id=0, eos_token_id=1, bos_token_id=1)
    if family.startswith("gemma"):
        cfg.update(head_dim=64, query_pre_attn_scalar=64, layer_types=["full_attention", "full_attention"])
    return cfg


#: (heads, hidden, batch, seq_len) of the eager-attention records (head_dim 16, intermediate 2 x hidden)
EAGER_SHAPES = ((16, 64, 1, 256), (16, 64, 2, 256), (8, 64, 1, 256), (16, 128, 1, 256), (12, 96, 1, 256))


def eager_config(heads: int, hidden: int) -> dict:
    """A two-layer llama whose scores (batch x heads x seq x seq) outweigh its hidden states."""
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 2,
            "num_attention_heads": heads, "num_key_value_heads": heads // 2, "head_dim": 16, "vocab_size": 128,
            "tie_word_embeddings": False}


def main() -> int:
    import torch
    import transformers

    runs = [(f, "mixed-lora", 0.0) for f in FAMILIES]
    runs += [("llama", "mixed-lora-fp32-base", 0.0), ("qwen3", "mixed-lora-fp32-base", 0.0),
             ("llama", "mixed-lora", 0.05)]
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family, mode, dropout in runs:
            for h, i, b, s in SHAPES:
                cfg = config(family, h, i)
                m = measure_loss_peak(cfg, batch=b, seq_len=s, loss="hf", mode=mode, lora_dropout=dropout)
                rows.append({"family": family, "config": cfg, **dataclasses.asdict(m)})
                print(f"{family:12s} {mode:21s} dropout {dropout} h{h} I{i} b{b} s{s}: {m.peak_bytes:,} B", flush=True)
        # eager attention with many heads and long rows: the attention's backward (score-sized
        # gradients) sets the peak, in the last layer's recompute
        for mode in ("mixed-lora", "mixed-full", "mixed-qlora"):
            for heads, h, b, s in EAGER_SHAPES:
                cfg = eager_config(heads, h)
                m = measure_loss_peak(cfg, batch=b, seq_len=s, loss="hf", mode=mode, attn_impl="eager")
                rows.append({"family": "llama", "config": cfg, **dataclasses.asdict(m)})
                print(f"llama eager  {mode:21s} heads {heads} h{h} b{b} s{s}: {m.peak_bytes:,} B", flush=True)
    doc = {"_doc": "Peak live bytes of one forward + backward on CPU above parameters, buffers and batch "
                   "(parameter gradients excluded), by benchmarks/layer_recompute_cpu.py: tiny two-layer models "
                   "with a 128-token vocabulary, so that the last layer's recompute sets the peak; LoRA r 8 "
                   "all-linear under CPU bf16 autocast, non-reentrant checkpointing of every layer, loss hf; "
                   "and eager-attention runs (attn_impl eager: LoRA, full fine-tuning and QLoRA under "
                   "autocast) where the attention's backward sets it. "
                   f"Machine: CPU, torch {torch.__version__}, transformers {transformers.__version__}.",
           "records": rows}
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, OUT)
    print(f"{len(rows)} records -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
