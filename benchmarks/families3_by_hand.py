"""Checks of the families added in session 17 (gemma, qwen2_moe, glm4) held by hand,
out of CI for time.

Usage: ``PYTHONPATH=src python benchmarks/families3_by_hand.py [family ...] [--engines]`` (default: all
three; about 2 minutes on 2 cores, of which ~25 s for qwen2_moe's gloo EP run; ``--engines`` adds the
2-rank gloo FSDP2 / DeepSpeed ZeRO-3 runs, full and LoRA, of tests/test_distributed_memory.py's
harness, several minutes more)

For each family named, runs the cases its test file lists in ``VARIANTS_BY_HAND`` (saved
activations against one real step, byte-exact) and ``QLORA_BY_HAND`` (bitsandbytes QLoRA: model
states and saved activations exact), and for an MoE family the 2-rank gloo expert-parallel run of
tests/test_expert_parallel.py (transformers' EP engine: per-rank states and every MoE block's
saved bytes exact; qwen2_moe's 1-row shared_expert_gate lives on rank 0 alone under FSDP2: the
other rank holds exactly its states less); the harness: ``by_hand.py``. Prints one line per case;
exits 1 when any case fails (all are run).
"""

from __future__ import annotations

import sys

from by_hand import run

if __name__ == "__main__":
    sys.exit(run(["gemma", "qwen2_moe", "glm4"]))
