"""Checks of the families added in session 17 by the ``famb`` helper (deepseek_v2, cohere2, phimoe)
held by hand, out of CI for time.

Usage: ``PYTHONPATH=src python benchmarks/families4_by_hand.py [family ...]`` (default: all three)

For each family named, runs the cases its test file (``tests/test_<family>.py``) lists in
``VARIANTS_BY_HAND`` (saved activations against one real step, byte-exact) and ``QLORA_BY_HAND``
(bitsandbytes QLoRA: model states and saved activations exact), and for an MoE family the 2-rank
gloo expert-parallel run of tests/test_expert_parallel.py (transformers' EP engine: per-rank states
and every MoE block's saved bytes exact), as ``families2_by_hand.py`` does. Prints one line per
case; exits 1 on the first failure.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("families2_by_hand", _HERE / "families2_by_hand.py")
_families2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_families2)

FAMILIES = ["deepseek_v2", "cohere2", "phimoe"]

if __name__ == "__main__":
    sys.exit(_families2.main(sys.argv[1:] or FAMILIES))
