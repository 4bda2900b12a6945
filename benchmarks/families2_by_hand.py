"""Checks of the families added in session 16 (olmoe, exaone4, dots1, hunyuan_v1_dense) held by hand,
out of CI for time.

Usage: ``PYTHONPATH=src python benchmarks/families2_by_hand.py [family ...] [--engines]`` (default: all
four; about 3 minutes on 2 cores, of which ~25 s per MoE family for the gloo run)

For each family named, runs the cases its test file lists in ``VARIANTS_BY_HAND`` (saved
activations against one real step, byte-exact) and ``QLORA_BY_HAND`` (bitsandbytes QLoRA: model
states and saved activations exact), and for an MoE family the 2-rank gloo expert-parallel run of
tests/test_expert_parallel.py (transformers' EP engine: per-rank states and every MoE block's
saved bytes exact); the harness: ``by_hand.py``. Prints one line per case; exits 1 when any case
fails (all are run).
"""

from __future__ import annotations

import sys

from by_hand import run

if __name__ == "__main__":
    sys.exit(run(["olmoe", "exaone4", "dots1", "hunyuan_v1_dense"]))
