"""FSDP2's per-rank forward/backward peak, moment by moment, against real 2-rank gloo runs.

    PYTHONPATH=src python benchmarks/fsdp2_moment_peak_cpu.py [--only SUBSTRING]   (about 2 min on 2 cores)

``ftplan.measure.distributed`` runs each case on 2 gloo ranks and measures ``fwd_bwd_peak``: the
peak of every byte a rank tracks in the forward and backward of the (first) step: the parameter
shards, the gradient shards as backward makes them, FSDP2's gathered units and buffers, the
saved activations, the loss and the backward's working tensors. ftplan's prediction is
``estimate_memory(..., backend="cpu")``'s ``peak_allocated_bytes`` without what a CPU run has not
(:func:`predicted_peak`): the cuBLAS workspace, the optimizer states (created by the first
``optimizer.step()``, after this peak), and the allocator's reserve, CUDA context and NCCL
buffers (outside ``peak_allocated_bytes`` anyway); the harness's own bytes the formula does not
plan are added from the run (:func:`harness_bytes`: the model's buffers, the device mesh's scalars;
under accelerate's wrapping the token ids are made outside the tracker, so the formula's are taken off).

The grid: tiny llama (untied) and qwen2 (tied, q/k/v biases), full and LoRA, checkpointing on and
off, accelerate's units and torchtune's (``Layout.fsdp_wrap``), reshard after forward off, CPU
offload, one MoE (mixtral). ``tests/test_fsdp2_moment_peak.py`` holds two of them in CI (no spawn
of its own when tests/test_distributed_memory.py ran in the same session).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.measure.distributed import Case  # noqa: E402

_QKV = "q_proj,k_proj,v_proj"
CASES = [
    Case(family="llama", engine="fsdp2"),
    Case(family="llama", engine="fsdp2", gradient_checkpointing=True),
    Case(family="llama", engine="fsdp2", method="lora"),
    Case(family="llama", engine="fsdp2", method="lora", gradient_checkpointing=True),
    Case(family="qwen2", engine="fsdp2"),
    Case(family="qwen2", engine="fsdp2", gradient_checkpointing=True),
    Case(family="qwen2", engine="fsdp2", method="lora", gradient_checkpointing=True),
    Case(family="llama", engine="fsdp2", reshard_after_forward=False),
    Case(family="llama", engine="fsdp2", offload_params=True),
    Case(family="mixtral", engine="fsdp2"),
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=24, offload_params=True),
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=40),
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=40,
         gradient_checkpointing=True),
    Case(family="llama", engine="fsdp2", method="lora", fsdp_wrap="torchtune", seq_len=32, lora_targets=_QKV),
    Case(family="llama", engine="fsdp2", method="lora", fsdp_wrap="torchtune", seq_len=32, lora_targets=_QKV,
         gradient_checkpointing=True),
]


def consts():
    """The CPU run's constants: torch's FSDP2 schedule as installed, no cuBLAS workspace."""
    import torch

    from ftplan.catalog.constants import memory_constants

    return dataclasses.replace(memory_constants(), cublas_workspace_bytes=0, fsdp2_schedule_torch=float(
        ".".join(torch.__version__.split("+")[0].split(".")[:2])))


def predicted_peak(case: Case, world: int = 2):
    """(ftplan's forward/backward peak of one rank on CPU, the breakdown) for ``case``."""
    from ftplan.measure import torchref as TR
    from ftplan.memory import estimate_memory
    from ftplan.model import model_from_config

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    job, layout = case.job(), case.layout(world)
    mem = estimate_memory(spec, job, layout, consts=consts(), backend="cpu")
    c = mem.components
    # the first step's forward and backward: no optimizer states yet
    return mem.peak_allocated_bytes - c["optimizer_states"], mem


def predicted_activations(case: Case, world: int = 2) -> int:
    """ftplan's saved activations at the forward's end (as tests/test_distributed_memory.py's
    ``_predict``: the token ids of accelerate's full runs left out), to tell an activation-model
    difference from a moment-model one."""
    from ftplan.measure import torchref as TR
    from ftplan.memory import model_states, saved_activation_bytes
    from ftplan.model import model_from_config
    from ftplan.sharding import activation_job, engine_compute, layout_memory

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    job, layout = case.job(), case.layout(world)
    lm = layout_memory(spec, job, layout, model_states(spec, job), consts(), "cpu")
    ids = case.batch * case.seq_len * 8 if case.method == "full" and case.fsdp_wrap == "accelerate" else 0
    return saved_activation_bytes(spec, job if job.torchao_nf4 else activation_job(job, lm), layout, backend="cpu",
                                  engine_compute=engine_compute(job, layout),
                                  quantized_base=job.method == "qlora") - ids


def harness_bytes(case: Case, m) -> int:
    """Bytes the run tracks that the formula does not plan: the model's buffers (rotary inv_freq)
    and the engine's persistent scalars (device mesh), less the token ids of accelerate's runs
    (made before the tracker sees them; the formula counts them where the embedding saves them)."""
    ids = case.batch * case.seq_len * 8 if case.method == "full" and case.fsdp_wrap == "accelerate" else 0
    persistent = m.engine_persistent - m.detail.get("persistent_by_owner", {}).get("init:model", 0)
    # CPU offload: on CPU the host and the "device" are one memory, so the run also tracks the
    # parameter shards kept in host memory (the formula's device holds none of them)
    host = m.params if case.offload_params else 0
    return m.buffers + persistent - ids + host


def main(argv: list[str] | None = None) -> int:
    from ftplan.measure.distributed import run_cases

    argv = argv if argv is not None else sys.argv[1:]
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    cases = [c for c in CASES if only in c.label]
    results = run_cases(cases, 2, timeout_s=600)
    worst = 0
    for case, res in zip(cases, results):
        if isinstance(res, str):
            print(f"{case.label}: FAILED\n{res}")
            continue
        p, mem = predicted_peak(case)
        row = []
        for m in res:
            d = m.fwd_bwd_peak - harness_bytes(case, m) - p
            worst = max(worst, abs(d) / m.fwd_bwd_peak)
            row.append(f"rank{m.rank} measured {m.fwd_bwd_peak:,} (harness {harness_bytes(case, m):,}) "
                       f"diff {d:+,} (activations {m.activations - predicted_activations(case):+,})")
        note = next((n for n in mem.notes if "moment" in n), "")
        print(f"{case.label}: predicted {p:,}; " + "; ".join(row) + (f"\n   {note}" if note else ""), flush=True)
    print(f"worst |diff| / measured: {worst:.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
