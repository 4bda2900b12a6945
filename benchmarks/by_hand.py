"""The harness of the by-hand family checks (``families2_by_hand.py``, ``families3_by_hand.py``,
``families4_by_hand.py``; ``ernie4_5_moe_grid.py`` uses :func:`run_engines`): cases held out of CI
for time, each byte-exact against real PyTorch on CPU.

For each family named, :func:`main` runs the cases its test file (``tests/test_<family>.py``) lists
in ``VARIANTS_BY_HAND`` (``check_variant``: saved activations against one real step) and
``QLORA_BY_HAND`` (``check_qlora``: bitsandbytes QLoRA, model states and saved activations), and for
an MoE family the 2-rank gloo expert-parallel run of tests/test_expert_parallel.py (transformers' EP
engine: per-rank states and every MoE block's saved bytes, ``family_checks.check_ep_ranks``); with
``--engines`` on the command line, also the 2-rank gloo FSDP2 / DeepSpeed ZeRO-3 runs, full and
LoRA, of tests/test_distributed_memory.py's harness. Prints one line per case and runs them all;
returns 1 when any failed.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def ep_check(family: str) -> None:
    """The 2-rank gloo expert-parallel run of the tiny ``family`` against ftplan. FSDP2 shards
    every parameter on dim 0: a (1, hidden) tensor (qwen2_moe's shared_expert_gate) lives whole on
    rank 0 and not at all on rank 1, whose states are exactly that tensor's less (as
    tests/test_distributed_memory.py's BOUNDS["fsdp2_one_row_states"])."""
    import family_checks as F

    import ftplan.measure.torchref as TR
    from ftplan.measure.ep_run import run_ep
    from ftplan.model import model_from_config

    ranks = run_ep([family], world=2, ep=2, batch=2, seq=32)[family]
    model = model_from_config(TR.TINY_CONFIGS[family])
    one_row = model.hidden_size * sum(g.count for g in model.groups if g.moe is not None and g.moe.shared_gate)
    F.check_ep_ranks(family, ranks, one_row_less=one_row)


def run_engines(cases, ok: str = "ok  ", bad: str = "FAIL") -> int:
    """2-rank gloo runs of tests/test_distributed_memory.py's harness (its checks: per-rank
    parameters, gradients, optimizer states, buffers, transients, saved activations) for
    ``cases`` (``ftplan.measure.distributed.Case``). As that test does, a failing case runs once
    more in a fresh process group (gloo's asynchronous frees depend on the ranks' timing on a loaded
    machine). Prints one line a case; returns the number of cases that failed."""
    import test_distributed_memory as D

    from ftplan.measure.distributed import run_cases

    failures = D._failures(cases, 2, run_cases(cases, 2, timeout_s=900))
    if failures:
        retry = [c for c in cases if any(f.startswith((c.label + " rank", c.label + ":")) for f in failures)]
        failures = D._failures(retry, 2, run_cases(retry, 2, timeout_s=900))
    for c in cases:
        mine = [f for f in failures if f.startswith((c.label + " rank", c.label + ":"))]
        print(f"{bad if mine else ok} engine {c.label}: {mine}", flush=True)
    return len({f.split(" rank")[0].split(":")[0] for f in failures})


def _engine_cases(families: list[str]):
    from ftplan.measure.distributed import Case

    return [c for fam in families for c in (
        Case(family=fam, engine="fsdp2"), Case(family=fam, engine="fsdp2", method="lora"),
        Case(family=fam, engine="deepspeed", zero_stage=3, steps=2),
        Case(family=fam, engine="deepspeed", zero_stage=3, method="lora", steps=2))]


def main(families: list[str]) -> int:
    import warnings

    warnings.simplefilter("ignore")
    import ftplan.measure.torchref as TR
    from ftplan.model import model_from_config

    failed = 0
    for family in families:
        mod = importlib.import_module(f"test_{family}")
        cases = [(f"{family} saved {case}", mod.check_variant, case) for case in getattr(mod, "VARIANTS_BY_HAND", [])]
        cases += [(f"{family} qlora {case}", mod.check_qlora, case) for case in getattr(mod, "QLORA_BY_HAND", [])]
        if model_from_config(TR.TINY_CONFIGS[family]).is_moe:
            cases.append((f"{family} expert parallel (2 gloo ranks)", ep_check, (family,)))
        for name, fn, args in cases:
            t0 = time.perf_counter()
            try:
                fn(*args)
            except AssertionError as e:
                print(f"FAIL {name}: {str(e).splitlines()[0] if str(e) else 'assertion'}", flush=True)
                failed += 1
                continue
            print(f"ok   {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    if "--engines" in sys.argv:
        failed += run_engines(_engine_cases(families))
    return 1 if failed else 0


def run(default_families: list[str]) -> int:
    """``main`` on the families named on the command line (flags apart), else ``default_families``."""
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    return main(names or default_families)
