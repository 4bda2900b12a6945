"""LoRA under MoE expert parallelism on CPU, by hand: the grid behind tests/test_ep_lora.py.

Two gloo processes load tiny mixtral, qwen3_moe and olmoe models expert-parallel with
transformers' own engine (``DistributedConfig(fsdp_size=2, ep_size=2)``) and apply PEFT LoRA
(r=4, alpha=8, no dropout) after the load, as a TRL / Trainer script does
(:func:`ftplan.measure.ep_run.run_ep_cases`):

* ``experts``: ``all-linear`` (PEFT's ParamWrapper on the fused experts): the error it raises;
* ``qlora``: a bitsandbytes NF4 load, LoRA on q/k/v/o: the error PEFT raises on the DTensor shards;
* ``attention`` / ``attention+ckpt``: q/k/v/o, bf16-mixed (autocast on the bf16 model), without
  and with gradient checkpointing: per rank the frozen, trainable, gradient and AdamW bytes,
  autocast's adapter copies and every byte the forward saves, against ftplan's plan
  (``tests/test_ep_lora.predicted``: the MoE blocks at the rows the rank received).

Run: ``PYTHONPATH=src python benchmarks/ep_lora_cpu.py`` (~15 s of CPU; exit code 1 on a mismatch).
Result on torch 2.13 / transformers 5.24 / peft 0.21.2 (2026-11-25): every ``experts`` case fails
with ``aten.baddbmm.default got mixed torch.Tensor and DTensor``, every ``qlora`` case with
``'DTensor' object has no attribute 'compress_statistics'``; every other number equal.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

FAMILIES = ("mixtral", "qwen3_moe", "olmoe")
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def main() -> int:
    from test_ep_lora import measured, predicted

    from ftplan.measure.ep_run import run_ep_cases

    cases = {}
    for f in FAMILIES:
        cases[f"{f}/experts"] = {"family": f, "method": "lora"}
        cases[f"{f}/qlora"] = {"family": f, "method": "qlora", "lora_targets": ATTENTION, "autocast": True}
        cases[f"{f}/attention"] = {"family": f, "method": "lora", "lora_targets": ATTENTION, "autocast": True}
        cases[f"{f}/attention+ckpt"] = {"family": f, "method": "lora", "lora_targets": ATTENTION, "autocast": True,
                                        "checkpointing": True}
    runs = run_ep_cases(cases)
    bad = 0
    for label, ranks in runs.items():
        fam, kind = label.split("/")
        if kind in ("experts", "qlora"):
            ok = isinstance(ranks, str) and ("mixed torch.Tensor and DTensor" in ranks if kind == "experts"
                                             else "compress_statistics" in ranks)
            bad += not ok
            print(f"{label:26s} {'refused by the engine' if ok else 'RAN?'}: {str(ranks).splitlines()[0][:110]}")
            continue
        if isinstance(ranks, str):
            bad += 1
            print(label, ranks)
            continue
        ckpt = kind.endswith("ckpt")
        for r in ranks:
            p = predicted(fam, ckpt, r.rows[: len(r.rows) // (2 if ckpt else 1)])
            m = measured(r)
            bad += p != m
            cells = "  ".join(f"{k.replace('_bytes', '')} {p[k]}/{m[k]}{'' if p[k] == m[k] else ' MISMATCH'}"
                              for k in m)
            print(f"{label:26s} rank {r.rank} rows {r.rows}: (predicted/measured) {cells}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
